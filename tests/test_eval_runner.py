"""``evaluate`` end to end with a scripted engine (known right / wrong / truncated answers) through
the real reward scorer (math-verify in worker processes) and a real MLflow sqlite store."""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from ulorl.data.prompts import build_prompt
from ulorl.data.types import PromptItem
from ulorl.eval.runner import (
    EVAL_SAMPLING,
    K_TAG,
    eval_tags,
    evaluate,
    log_eval_result,
    pass_ks,
    summarize,
)
from ulorl.models.tokenizer import build_tokenizer
from ulorl.reward.scorer import RewardScorer
from ulorl.rollout.types import GenerationRequest, GenerationResult, SamplingParams
from ulorl.tracking import artifact_root_for, schema
from ulorl.tracking.run import get_or_create_experiment

MAX_NEW = 40


class TextScriptedEngine:
    """Engine-protocol fake: the i-th request for a prompt gets the i-th scripted text of that
    prompt, tokenized, plus EOS; a script longer than ``max_new_tokens`` is cut there and
    reported as ``finish_reason="length"`` (truncated), as a real engine would."""

    def __init__(self, tokenizer, scripts: dict[str, list[str]]) -> None:
        self.tok = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.policy_version = 0
        self.scripts = {tuple(tokenizer(p, add_special_tokens=False)["input_ids"]): list(v) for p, v in scripts.items()}
        self.served: dict[tuple[int, ...], int] = {}
        self.sampling_seen: list[SamplingParams] = []

    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[GenerationResult]:
        self.sampling_seen.append(sampling)
        out = []
        for r in requests:
            key = tuple(r.prompt_ids)
            i = self.served.get(key, 0)
            self.served[key] = i + 1
            ids = list(self.tok(self.scripts[key][i], add_special_tokens=False)["input_ids"]) + [self.eos_token_id]
            reason = "eos"
            if len(ids) > r.max_new_tokens:
                ids, reason = ids[: r.max_new_tokens], "length"
            out.append(GenerationResult(r.request_id, ids, [-0.5] * len(ids), reason))
        return out

    def update_weights(self, state_dict, version: int) -> None:  # pragma: no cover - not used
        self.policy_version = version


LONG = "Let me add these numbers one at a time very slowly and carefully: " * 3 + "\\boxed{1/2}"
ITEMS = [
    PromptItem("p0", "What is 17+53?", "70"),
    PromptItem("p1", "What is one half?", "\\frac{1}{2}"),
    PromptItem("p2", "What is 5+7?", "12"),
    PromptItem("p3", "What is 2+3?", "5"),
]
# k = 4 responses each; correct counts 3, 2, 1, 0 (by hand):
RESPONSES = [
    ["so \\boxed{70}", "\\boxed{70}", "\\boxed{71}", "\\boxed{070}"],        # 070 == 70 (integer fast path)
    ["\\boxed{1/2}", "\\boxed{0.5}", "\\boxed{2/3}", LONG],                   # math-verify; LONG is truncated
    ["no box here", "the answer is 12", "\\boxed{13}", "\\boxed{12}"],       # unboxed answers do not count
    ["\\boxed{4}", "\\boxed{6}", "\\boxed{}", "\\boxed{55}"],
]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def result(tok):
    engine = TextScriptedEngine(tok, {build_prompt(it, tok): rs for it, rs in zip(ITEMS, RESPONSES)})
    with RewardScorer(timeout_s=30, num_workers=1) as scorer:
        res = evaluate(engine, tok, ITEMS, k=4, sampling=EVAL_SAMPLING, max_new_tokens=MAX_NEW, scorer=scorer,
                       bench_name="scripted", progress=False, batch_size=6)
        assert scorer.stats["worker_calls"] >= 3  # the fractions went through math-verify
    assert engine.sampling_seen == [EVAL_SAMPLING] * 4  # chunks of 4 (batch_size rounded to whole problems)
    return res


def test_pass_ks() -> None:
    assert pass_ks(1) == [1]
    assert pass_ks(4) == [1, 2, 4]
    assert pass_ks(6) == [1, 2, 4, 6]
    assert pass_ks(32) == [1, 2, 4, 8, 16, 32]


