"""The sweep ranking: paired bootstrap on tiny hand-made score vectors, the verdict's rule, typed
override values and the trial run names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ulorl.config import parse_override
from ulorl.sweep import ranking
from ulorl.sweep.ranking import Trial, paired_bootstrap, parse_per_problem_csv, train_command, verdict
from ulorl.sweep.spec import trial_run_name


def _trial(run_id: str, role: str, seed: int, scores: list[float], objective: float | None = None) -> Trial:
    return Trial(run_id=run_id, run_name=run_id, trial_id=run_id, role=role, seed_offset=seed, status="FINISHED",
                 objective=float(np.mean(scores)) if objective is None else objective, steps=20.0,
                 scores={f"p{i}": s for i, s in enumerate(scores)})


def test_paired_difference_is_mean_of_per_problem_differences():
    a, b = [1.0, 0.5, 0.5, 1.0], [0.5, 0.5, 0.0, 1.0]
    d, lo, hi = paired_bootstrap(a, b)
    assert d == pytest.approx(0.25)                       # (0.5 + 0 + 0.5 + 0) / 4
    # every resample of the differences {0.5, 0, 0.5, 0} has a mean in [0, 0.5]
    assert 0.0 <= lo <= d <= hi <= 0.5


def test_pairing_removes_problem_variance():
    """A constant per-problem gain gives a zero-width interval; unpaired intervals would be wide."""
    base = [0.0, 1.0, 0.5, 0.25, 0.75, 0.0, 1.0, 0.5]
    better = [x + 0.125 for x in base]
    d, lo, hi = paired_bootstrap(better, base)
    assert d == lo == hi == pytest.approx(0.125)


def test_per_problem_csv_reads_accuracy_from_counts():
    text = "problem_id,answer,k,num_correct,accuracy\nq1,3,2,1,0.5\nq2,4,2,2,1.0\n"
    assert parse_per_problem_csv(text) == {"q1": 0.5, "q2": 1.0}


def test_verdict_needs_every_seed():
    base = [0.0, 0.5, 0.5, 1.0, 0.0, 0.5]
    up = [x + 0.25 for x in base]
    trials = [_trial("best", "search", 0, up), _trial("other", "search", 0, base, objective=0.1),
              _trial("base0", "baseline", 0, base), _trial("base1", "baseline", 1, base),
              _trial("rerun1", "rerun", 1, up)]
    v = verdict(trials)
    assert v.beats is True and "BEATS the baseline on all 2 seed(s)" in v.line
    assert [p["seed_offset"] for p in v.per_seed] == [0, 1] and v.seed_spread == pytest.approx(0.0)
    # on the second seed the best config is no better: no claim
    trials[-1] = _trial("rerun1", "rerun", 1, base)
    v = verdict(trials)
    assert v.beats is False and "does NOT beat the baseline" in v.line


def test_ranking_rows_pair_with_the_same_seed_baseline():
    trials = [_trial("t1", "search", 0, [1.0, 1.0]), _trial("b0", "baseline", 0, [0.0, 1.0]),
              _trial("b1", "baseline", 1, [1.0, 1.0]), _trial("r1", "rerun", 1, [1.0, 0.0])]
    rows = {r["run_id"]: r for r in ranking.ranking_rows(trials)}
    assert rows["t1"]["rank"] == 1 and rows["t1"]["diff_vs_baseline"] == pytest.approx(0.5)
    assert rows["t1"]["baseline_run_id"] == "b0"
    assert rows["r1"]["baseline_run_id"] == "b1" and rows["r1"]["diff_vs_baseline"] == pytest.approx(-0.5)
    assert rows["b0"]["diff_vs_baseline"] is None and rows["b0"]["rank"] is None
    csv_head = ranking.ranking_csv(list(rows.values())).splitlines()[0].split(",")
    assert csv_head[: len(ranking.RANKING_COLUMNS)] == list(ranking.RANKING_COLUMNS)


@pytest.mark.parametrize("value", [0.95, 0.09312345678, 4, "off", "dynamic", True, "0.5"])
def test_override_values_parse_back_to_the_same_type(value):
    key, parsed = parse_override(f"algo.mpt.tau={ranking.override_value(value)}")
    assert parsed == value and type(parsed) is type(value)


def test_train_command_is_relative_and_quoted(tmp_path):
    base = tmp_path / "experiments" / "quickstart.yaml"
    cmd = train_command(base, {"algo.mpt.mode": "off", "algo.mpt.tau": 0.9}, cwd=tmp_path)
    assert cmd == "ulorl-train experiments/quickstart.yaml \"algo.mpt.mode='off'\" algo.mpt.tau=0.9"


def test_trial_run_names_are_unique_and_readable():
    name = trial_run_name("mpt_threshold", "8ffbe956", {"algo.mpt.tau": 0.9, "algo.mpt.sigma": 0.09312})
    assert name == "mpt_threshold-8ffbe956 tau=0.9 sigma=0.0931"
    assert trial_run_name("s", "t1", {"algo.mpt.mode": "off"}, "baseline", 1) == "s-t1 baseline seed+1 mode=off"
    # two keys ending alike keep their full names
    assert "train.seed=1 rollout.seed=2" in trial_run_name("s", "t", {"train.seed": 1, "rollout.seed": 2})


def test_best_index_breaks_ties_by_trial_id_like_the_ranking():
    assert ranking.best_index([0.5, 0.52, 0.52, None], ["d", "c", "b", "a"]) == 2
    assert ranking.best_index([0.5, 0.4], ["a", "b"], mode="min") == 1
    assert ranking.best_index([None, float("nan")], ["a", "b"]) is None
    trials = [_trial("c", "search", 0, [0.5], objective=0.52), _trial("b", "search", 0, [0.5], objective=0.52)]
    assert ranking.ranking_rows(trials)[0]["run_id"] == "b"


def test_best_command_of_a_variant_sweep_carries_the_variant_and_its_seeds(tmp_path):
    """A grid sweep over variants with repeats: the best trial's command must re-create that trial,
    i.e. carry its variant's overrides and, for seed offset 2, the repeat's three seeds."""
    from ulorl.sweep.spec import SweepSpec

    base = {"data": {"seed": 0}, "rollout": {"seed": 5}, "train": {"seed": 0}}
    spec = SweepSpec.model_validate({
        "name": "s", "base": "x.yaml", "search": {"algorithm": "grid"}, "repeats": 3, "stop": {"steps": 150},
        "variants": [{"name": "off", "overrides": {"algo.mpt.mode": "off"}},
                     {"name": "dmmpt", "overrides": {"algo.mpt.mode": "dynamic", "algo.mpt.sigma": 0.2}}]})
    fixed = ranking.fixed_overrides(spec)
    best = _trial("r1", "search", 2, [1.0])
    best.variant = "dmmpt"
    out = ranking.best_trial_overrides(spec, base, fixed, best)
    assert out == {"train.max_steps": 150, "algo.mpt.mode": "dynamic", "algo.mpt.sigma": 0.2,
                   "data.seed": 2, "rollout.seed": 7, "train.seed": 2}
    seed0 = _trial("r0", "search", 0, [1.0])
    seed0.variant = "off"
    assert ranking.best_trial_overrides(spec, base, fixed, seed0) == {"train.max_steps": 150, "algo.mpt.mode": "off"}
