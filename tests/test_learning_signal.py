"""``ulorl-bench learning-signal``: the learning signal of the default run over seeds (issue 4).

The claim itself (over six 30-step runs of ``experiments/quickstart.yaml``, the admission-cohort reward
rises and the held-out avg@k ends above the base model's) is a measurement: it is the benchmark
command's output, recorded in platform/ulorl/docs/runs.md. Here: its arithmetic by hand, and the
command end to end on two short seeded runs, every number it prints checked against what MLflow holds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ulorl.bench.learning_signal import main, verdict, window_means
from ulorl.tracking import schema

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "quickstart.yaml"


def test_window_means_and_verdict_by_hand():
    points = {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4, 5: 0.5, 6: 0.6, 7: 0.7, 8: 0.8, 9: 0.9, 10: 1.0}
    assert window_means(points) == pytest.approx((0.15, 0.95))        # 20 % of 10 cohorts: 2 each side
    assert window_means({3: 0.5, 1: 0.25}) == (0.25, 0.5)              # by step, at least one point each side
    v = verdict([0.1, -0.04], [0.5, 0.46], base=0.47)
    assert v["mean_cohort_rise"] == pytest.approx(0.03) and v["mean_final_heldout"] == pytest.approx(0.48)
    assert v["cohort_reward_rises"] and v["heldout_above_base"] and v["signal"]
    assert not verdict([0.1, -0.2], [0.5, 0.5], base=0.4)["signal"]     # the mean rise is what counts
    assert not verdict([0.1], [0.47], base=0.47)["signal"]              # equal to the base is no gain


@pytest.mark.slow  # two 6-step runs of the embedded default, cut small: ~30 s on an idle 2-core machine
def test_command_reports_what_mlflow_holds(tmp_path, capfd):
    over = ["train.max_steps=6", "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_response_len=64",
            "eval.every=6", "eval.num_problems=4", "eval.k=1", "train.checkpoint_every=6"]
    assert main([str(QUICK), *over, "--seeds", "3,4", "--workdir", str(tmp_path), "--json"]) == 0
    out = capfd.readouterr().out
    assert out.count("\n") == 1
    res = json.loads(out)
    client = MlflowClient(res["tracking_uri"])
    rises, finals = [], []
    for seed, run in zip((3, 4), res["runs"]):
        assert run["seed"] == seed and run["steps"] == 6
        params = client.get_run(run["run_id"]).data.params
        assert params["data.seed"] == params["rollout.seed"] == params["train.seed"] == str(seed)
        cohort = {m.step: m.value for m in client.get_metric_history(run["run_id"], schema.COHORT_REWARD_METRIC)}
        held = {m.step: m.value for m in client.get_metric_history(run["run_id"], "eval/heldout/avg_at_k")}
        # S = 4: the cohorts admitted at steps 1-3 have completed by step 6
        assert {1, 2, 3} <= set(cohort) and run["cohorts"] == len(cohort)
        first, last = window_means(cohort)
        assert (run["cohort_first_20pct"], run["cohort_last_20pct"]) == (first, last)
        assert run["cohort_rise"] == pytest.approx(last - first) and run["heldout_final"] == held[6]
        assert run["heldout_base"] == held.get(0)           # only the first seed evaluates the base model
        rises.append(last - first)
        finals.append(held[6])
    assert res["runs"][0]["heldout_base"] is not None and res["runs"][1]["heldout_base"] is None
    want = verdict(rises, finals, res["runs"][0]["heldout_base"])
    assert {k: res[k] for k in want} == pytest.approx(want)
