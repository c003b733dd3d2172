"""``ulorl-eval``: avg@k / pass@k of a model on a benchmark, logged to MLflow.

    ulorl-eval --benchmark heldout --k 8                       # embedded warm-started model
    ulorl-eval --benchmark aime2025 --k 32 --model /models/UloRL-A3B --data-dir DIR
    ulorl-eval --benchmark aime2025 --k 32 --model /models/UloRL-A3B --max-new-tokens 143360 \\
               --yarn-factor 1.5 --yarn-original-max-pos 95232 --label UloRL-A3B-128k-Yarn
    ulorl-eval --benchmark heldout --k 4 --model runs:/<run_id>/checkpoints/final --parent-run-id <run_id>

Sampling defaults to the paper's evaluation settings (temperature 0.85, top_p 0.95, top_k 20).
Answers are extracted with ``--extraction`` (default ``boxed_or_final``: the last box, else a
final-answer statement; ``boxed`` = the training reward), recorded as param ``reward.extraction``
and tag ``ulorl.reward_extraction``.
The run is its own MLflow run (tags ulorl.kind=eval, ulorl.benchmark, ulorl.k, ulorl.model,
ulorl.model_label), nested under ``--parent-run-id`` when given, with metrics
``eval/<bench>/...`` and the per-problem CSV ``eval/<bench>_per_problem.csv``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from ulorl.jsonout import emit_json, json_command

DEFAULT_HELDOUT_PROBLEMS = 64
DEFAULT_HELDOUT_MAX_NEW = 512
PAPER_MAX_NEW = 131072
_RUNS_URI = re.compile(r"^runs:/([0-9a-fA-F]+)/(.+)$")


class EvalCliError(Exception):
    """A user-facing error (bad flag, missing file, unknown run)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ulorl-eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--benchmark", required=True,
                   help="aime2025 | beyondaime | heldout (the embedded task's held-out split) | PATH.jsonl")
    p.add_argument("--k", type=int, required=True, help="samples per problem (paper: 32)")
    p.add_argument("--model", default="embedded",
                   help="'embedded' (default), a local path, a HF id (online), or runs:/<run_id>/<artifact path>")
    p.add_argument("--label", default=None, help="row name in Table 2 (tag ulorl.model_label); default from --model")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"max response tokens (default: {DEFAULT_HELDOUT_MAX_NEW} for heldout; "
                        f"else the model's context "
                        f"minus the longest prompt, at most {PAPER_MAX_NEW})")
    p.add_argument("--num-problems", type=int, default=None,
                   help=f"evaluate the first N problems (default: all; heldout: {DEFAULT_HELDOUT_PROBLEMS})")
    p.add_argument("--data-dir", default=None,
                   help="folder with aime2025.jsonl / beyondaime.jsonl (else $ULORL_DATA_DIR)")
    p.add_argument("--heldout-seed", type=int, default=0, help="seed of the embedded held-out split")
    p.add_argument("--temperature", type=float, default=0.85)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=20, help="-1 = off")
    p.add_argument("--seed", type=int, default=1234, help="sampling seed")
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--batch-size", type=int, default=64, help="requests per engine call")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--yarn-factor", type=float, default=None, help="YaRN rope scaling factor (paper 140k: 1.5)")
    p.add_argument("--yarn-original-max-pos", type=int, default=None,
                   help="YaRN original_max_position_embeddings (paper: 95232; default: the model's max positions)")
    p.add_argument("--reward-timeout-s", type=float, default=5.0, help="time bound of one math-verify check")
    p.add_argument("--extraction", choices=["boxed", "boxed_or_final"], default="boxed_or_final",
                   help="final-answer extraction: boxed_or_final (last \\boxed{}, else 'the answer is X' / "
                        "'Final answer: X' / a lone option letter) or boxed (the training reward: no box = wrong)")
    p.add_argument("--tracking-uri", default=None, help="MLflow URI (else $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    p.add_argument("--experiment", default="ulorl", help="MLflow experiment of a standalone eval run")
    p.add_argument("--parent-run-id", default=None, help="nest the eval run under this (training) run")
    p.add_argument("--run-name", default=None)
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    return p


def _log(msg: str) -> None:
    print(f"[ulorl-eval] {msg}", file=sys.stderr, flush=True)


def bench_name_of(spec: str) -> str:
    """Metric namespace of a benchmark spec: the name, or a JSONL file's stem (slash-free)."""
    if spec.endswith(".jsonl") or os.sep in spec:
        spec = Path(spec).stem
    return re.sub(r"[^A-Za-z0-9_.-]", "_", spec) or "bench"


def load_items(spec: str, data_dir: Optional[str], num_problems: Optional[int], heldout_seed: int) -> list:
    if num_problems is not None and num_problems < 1:
        raise EvalCliError(f"--num-problems must be >= 1, got {num_problems}")
    if spec == "heldout":
        from ulorl.data.task import make_split

        return make_split("heldout", num_problems or DEFAULT_HELDOUT_PROBLEMS, seed=heldout_seed)
    from ulorl.data.jsonl import resolve_dataset

    try:
        items = list(resolve_dataset(spec, data_dir))
    except (FileNotFoundError, ValueError, KeyError) as exc:
        text = str(exc).replace("a benchmark name (",
                                "a benchmark name (heldout = the embedded task's held-out split, ")
        raise EvalCliError(f"--benchmark {spec!r}: {text}") from None
    return items[:num_problems] if num_problems else items


def resolve_model(model: str, uri: str, tmp: str) -> tuple[str, str]:
    """(local path or name for load_policy, default label). ``runs:/<id>/<path>`` is downloaded."""
    m = _RUNS_URI.match(model)
    if not m:
        if model.split(":")[0] == "embedded":  # "embedded" or "embedded:<profile>"
            return model, model
        return model, Path(model).name if os.path.exists(model) else model
    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    run_id, art = m.group(1), m.group(2).strip("/")
    try:
        run = MlflowClient(tracking_uri=uri).get_run(run_id)
    except MlflowException as exc:
        raise EvalCliError(f"--model {model}: no run {run_id} in {uri}: {exc.message}") from None
    _log(f"downloading {art} of run {run_id} ...")
    try:
        local = download_artifacts(run_id=run_id, artifact_path=art, dst_path=tmp, tracking_uri=uri)
    except (MlflowException, OSError) as exc:
        raise EvalCliError(f"--model {model}: cannot download artifact {art!r} of run {run_id}: {exc}") from None
    if not (Path(local) / "config.json").is_file():
        raise EvalCliError(f"--model {model}: artifact {art!r} of run {run_id} has no config.json (not a checkpoint)")
    name = run.info.run_name or run_id[:8]
    return local, f"{name}/{Path(art).name}"


def rope_scaling_of(args: argparse.Namespace) -> Optional[dict[str, Any]]:
    if args.yarn_factor is None:
        if args.yarn_original_max_pos is not None:
            raise EvalCliError("--yarn-original-max-pos needs --yarn-factor")
        return None
    if args.yarn_factor <= 1.0:
        raise EvalCliError(f"--yarn-factor must be > 1, got {args.yarn_factor}")
    rs: dict[str, Any] = {"rope_type": "yarn", "factor": float(args.yarn_factor)}
    if args.yarn_original_max_pos is not None:
        rs["original_max_position_embeddings"] = int(args.yarn_original_max_pos)
    return rs


def load_eval_model(args: argparse.Namespace, uri: str, rope_scaling: Optional[dict[str, Any]]) -> tuple[Any, Any, str]:
    """(model, tokenizer, default row label) for ``--model``; ``rope_scaling`` lands in model.config."""
    from ulorl.models.loading import ModelLoadError, load_policy

    with tempfile.TemporaryDirectory(prefix="ulorl-eval-") as tmp:
        path, default_label = resolve_model(args.model, uri, tmp)
        t0 = time.perf_counter()
        try:
            model, tok = load_policy(path, dtype=args.dtype, device=args.device, rope_scaling=rope_scaling)
        except ModelLoadError as exc:
            raise EvalCliError(f"--model {args.model}: {exc}") from None
        _log(f"loaded model {args.model} in {time.perf_counter() - t0:.1f}s")
    return model, tok, default_label


def _check_args(args: argparse.Namespace) -> None:
    if args.k < 1:
        raise EvalCliError(f"--k must be >= 1, got {args.k}")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise EvalCliError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.temperature <= 0:
        raise EvalCliError(f"--temperature must be > 0, got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise EvalCliError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.top_k < -1 or args.top_k == 0:
        raise EvalCliError(f"--top-k must be -1 (off) or >= 1, got {args.top_k}")


def _default_max_new(args: argparse.Namespace, model: Any, prompt_lens: list[int]) -> int:
    if args.max_new_tokens is not None:
        return args.max_new_tokens
    if args.benchmark == "heldout":
        return DEFAULT_HELDOUT_MAX_NEW
    ctx = int(getattr(model.config, "max_position_embeddings", PAPER_MAX_NEW))
    room = ctx - max(prompt_lens)
    if room < 1:
        raise EvalCliError(f"the longest prompt ({max(prompt_lens)} tokens) fills the model context ({ctx})")
    return min(PAPER_MAX_NEW, room)


def print_table(summary: dict[str, Any], file: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"ulorl-eval: {summary['benchmark']} ({summary['num_problems']} problems, k={summary['k']})")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row(f"avg@{summary['k']}", f"{summary['avg_at_k']:.4f}")
    t.add_row("95% CI (bootstrap over problems)", f"[{summary['ci_low']:.4f}, {summary['ci_high']:.4f}]")
    for j, v in summary["pass_at"].items():
        t.add_row(f"pass@{j}", f"{v:.4f}")
    t.add_row("mean response length (tokens)", f"{summary['response_len_mean']:.1f}")
    t.add_row("truncation rate", f"{summary['truncation_rate']:.4f}")
    t.add_row("model", str(summary["model"]))
    t.add_row("max new tokens", str(summary["max_new_tokens"]))
    t.add_row("wall time (s)", f"{summary['wall_s']:.1f}")
    if summary.get("run_id"):
        t.add_row("MLflow run", summary["run_id"])
    Console(file=file, width=100).print(t)


def experiment_for(args: argparse.Namespace, uri: str) -> str:
    """The MLflow experiment of the eval run: the parent's when nested (checked to exist now,
    before any model work), else ``--experiment``."""
    if not args.parent_run_id:
        return args.experiment
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    try:
        parent = client.get_run(args.parent_run_id)
    except MlflowException as exc:
        raise EvalCliError(f"--parent-run-id {args.parent_run_id}: no such run in {uri}: {exc.message}") from None
    return client.get_experiment(parent.info.experiment_id).name


def run(args: argparse.Namespace) -> dict[str, Any]:
    _check_args(args)
    from ulorl.tracking import resolve_tracking_uri, schema

    uri = resolve_tracking_uri(args.tracking_uri)
    if not args.no_mlflow or _RUNS_URI.match(args.model):   # before any model work: a URI MLflow cannot open
        from ulorl.cli.checks import tracking_uri_problem, uri_source

        problem = tracking_uri_problem(uri, uri_source(args.tracking_uri))
        if problem:
            raise EvalCliError(problem)
    bench = bench_name_of(args.benchmark)
    rope_scaling = rope_scaling_of(args)
    experiment = args.experiment if args.no_mlflow else experiment_for(args, uri)
    items = load_items(args.benchmark, args.data_dir, args.num_problems, args.heldout_seed)
    if not items:
        raise EvalCliError(f"--benchmark {args.benchmark!r} has no problems")
    _log(f"{len(items)} problems from {args.benchmark}, k={args.k}")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from ulorl.config import RolloutConfig
    from ulorl.eval.runner import eval_tags, evaluate, log_eval_result, prompt_ids_for
    from ulorl.reward.scorer import RewardScorer
    from ulorl.rollout.engines import MissingExtraError, make_engine
    from ulorl.rollout.types import SamplingParams

    model, tok, default_label = load_eval_model(args, uri, rope_scaling)
    prompt_lens = [len(prompt_ids_for(it, tok)) for it in items]
    max_new = _default_max_new(args, model, prompt_lens)
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    rollout_cfg = RolloutConfig(engine=args.engine, device=args.device, segments=1, max_response_len=max_new,
                                temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    try:
        engine = make_engine(rollout_cfg, model, tok)
    except MissingExtraError as exc:
        raise EvalCliError(f"--engine {args.engine}: {exc}") from None
    label = args.label or default_label

    tracker = None
    if not args.no_mlflow:
        from ulorl.tracking.run import RunTracker

        params = {
            "eval.benchmark": args.benchmark, "eval.k": args.k, "eval.num_problems": len(items),
            "eval.max_new_tokens": max_new, "eval.temperature": args.temperature, "eval.top_p": args.top_p,
            "eval.top_k": args.top_k, "eval.seed": args.seed, "eval.engine": args.engine,
            "eval.heldout_seed": args.heldout_seed if args.benchmark == "heldout" else "None",
            "model.name_or_path": args.model, "model.dtype": args.dtype,
            "model.rope_scaling": rope_scaling if rope_scaling else "None",
            schema.EXTRACTION_PARAM: args.extraction,
        }
        tracker = RunTracker.start(uri, experiment, args.run_name or f"eval-{bench}-{label}"[:120], params,
                                   eval_tags(bench, args.k, args.model, label, args.extraction),
                                   parent_run_id=args.parent_run_id)
        _log(f"MLflow run {tracker.run_id} ({uri})")
    try:
        with RewardScorer(timeout_s=args.reward_timeout_s, num_workers=1, extraction=args.extraction) as scorer:
            result = evaluate(engine, tok, items, k=args.k, sampling=sampling, max_new_tokens=max_new,
                              scorer=scorer, bench_name=bench, progress=True, batch_size=args.batch_size)
        if tracker is not None:
            log_eval_result(result, run_id=tracker.run_id, tracking_uri=uri)
            tracker.end("FINISHED")
    except BaseException:
        if tracker is not None:
            tracker.end("KILLED" if sys.exc_info()[0] is KeyboardInterrupt else "FAILED")
        raise
    out = result.summary()
    out.update({"model": args.model, "model_label": label, "metrics": result.metrics(),
                "run_id": tracker.run_id if tracker else None, "tracking_uri": uri if tracker else None,
                "rope_scaling": rope_scaling})
    return out


@json_command
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = run(args)
    except EvalCliError as exc:
        print(f"ulorl-eval: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        emit_json(out, default=str)
        print_table(out, sys.stderr)
    else:
        print_table(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
