"""algo.dynamic_sampling_fill (DAPO-style): release waits for mixed-reward groups; the step rolls out more."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from fakes import ScriptedEngine
from ulorl.config import ConfigError, load_experiment
from ulorl.rollout.pools import ExperiencePool, has_mixed_rewards
from ulorl.rollout.scheduler import PromptRequest, SegmentScheduler
from ulorl.rollout.types import Sample, SampleStatus, SamplingParams
from ulorl.tracking import schema
from ulorl.train.fill import merge_round_metrics
from ulorl.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "quickstart.yaml"


def _done(sid: int, gid: int, reward: float) -> Sample:
    return Sample(sample_id=sid, group_id=gid, prompt_ids=[1], response_ids=[2], status=SampleStatus.FINISHED,
                  reward=reward)


def test_release_counts_only_mixed_groups_but_releases_every_ready_group():
    pool = ExperiencePool(group_size=2)
    for s in (_done(0, 0, 1.0), _done(1, 0, 1.0), _done(2, 1, 0.0), _done(3, 1, 0.0)):  # two uniform groups
        pool.add(s)
    assert pool.release(1, counts=has_mixed_rewards) == []
    assert pool.num_ready == 2
    pool.add(_done(4, 2, 1.0))
    pool.add(_done(5, 2, 0.0))                        # one mixed group: now enough
    groups = pool.release(1, counts=has_mixed_rewards)
    assert [g[0].group_id for g in groups] == [0, 1, 2] and pool.num_samples == 0
    assert not has_mixed_rewards([_done(0, 0, 1.0), _done(1, 0, 1.0)])
    assert has_mixed_rewards([_done(0, 0, 1.0), Sample(sample_id=1, group_id=0, prompt_ids=[1])])  # None = 0


def test_scheduler_waits_for_mixed_groups():
    engine = ScriptedEngine(max_len=4)
    sched = SegmentScheduler(engine, segments=1, max_response_len=8, group_size=2, prompts_per_step=1,
                             sampling=SamplingParams(), release_counts=has_mixed_rewards)
    rewards = iter([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])   # group 0 all right, group 1 all wrong, group 2 mixed
    released = []
    for step in range(3):
        res = sched.step([PromptRequest([5 + step])], 0, score_fn=lambda done: [next(rewards) for _ in done])
        released.append([g[0].group_id for g in res.groups])
    assert released == [[], [], [0, 1, 2]]


def test_merge_round_metrics():
    a = {"time/rollout_s": 1.0, "rollout/tokens": 100.0, "pool/unfinished": 8.0, "rollout/fill_rounds": 1.0}
    b = {"time/rollout_s": 3.0, "rollout/tokens": 300.0, "pool/unfinished": 16.0}
    m = merge_round_metrics(a, b)
    assert m["time/rollout_s"] == 4.0 and m["rollout/tokens"] == 400.0 and m["rollout/tokens_per_s"] == 100.0
    assert m["pool/unfinished"] == 16.0 and m["rollout/fill_rounds"] == 2.0


def test_fill_needs_dynamic_sampling():
    with pytest.raises(ConfigError, match="algo.dynamic_sampling_fill"):
        load_experiment(QUICK, ["algo.dynamic_sampling_fill=true", "algo.dynamic_sampling=false"])


def test_trainer_fill_updates_on_mixed_groups_every_step(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = load_experiment(QUICK, ["rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_response_len=64",
                                  "rollout.segments=2", "train.threads=1", "eval.every=0", "train.max_steps=3",
                                  "rollout.min_ready_groups=2", "algo.dynamic_sampling_fill=true",
                                  "algo.dynamic_sampling_fill_max_rounds=6", f"tracking.uri={uri}"])
    res = Trainer(cfg, run_dir=tmp_path / "run", progress=False).run()
    client = MlflowClient(uri)
    hist = {k: {m.step: m.value for m in client.get_metric_history(res.run_id, k)}
            for k in (schema.SKIPPED_METRIC, "rollout/fill_rounds", "train/groups", "train/ds_dropped_samples")}
    assert sorted(hist["rollout/fill_rounds"]) == [1, 2, 3]
    assert max(hist["rollout/fill_rounds"].values()) > 1       # segments = 2: step 1 needs a second round
    for step, skipped in hist[schema.SKIPPED_METRIC].items():
        if hist["rollout/fill_rounds"][step] < 6:               # not cut by the cap: trained on >= 2 mixed groups
            assert skipped == 0.0 and hist["train/groups"][step] >= 2