def test_scripted_engine_exact_metrics(result, tok) -> None:
    assert len(tok(LONG, add_special_tokens=False)["input_ids"]) + 1 > MAX_NEW  # LONG really is truncated
    np.testing.assert_array_equal(result.correct, [[1, 1, 0, 1], [1, 1, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]])
    np.testing.assert_array_equal(result.truncated.sum(axis=1), [0, 1, 0, 0])
    assert result.avg_at_k == pytest.approx(6 / 16)
    # pass@j = mean_p 1 - C(4-c_p, j)/C(4, j) with c = 3, 2, 1, 0
    assert result.pass_at[1] == pytest.approx(6 / 16)
    assert result.pass_at[2] == pytest.approx((1 + 5 / 6 + 1 / 2 + 0) / 4)
    assert result.pass_at[4] == pytest.approx(3 / 4)
    assert result.metrics()["eval/scripted/pass_at_k"] == pytest.approx(3 / 4)
    assert result.truncation_rate == pytest.approx(1 / 16)
    lens = [[MAX_NEW if len(tok(r, add_special_tokens=False)["input_ids"]) + 1 > MAX_NEW
             else len(tok(r, add_special_tokens=False)["input_ids"]) + 1 for r in rs] for rs in RESPONSES]
    assert result.response_len_mean == pytest.approx(np.mean(lens))
    assert 0.0 <= result.ci_low <= result.avg_at_k <= result.ci_high <= 1.0
    assert [r["num_correct"] for r in result.rows] == [3, 2, 1, 0]
    assert result.rows[1]["predictions"] == "1/2|0.5|2/3|[truncated]"


def test_summarize_validates_shapes() -> None:
    with pytest.raises(ValueError, match="one shape"):
        summarize("b", ITEMS[:1], np.ones((1, 2)), np.ones((1, 3)), np.zeros((1, 2)))
    with pytest.raises(ValueError, match="2 items"):
        summarize("b", ITEMS[:2], np.ones((1, 2)), np.ones((1, 2)), np.zeros((1, 2)))


def test_logged_to_mlflow_exactly(result, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = get_or_create_experiment(client, "ulorl", uri)
    assert client.get_experiment(exp).artifact_location == artifact_root_for(uri)
    run = client.create_run(exp, tags=eval_tags("scripted", 4, "scripted-engine", "scripted"))
    log_eval_result(result, run_id=run.info.run_id, tracking_uri=uri)
    client.set_terminated(run.info.run_id)
    # a periodic eval inside a training run: metrics at the step, step-named CSV
    train = client.create_run(exp, tags={schema.KIND_TAG: "train"})
    log_eval_result(result, run_id=train.info.run_id, step=20, tracking_uri=uri)

    got = client.get_run(run.info.run_id)
    m = got.data.metrics
    assert m["eval/scripted/avg_at_k"] == pytest.approx(0.375)
    assert m["eval/scripted/pass_at_1"] == pytest.approx(0.375)
    assert m["eval/scripted/pass_at_2"] == pytest.approx(7 / 12)
    assert m["eval/scripted/pass_at_4"] == m["eval/scripted/pass_at_k"] == pytest.approx(0.75)
    assert m["eval/scripted/truncation_rate"] == pytest.approx(1 / 16)
    assert m["eval/scripted/ci_low"] <= 0.375 <= m["eval/scripted/ci_high"]
    assert "eval/scripted/response_len_mean" in m
    t = got.data.tags
    assert (t[schema.KIND_TAG], t[schema.BENCHMARK_TAG], t[K_TAG], t[schema.MODEL_LABEL_TAG]) == ("eval", "scripted", "4", "scripted")
    local = client.download_artifacts(run.info.run_id, schema.per_problem_artifact("scripted"), str(tmp_path / "dl"))
    rows = list(csv.DictReader(io.StringIO(Path(local).read_text())))
    assert [(r["problem_id"], int(r["num_correct"]), int(r["num_truncated"])) for r in rows] == \
        [("p0", 3, 0), ("p1", 2, 1), ("p2", 1, 0), ("p3", 0, 0)]
    hist = client.get_metric_history(train.info.run_id, "eval/scripted/avg_at_k")
    assert [(h.step, h.value) for h in hist] == [(20, 0.375)]
    arts = [a.path for a in client.list_artifacts(train.info.run_id, "eval")]
    assert arts == ["eval/scripted_per_problem_step_000020.csv"]
    assert Path(artifact_root_for(uri)[len("file://"):]).is_dir()  # artifacts beside the DB, not ./mlruns
    shutil.rmtree(tmp_path / "dl")


def test_log_without_run_fails_clearly(result) -> None:
    import mlflow

    assert mlflow.active_run() is None
    with pytest.raises(RuntimeError, match="no active MLflow run"):
        log_eval_result(result)
