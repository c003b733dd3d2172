"""The train / inference mismatch of an update (ulorl.train.mismatch): which token pairs share weights, by
hand on scripted samples; and a real 2-step training (embedded model, HF engine in bf16 against the float32
trainer, real MLflow) whose store holds the mismatch and correction metrics at every update."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from ulorl.config import RolloutCorrectionConfig, load_experiment
from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan
from ulorl.tracking import schema
from ulorl.train.batch import build_train_batch
from ulorl.train.mismatch import MismatchSettings, rollout_mismatch, same_weights_pairs, token_sources
from ulorl.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def _samples() -> list[Sample]:
    """A: 5 response tokens, segments [0, 2) at version 0 and [2, 5) at version 1; B: 3 tokens at version 1;
    C: 2 tokens at version 1 whose engine returned no log-probs."""
    a = Sample(0, 0, [1, 2], response_ids=[3, 4, 5, 6, 7], sampling_logprobs=[-1.0, -1.1, -1.2, -1.3, -1.4],
               old_logprobs=[-0.5, -0.6, -0.7, -0.8, -0.9], segments=[SegmentSpan(0, 2, 0), SegmentSpan(2, 5, 1)],
               status=SampleStatus.FINISHED, reward=1.0)
    b = Sample(1, 0, [1, 2, 3], response_ids=[4, 5, 6], sampling_logprobs=[-2.0, -2.1, -2.2],
               old_logprobs=[-2.0, -2.0, -2.0], segments=[SegmentSpan(0, 3, 1)], status=SampleStatus.FINISHED,
               reward=0.0)
    c = Sample(2, 0, [1], response_ids=[4, 5], old_logprobs=[-1.0, -1.0], segments=[SegmentSpan(0, 2, 1)],
               status=SampleStatus.FINISHED, reward=0.0)
    return [a, b, c]


def test_token_sources_place_engine_logprobs_segments_and_positions():
    samples = _samples()
    batch = build_train_batch(samples, 0)
    src = token_sources(samples, batch)
    # row 0: prompt 2 -> response token j at t = 1 + j
    assert src.engine_logprobs[0, 1:6].tolist() == pytest.approx([-1.0, -1.1, -1.2, -1.3, -1.4])
    assert src.segment_index[0].tolist() == [-1, 0, 0, 1, 1, 1]
    assert src.positions[0].tolist() == [-1, 0, 1, 2, 3, 4]
    assert src.segment_index[1].tolist()[2:5] == [0, 0, 0]
    assert src.has_engine.tolist() == [True, True, False]
    assert all(math.isnan(x) for x in src.engine_logprobs[2].tolist())


@pytest.mark.parametrize("is_mode,sais_from_trainer,version,want", [
    # POIS / TOIS / SAIS with engine log-probs: the tokens version 1 decoded, against the current pass
    ("pois", True, 1, {0: [3, 4, 5], 1: [2, 3, 4]}),
    ("sais", False, 1, {0: [3, 4, 5], 1: [2, 3, 4]}),
    # SAIS with the trainer's log-probs at each segment's version: every response token with engine log-probs
    ("sais", True, 1, {0: [1, 2, 3, 4, 5], 1: [2, 3, 4]}),
    ("sais", True, None, {0: [1, 2, 3, 4, 5], 1: [2, 3, 4]}),
    # the update starts from version 2: nothing it holds was decoded by those weights
    ("pois", True, 2, {}),
    ("pois", True, None, {}),
])
def test_same_weights_pairs(is_mode, sais_from_trainer, version, want):
    samples = _samples()
    batch = build_train_batch(samples, 0)
    cur = torch.full(batch.targets.shape, -3.0)
    settings = MismatchSettings(RolloutCorrectionConfig(), is_mode, sais_from_trainer, version, 16)
    ref, measured = same_weights_pairs(batch, token_sources(samples, batch), cur, settings)
    got = {b: measured[b].nonzero().flatten().tolist() for b in range(3) if bool(measured[b].any())}
    assert got == want
    if is_mode == "sais" and sais_from_trainer:
        assert ref[0, 1:6].tolist() == pytest.approx([-0.5, -0.6, -0.7, -0.8, -0.9])   # the stored trainer log-probs
    else:
        assert bool((ref == cur).all())


def test_rollout_mismatch_metrics_and_correction():
    samples = _samples()[:2]
    batch = build_train_batch(samples, 0)
    src = token_sources(samples, batch)
    cur = src.engine_logprobs.nan_to_num(0.0) + math.log(3.0) * batch.response_mask   # trainer = engine + ln 3
    old = cur * batch.response_mask
    cfg = RolloutCorrectionConfig(mode="token_tis", threshold=2.0)
    out = rollout_mismatch(src, batch, cur, old, MismatchSettings(cfg, "pois", True, 1, 16))
    # measured: 6 tokens of version 1 (of 8 response tokens), each delta ln 3 (ratio 3: outside [0.5, 2])
    assert out.metrics["mismatch/tokens"] == 6 and out.metrics["mismatch/coverage"] == pytest.approx(6 / 8)
    assert out.metrics["mismatch/abs_mean"] == pytest.approx(math.log(3.0), rel=1e-6)
    assert out.metrics["mismatch/ratio_out_frac"] == 1.0
    assert out.metrics["mismatch/seg1/tokens"] == 3 and out.metrics["mismatch/seg0/tokens"] == 3   # A's seg 1, B's 0
    assert out.metrics["mismatch/seq_logratio_min"] == pytest.approx(3 * math.log(3.0), rel=1e-6)
    # token_tis: every ratio 3 truncated at 2
    assert out.weights is not None and out.weights[batch.response_mask].tolist() == pytest.approx([2.0] * 8)
    assert out.metrics["correction/truncated_frac"] == 1.0 and not bool(out.rejected.any())
    quiet = MismatchSettings(RolloutCorrectionConfig(measure=False), "pois", True, 1)
    off = rollout_mismatch(src, batch, cur, old, quiet)
    assert off.metrics == {} and off.weights is None


def test_a_correction_without_engine_logprobs_names_the_row():
    samples = _samples()
    batch = build_train_batch(samples, 0)
    cur = torch.zeros(batch.targets.shape)
    with pytest.raises(ValueError, match="batch row 2 has none"):
        rollout_mismatch(token_sources(samples, batch), batch, cur, cur,
                         MismatchSettings(RolloutCorrectionConfig(mode="icepop"), "pois", True, 1))


def test_two_step_training_logs_the_mismatch_to_mlflow(tmp_path):
    """bf16 HF engine vs the float32 trainer, SAIS with the trainer's log-probs (every segment measured), 8-token
    segments so responses span several, token TIS on: MLflow holds the gap overall, per segment and per
    position bucket, and the correction's statistics, at every update step."""
    cfg = load_experiment(ROOT / "experiments" / "quickstart.yaml", [
        "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_response_len=32", "rollout.segments=4",
        "rollout.engine_dtype=bfloat16", "algo.is_mode=sais", "algo.dynamic_sampling=false",
        "algo.rollout_correction.mode=token_tis", "train.threads=1", "eval.every=0", "train.lr=1e-4",
        "train.max_steps=2", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"])
    res = Trainer(cfg, run_dir=tmp_path / "run", progress=False).run()
    client = MlflowClient(res.tracking_uri)
    assert client.get_run(res.run_id).data.params["algo.rollout_correction.mode"] == "token_tis"

    def hist(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(res.run_id, key)}

    updated = [s for s, v in hist(schema.SKIPPED_METRIC).items() if v == 0.0]
    assert updated, "no step updated the model in 2 steps"
    for key in schema.MISMATCH_METRICS + ("correction/weight_mean",
                                          "correction/rejected_frac", schema.mismatch_metric("abs_mean", segment=0),
                                          schema.mismatch_metric("k3_kl", bucket=0)):
        assert set(updated) <= set(hist(key)), key
    for s in updated:
        assert hist("mismatch/coverage")[s] == 1.0         # SAIS trainer log-probs: every response token
        # a bf16 engine differs from the float32 trainer, but by far less than a nat per token
        assert 0.0 < hist("mismatch/abs_mean")[s] < 0.5 and math.isfinite(hist("mismatch/k3_kl")[s])
        assert hist("mismatch/k3_kl")[s] >= 0.0
    # responses longer than one 8-token segment: later segments and position buckets are measured
    assert any(k.startswith("mismatch/seg1/") for k in client.get_run(res.run_id).data.metrics)
    pos = {int(k.split("/")[1][3:]) for k in client.get_run(res.run_id).data.metrics if k.startswith("mismatch/pos")}
    assert pos and pos <= set(range(8)) and len(pos) > 1


def test_cost_bench_runs_and_reports_every_variant(capsys):
    from ulorl.bench.mismatch_cost import main

    assert main(["--rows", "8", "--response-len", "16", "--segments", "2", "--reps", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out["median_s"]) == {"update, not measured", "update, measured", "update, measured + token_tis",
                                    "update, measured + seq_mis", "no-grad pass", "mismatch block"}
    assert all(v > 0 for v in out["median_s"].values())
