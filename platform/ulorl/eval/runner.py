"""Benchmark evaluation: k samples per problem through any ``Engine``, scored by the reward
verifier, summarised as avg@k, pass@j, a bootstrap CI, response length and truncation rate.

    with RewardScorer() as scorer:
        res = evaluate(engine, tok, items, k=8, sampling=EVAL_SAMPLING, max_new_tokens=512,
                       scorer=scorer, bench_name="heldout")
    log_eval_result(res, run_id=run_id, step=120, tracking_uri=uri)   # schema metric names

A response that ends without EOS at ``max_new_tokens`` is truncated and counts as wrong (the
paper's "overlong = wrong" rule, the same as the training reward).
"""

from __future__ import annotations

import csv
import io
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Protocol

import numpy as np

from ulorl.data.types import PromptItem
from ulorl.eval.metrics import avg_at_k, bootstrap_ci, pass_at_k_table, per_problem_accuracy
from ulorl.rollout.types import Engine, GenerationRequest, SamplingParams
from ulorl.tracking import schema

# The paper's evaluation sampling (PAPER.md section 5): temperature 0.85, top_p 0.95, top_k 20.
EVAL_SAMPLING = SamplingParams(temperature=0.85, top_p=0.95, top_k=20)
K_TAG = "ulorl.k"  # eval-run tag named in the schema docstring (no constant there)
PER_PROBLEM_FIELDS = ("problem_id", "answer", "k", "num_correct", "accuracy", "pass_at_k",
                      "response_len_mean", "num_truncated", "predictions")


class Scorer(Protocol):
    """``ulorl.reward.scorer.RewardScorer`` or anything scoring ``(text, reference, truncated,
    problem)`` items (its ``extraction`` attribute and ``extract(text, problem)``, when present, name
    and apply the mode)."""

    def score(self, items: list[tuple[str, str, bool, str]]) -> list[float]: ...


def pass_ks(k: int) -> list[int]:
    """Values of j reported as pass@j: powers of two up to k, plus k. ``pass_ks(6) == [1, 2, 4, 6]``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    out, j = [], 1
    while j <= k:
        out.append(j)
        j *= 2
    if out[-1] != k:
        out.append(k)
    return out


@dataclass
class EvalResult:
    """Outcome of ``evaluate``. Matrices are [P, k] (problem x sample), row order = ``items``."""

    bench: str
    k: int
    problem_ids: list[str]
    correct: np.ndarray              # Int[P, k] 0/1
    response_lens: np.ndarray        # Int[P, k] response tokens
    truncated: np.ndarray            # Int[P, k] 0/1: hit max_new_tokens without EOS
    avg_at_k: float
    pass_at: dict[int, float]        # {j: pass@j} for j in pass_ks(k)
    ci_low: float
    ci_high: float
    response_len_mean: float
    truncation_rate: float
    rows: list[dict[str, Any]] = field(default_factory=list)   # per problem, PER_PROBLEM_FIELDS
    max_new_tokens: int = 0
    sampling: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    tokens: int = 0
    extraction: str = "boxed"        # the scorer's final-answer extraction mode

    @property
    def num_problems(self) -> int:
        return len(self.problem_ids)

    def metrics(self) -> dict[str, float]:
        """Schema metric names -> values: eval/<bench>/{avg_at_k, pass_at_k, pass_at_<j>, ci_low,
        ci_high, response_len_mean, truncation_rate}."""
        m = {schema.eval_metric(self.bench, "avg_at_k"): self.avg_at_k,
             schema.eval_metric(self.bench, "pass_at_k"): self.pass_at[self.k]}
        for j, v in self.pass_at.items():
            m[schema.eval_metric(self.bench, f"pass_at_{j}")] = v
        m[schema.eval_metric(self.bench, "ci_low")] = self.ci_low
        m[schema.eval_metric(self.bench, "ci_high")] = self.ci_high
        m[schema.eval_metric(self.bench, "response_len_mean")] = self.response_len_mean
        m[schema.eval_metric(self.bench, "truncation_rate")] = self.truncation_rate
        return m

    def per_problem_csv(self) -> str:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(PER_PROBLEM_FIELDS), lineterminator="\n")
        w.writeheader()
        w.writerows(self.rows)
        return buf.getvalue()

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary (no per-sample matrices)."""
        return {
            "benchmark": self.bench, "k": self.k, "num_problems": self.num_problems,
            "avg_at_k": self.avg_at_k, "pass_at": {str(j): v for j, v in self.pass_at.items()},
            "ci_low": self.ci_low, "ci_high": self.ci_high, "response_len_mean": self.response_len_mean,
            "truncation_rate": self.truncation_rate, "max_new_tokens": self.max_new_tokens,
            "sampling": self.sampling, "wall_s": self.wall_s, "tokens": self.tokens, "extraction": self.extraction,
            "tokens_per_s": self.tokens / self.wall_s if self.wall_s > 0 else None,
        }


