"""Length audit (ulorl.train.length_audit): hand-derived bookkeeping, and the ledger of a real trainer run
on the deterministic scripted engine (tests/fakes.py) across a crash and a resume, read back from MLflow."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import ScriptedEngine
from mlflow.tracking import MlflowClient

from ulorl.config import load_experiment
from ulorl.rollout.types import Sample, SampleStatus
from ulorl.tracking import schema
from ulorl.tracking.schema import AUDIT_COMPLETION_FATES, AUDIT_FINAL_FATES, AUDIT_POOL_FATES, audit_metric
from ulorl.train.length_audit import LengthAudit, length_quantile, settle_released
from ulorl.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def _s(sid: int, gid: int, n: int, reward: float | None = 0.0, status: SampleStatus = SampleStatus.FINISHED) -> Sample:
    return Sample(sample_id=sid, group_id=gid, prompt_ids=[1], response_ids=[5] * n, status=status, reward=reward)


def test_length_quantile_by_hand():
    assert length_quantile([10, 20, 30, 40], 0.9) == 37.0     # position 2.7: 30 + 0.7 * 10
    assert length_quantile([10, 20, 30, 40], 0.5) == 25.0
    assert length_quantile([7], 0.9) == 7.0
    assert length_quantile([1, 2, 3], 1.0) == 3.0 and length_quantile([1, 2, 3], 0.0) == 1.0
    with pytest.raises(ValueError):
        length_quantile([], 0.5)


def test_released_groups_settle_by_the_dynamic_sampling_rule():
    mixed = [_s(0, 0, 3, 1.0), _s(1, 0, 9, 0.0)]
    all_zero = [_s(2, 1, 64, 0.0, SampleStatus.TRUNCATED), _s(3, 1, 64, None, SampleStatus.TRUNCATED)]
    out = settle_released(mixed + all_zero, updated=True, dynamic_sampling=True)
    assert [s.sample_id for s in out["trained"]] == [0, 1]
    assert [s.sample_id for s in out["filtered"]] == [2, 3]          # None counts as 0, as in the update
    out = settle_released(mixed + all_zero, updated=False, dynamic_sampling=True)
    assert [s.sample_id for s in out["refused"]] == [0, 1] and not out["trained"]
    out = settle_released(mixed + all_zero, updated=True, dynamic_sampling=False)
    assert len(out["trained"]) == 4 and not out["filtered"]


def test_step_metrics_by_hand():
    a = LengthAudit()
    done = [_s(0, 0, 10), _s(1, 0, 64, status=SampleStatus.TRUNCATED), _s(2, 0, 40, status=SampleStatus.TRUNCATED)]
    a.rolled_out(admitted=6, completed=done, clipped_ids={2}, stale=[])
    a.released([_s(0, 0, 10, 1.0), _s(1, 0, 64, 0.0), _s(2, 0, 40, 0.0)], updated=True, dynamic_sampling=True)
    unfinished = [_s(3, 1, 32, None, SampleStatus.DECODING), _s(4, 1, 16, None, SampleStatus.DECODING)]
    waiting = [_s(5, 1, 8)]
    # decoded so far: 10 + 64 + 40 + 32 + 16 + 8 = 170
    m = a.step_metrics(unfinished, waiting, decoded_tokens=170, prompts_too_long=3)
    assert m[schema.AUDIT_STARTED] == 6 and m[schema.AUDIT_PROMPTS_TOO_LONG] == 3
    assert m[audit_metric("eos", "count")] == 1 and m[audit_metric("eos", "len_max")] == 10
    assert m[audit_metric("truncated", "count")] == 1 and m[audit_metric("truncated", "len_p50")] == 64
    assert m[audit_metric("clipped", "count")] == 1 and m[audit_metric("clipped", "len_p90")] == 40
    assert m[audit_metric("trained", "count")] == 3
    assert m[audit_metric("trained", "len_p50")] == 40 and m[audit_metric("trained", "len_p90")] == pytest.approx(59.2)
    assert m[audit_metric("trained", "token_share")] == pytest.approx(114 / 170)
    assert m[audit_metric("unfinished", "count")] == 2 and m[audit_metric("unfinished", "len_p50")] == 24
    assert m[audit_metric("unfinished", "token_share")] == pytest.approx(48 / 170)
    assert m[audit_metric("waiting", "token_share")] == pytest.approx(8 / 170)
    assert m[audit_metric("filtered", "count")] == 0 and audit_metric("filtered", "len_p50") not in m
    assert audit_metric("unfinished", "total") not in m
    # ledger: 6 started = 3 trained + 2 unfinished + 1 waiting; token shares of final + pool fates add to 1
    finals = sum(m[audit_metric(f, "total")] for f in AUDIT_FINAL_FATES)
    in_pool = m[audit_metric("unfinished", "count")] + m[audit_metric("waiting", "count")]
    assert m[schema.AUDIT_STARTED] == finals + in_pool
    assert sum(m[audit_metric(f, "token_share")] for f in AUDIT_FINAL_FATES + AUDIT_POOL_FATES) == pytest.approx(1.0)
    # the next step starts empty; totals stay
    m2 = a.step_metrics([], [], decoded_tokens=170, prompts_too_long=3)
    assert m2[audit_metric("trained", "count")] == 0 and m2[audit_metric("trained", "total")] == 3
    assert set(schema.AUDIT_METRICS) <= set(m2)


def test_state_round_trip_and_a_resume_that_lost_samples():
    a = LengthAudit()
    a.rolled_out(admitted=8, completed=[_s(0, 0, 5)], clipped_ids=(), stale=[_s(1, 1, 7, None, SampleStatus.DROPPED)])
    b = LengthAudit()
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()
    assert b.reconcile(in_pool=7) == 0               # 8 started = 1 stale + 7 in the pools
    assert b.reconcile(in_pool=5) == 2               # two went missing
    m = b.step_metrics([], [], decoded_tokens=12, prompts_too_long=0)
    assert m[audit_metric("lost_resume", "count")] == 2 and m[audit_metric("lost_resume", "total")] == 2
    assert b.step_metrics([], [], 12, 0)[audit_metric("lost_resume", "count")] == 0
    with pytest.raises(ValueError, match="disagree"):
        b.reconcile(in_pool=99)
    with pytest.raises(ValueError, match="unknown fate"):
        b.record("kept", [])


# ----------------------------------------------------------------------------- the trainer's ledger


class ScriptedRewardTrainer(Trainer):
    """The real trainer with a scripted reward (prompt of <= 12 tokens and an even response length -> 1):
    the scripted engine's tokens never spell an answer, and the ledger needs groups that train (mixed
    rewards) and groups that are filtered (every longer prompt's group: all 0)."""

    def _score(self, finished: list[Sample]) -> list[float]:
        return [float(len(s.prompt_ids) <= 12 and s.response_len % 2 == 0) for s in finished]


def _config(tmp_path: Path):
    return load_experiment(ROOT / "experiments" / "quickstart.yaml", [
        "rollout.prompts_per_step=3", "rollout.group_size=4", "rollout.max_response_len=64", "rollout.segments=4",
        "rollout.max_staleness=1",            # some groups dropped as stale
        "rollout.engine_max_model_len=104",   # prompt budget 104 - 64 = 40 tokens: longer prompts dropped at load
        "data.task.num_train=200", "train.threads=1", "train.max_steps=8", "train.checkpoint_every=2",
        "eval.every=0", "tracking.sample_every=100", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
    ])


def _engine_factory(rollout_cfg, model, tokenizer):  # noqa: ANN001, ANN202
    engine = ScriptedEngine(vocab_size=300, eos_token_id=tokenizer.eos_token_id, max_len=90)
    engine.max_model_len = 76   # below the 104 the prompts were sized for: prompts over 12 tokens get clipped
    return engine


def test_ledger_holds_every_step_across_a_crash_and_resume(tmp_path):
    run_dir = tmp_path / "run"
    first = ScriptedRewardTrainer(_config(tmp_path), run_dir=run_dir, progress=False, fail_at_step=6,
                                  engine_factory=_engine_factory)
    with pytest.raises(RuntimeError, match="injected failure at step 6"):
        first.run()                          # checkpoint at step 4; step 5's points are dropped, redone
    resumed = ScriptedRewardTrainer(_config(tmp_path), resume=str(run_dir), progress=False,
                                    engine_factory=_engine_factory)
    res = resumed.run()
    assert res.steps == 8 and res.run_id == first.run_id

    client = MlflowClient(res.tracking_uri)

    def hist(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(res.run_id, key)}

    started = hist(schema.AUDIT_STARTED)
    assert sorted(started) == list(range(1, 9))
    totals = {f: hist(audit_metric(f, "total")) for f in AUDIT_FINAL_FATES + AUDIT_COMPLETION_FATES}
    pools = {f: hist(audit_metric(f, "count")) for f in AUDIT_POOL_FATES}
    shares = {f: hist(audit_metric(f, "token_share")) for f in AUDIT_FINAL_FATES + AUDIT_POOL_FATES}
    for step in range(1, 9):
        settled = sum(totals[f][step] for f in AUDIT_FINAL_FATES)
        assert started[step] == settled + pools["unfinished"][step] + pools["waiting"][step], step
        assert sum(s[step] for s in shares.values()) == pytest.approx(1.0), step
        assert totals["lost_resume"][step] == 0
    # the ledger is not vacuous: samples met every fate this setting can produce
    for fate in ("trained", "filtered", "stale", "eos", "truncated", "clipped"):
        assert totals[fate][8] > 0, fate
    assert max(pools["unfinished"].values()) > 0 and max(pools["waiting"].values()) > 0
    assert hist(schema.AUDIT_PROMPTS_TOO_LONG)[8] > 0           # prompts, counted apart: never started
    # started counts samples: G = 4 per admitted prompt, matching the scheduler's own counter
    assert started[8] == resumed.scheduler.pools.admitted and started[8] % 4 == 0
    # truncated samples are exactly the ones at the 64-token budget
    assert hist(audit_metric("truncated", "len_max")) and all(
        v == 64 for v in hist(audit_metric("truncated", "len_p50")).values())
