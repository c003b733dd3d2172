"""Learning signal of the default run (issue 4), read back from MLflow. Slow: six 30-step runs.

``experiments/quickstart.yaml`` as shipped, six seeds (data order, rollout sampling, trainer), each
a real run (embedded model, HF engine, math-verify, SQLite MLflow). With 8 prompts per step a
single run's reward windows swing with the prompts drawn (a cohort's reward tracks its prompts'
length), so the claim is made over seeds 0-5 together (seed 6, also measured, gave +0.04): the admission-cohort
reward (free of segment rollout's finish-order bias, ``ulorl.train.cohorts``) is higher over the
last 20 % of the cohorts than over the first 20 %, and the held-out avg@k after training is above
the base model's. Measured when written (2 cores, 4 min 48 s): cohort reward last - first 20 %
per seed +0.094, +0.042, +0.083, +0.052, -0.008, +0.065 (mean +0.055); held-out avg@k 0.461 (base)
-> 0.539, 0.508, 0.523, 0.469, 0.516, 0.484 after 30 steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ulorl.config import load_experiment
from ulorl.tracking import schema
from ulorl.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "quickstart.yaml"
SEEDS = range(6)


def _window_means(points: dict[int, float], frac: float = 0.2) -> tuple[float, float]:
    steps = sorted(points)
    w = max(1, round(len(steps) * frac))
    first, last = steps[:w], steps[-w:]
    return sum(points[s] for s in first) / w, sum(points[s] for s in last) / w


@pytest.mark.slow
def test_default_run_cohort_reward_and_heldout_rise(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    diffs, finals, base = [], [], None
    for seed in SEEDS:
        cfg = load_experiment(QUICK, [f"tracking.uri={uri}", f"data.seed={seed}", f"rollout.seed={seed}",
                                      f"train.seed={seed}"])
        res = Trainer(cfg, run_dir=tmp_path / f"seed{seed}", progress=False, eval_at_start=(seed == 0)).run()
        assert res.steps == cfg.train.max_steps
        cohort = {m.step: m.value for m in client.get_metric_history(res.run_id, schema.COHORT_REWARD_METRIC)}
        # S = 4: every cohort admitted up to step max_steps - 3 has completed by the last step
        assert set(range(1, cfg.train.max_steps - cfg.rollout.segments + 2)) <= set(cohort)
        first, last = _window_means(cohort)
        diffs.append(last - first)
        held = {m.step: m.value for m in client.get_metric_history(res.run_id, "eval/heldout/avg_at_k")}
        if seed == 0:
            base = held[0]
        finals.append(held[cfg.train.max_steps])
    print("cohort reward last-first 20% per seed:", [round(d, 3) for d in diffs])
    print("held-out avg@k base", base, "final per seed", finals)
    assert sum(diffs) / len(diffs) > 0.0, diffs
    assert sum(finals) / len(finals) > base, (base, finals)