def prompt_ids_for(item: PromptItem, tokenizer: Any) -> list[int]:
    """Token ids of the model-facing prompt of ``item`` (``ulorl.data.prompts.build_prompt``)."""
    from ulorl.data.prompts import build_prompt

    p = build_prompt(item, tokenizer)
    if isinstance(p, str):
        return list(tokenizer(p, add_special_tokens=False)["input_ids"])
    return [int(t) for t in p]


def summarize(
    bench: str,
    items: Sequence[PromptItem],
    correct: np.ndarray,
    response_lens: np.ndarray,
    truncated: np.ndarray,
    predictions: Optional[list[list[str]]] = None,
    ci_seed: int = 0,
    n_boot: int = 2000,
) -> EvalResult:
    """Metrics of a finished [P, k] evaluation (pure: no engine, no I/O)."""
    correct = np.asarray(correct, dtype=np.int64)
    response_lens = np.asarray(response_lens, dtype=np.int64)
    truncated = np.asarray(truncated, dtype=np.int64)
    if correct.ndim != 2 or correct.shape != response_lens.shape or correct.shape != truncated.shape:
        raise ValueError(f"correct/response_lens/truncated must be [P, k] of one shape, got "
                         f"{correct.shape}, {response_lens.shape}, {truncated.shape}")
    if correct.shape[0] != len(items):
        raise ValueError(f"{len(items)} items but {correct.shape[0]} rows of results")
    acc = per_problem_accuracy(correct)
    rows = []
    for p, it in enumerate(items):
        rows.append({
            "problem_id": it.id, "answer": it.answer, "k": correct.shape[1], "num_correct": int(correct[p].sum()),
            "accuracy": float(acc[p]), "pass_at_k": float(correct[p].any()),
            "response_len_mean": float(response_lens[p].mean()), "num_truncated": int(truncated[p].sum()),
            "predictions": "|".join(predictions[p]) if predictions else "",
        })
    return _result(bench, [it.id for it in items], rows, correct, response_lens, truncated, ci_seed, n_boot)


def _result(bench: str, ids: list[str], rows: list[dict[str, Any]], correct: np.ndarray, response_lens: np.ndarray,
            truncated: np.ndarray, ci_seed: int, n_boot: int) -> EvalResult:
    """The metrics of [P, k] matrices whose per-problem ``rows`` are already made."""
    k = correct.shape[1]
    acc = per_problem_accuracy(correct)
    lo, hi = bootstrap_ci(acc, n_boot=n_boot, seed=ci_seed)
    return EvalResult(
        bench=bench, k=k, problem_ids=list(ids), correct=correct,
        response_lens=response_lens, truncated=truncated, avg_at_k=avg_at_k(correct),
        pass_at=pass_at_k_table(correct, pass_ks(k)), ci_low=lo, ci_high=hi,
        response_len_mean=float(response_lens.mean()), truncation_rate=float(truncated.mean()), rows=rows,
        tokens=int(response_lens.sum()),
    )


def split_result(result: EvalResult, n_select: int, ci_seed: int = 0,
                 n_boot: int = 2000) -> tuple[EvalResult, EvalResult]:
    """The selection part (problems [0, n_select), benchmark ``<bench>_select``) and the confirmation
    part (the rest, ``<bench>_confirm``) of one evaluation, each with its own metrics (pure: the
    samples are not drawn again). Eval seconds are split in proportion to the problems."""
    P = result.num_problems
    if not 0 < n_select < P:
        raise ValueError(f"eval.select_problems must be in [1, {P - 1}] for {P} evaluated problems, got {n_select}")
    parts = []
    for name, sl in (("select", slice(0, n_select)), ("confirm", slice(n_select, P))):
        part = _result(f"{result.bench}_{name}", result.problem_ids[sl], [dict(r) for r in result.rows[sl]],
                       result.correct[sl], result.response_lens[sl], result.truncated[sl], ci_seed, n_boot)
        part.max_new_tokens, part.sampling, part.extraction = result.max_new_tokens, result.sampling, result.extraction
        part.wall_s = result.wall_s * part.num_problems / P
        parts.append(part)
    return parts[0], parts[1]


def evaluate(
    engine: Engine,
    tokenizer: Any,
    items: Sequence[PromptItem],
    *,
    k: int,
    sampling: SamplingParams = EVAL_SAMPLING,
    max_new_tokens: int,
    scorer: Scorer,
    bench_name: str,
    progress: bool = True,
    batch_size: int = 64,
    ci_seed: int = 0,
) -> EvalResult:
    """Sample ``k`` responses for each item, score them, and summarise.

    Requests are sent to ``engine.generate`` in chunks of ``batch_size`` (k samples of a problem
    stay together); request ``i`` (problem ``i // k``, sample ``i % k``) gets seed
    ``sampling.seed * 1_000_003 + i`` so a run is reproducible. Progress goes to stderr.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not items:
        raise ValueError(f"benchmark {bench_name!r} has no problems to evaluate")
    from ulorl.reward.extract import extract_answer

    extraction = str(getattr(scorer, "extraction", "boxed"))
    extract = getattr(scorer, "extract", None) or (lambda text, problem: extract_answer(text, extraction, problem))
    t0 = time.perf_counter()
    P = len(items)
    prompts = [prompt_ids_for(it, tokenizer) for it in items]
    reqs = [
        GenerationRequest(request_id=i, prompt_ids=prompts[i // k], prefix_ids=[], max_new_tokens=max_new_tokens,
                          seed=sampling.seed * 1_000_003 + i)
        for i in range(P * k)
    ]
    correct = np.zeros((P, k), dtype=np.int64)
    lens = np.zeros((P, k), dtype=np.int64)
    trunc = np.zeros((P, k), dtype=np.int64)
    preds: list[list[str]] = [[""] * k for _ in range(P)]
    chunk = max(k, (max(1, batch_size) // k) * k)
    done_tokens = 0
    for start in range(0, len(reqs), chunk):
        batch = reqs[start : start + chunk]
        results = engine.generate(batch, sampling)
        if len(results) != len(batch):
            raise RuntimeError(f"engine returned {len(results)} results for {len(batch)} requests")
        scored: list[tuple[str, str, bool, str]] = []
        for req, res in zip(batch, results):
            if res.request_id != req.request_id:
                raise RuntimeError(f"engine result order mismatch: request {req.request_id}, result {res.request_id}")
            p, j = divmod(req.request_id, k)
            text = tokenizer.decode(res.token_ids, skip_special_tokens=True)
            is_trunc = res.finish_reason == "length"
            lens[p, j] = len(res.token_ids)
            trunc[p, j] = int(is_trunc)
            problem = items[p].problem
            preds[p][j] = ("[truncated]" if is_trunc else (extract(text, problem) or "")).replace("|", "/")[:80]
            scored.append((text, items[p].answer, is_trunc, problem))  # the problem: option texts, sets, ...
            done_tokens += len(res.token_ids)
        for req, r in zip(batch, scorer.score(scored)):
            p, j = divmod(req.request_id, k)
            correct[p, j] = int(r >= 1.0)
        if progress:
            n = min(start + chunk, len(reqs))
            el = time.perf_counter() - t0
            print(f"[ulorl-eval] {bench_name}: {n}/{len(reqs)} samples, {done_tokens} tokens, "
                  f"{el:.1f}s ({done_tokens / max(el, 1e-9):.0f} tok/s), running avg "
                  f"{correct.reshape(-1)[:n].mean():.3f}", file=sys.stderr, flush=True)
    summary = summarize(bench_name, items, correct, lens, trunc, preds, ci_seed=ci_seed)
    summary.max_new_tokens = max_new_tokens
    summary.sampling = asdict(sampling)
    summary.wall_s = time.perf_counter() - t0
    summary.extraction = extraction
    return summary


def log_eval_result(
    result: EvalResult,
    *,
    run_id: Optional[str] = None,
    step: Optional[int] = None,
    tracking_uri: Optional[str] = None,
    log_csv: bool = True,
) -> str:
    """Log ``result.metrics()`` (schema names) at ``step`` (0 when None) and the per-problem CSV
    into ``run_id`` (else the active MLflow run). Returns the run id."""
    import mlflow
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    if run_id is None:
        active = mlflow.active_run()
        if active is None:
            raise RuntimeError("log_eval_result: no run_id given and no active MLflow run")
        run_id = active.info.run_id
    client = MlflowClient(tracking_uri=tracking_uri)
    ts = int(time.time() * 1000)
    s = 0 if step is None else int(step)
    client.log_batch(run_id, metrics=[Metric(k, float(v), ts, s) for k, v in result.metrics().items()])
    if log_csv:
        client.log_text(run_id, result.per_problem_csv(), schema.per_problem_artifact(result.bench, step))
    return run_id


def eval_tags(bench: str, k: int, model: str, model_label: str, extraction: str = "boxed_or_final") -> dict[str, str]:
    """Tags of a standalone or nested eval run (schema: kind, benchmark, k, model, model_label,
    reward extraction mode)."""
    return {schema.KIND_TAG: "eval", schema.BENCHMARK_TAG: bench, K_TAG: str(k), schema.MODEL_TAG: model,
            schema.MODEL_LABEL_TAG: model_label, schema.EXTRACTION_TAG: extraction}
