"""The sweep ranking: paired bootstrap on tiny hand-made score vectors, the verdict's rule, typed
override values and the trial run names."""

from __future__ import annotations

import numpy as np
import pytest

from ulorl.config import parse_override
from ulorl.sweep import command, ranking
from ulorl.sweep.command import train_command
from ulorl.sweep.ranking import Trial, paired_bootstrap, verdict
from ulorl.sweep.spec import trial_run_name
from ulorl.sweep.summary_text import ranking_csv
from ulorl.tracking.read import parse_per_problem_csv


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


def _confirmed(run_id: str, role: str, seed: int, selection: list[float], confirm: list[float],
               objective: float | None = None) -> Trial:
    t = _trial(run_id, role, seed, selection, objective)
    t.confirm = {f"c{i}": v for i, v in enumerate(confirm)}
    return t


def test_verdict_judges_rerun_seeds_on_the_confirmation_problems():
    base = [0.0, 0.5, 0.5, 1.0, 0.0, 0.5]
    up = [x + 0.25 for x in base]
    # the best trial won the search on the selection part by +0.5, on its confirmation part by 0.25
    trials = [_confirmed("best", "search", 0, [1.0] * 6, up), _confirmed("other", "search", 0, base, base),
              *[_confirmed(f"base{s}", "baseline", s, base, base) for s in range(4)],
              _confirmed("rerun1", "rerun", 1, base, [x + 0.25 for x in base]),
              _confirmed("rerun2", "rerun", 2, base, [x + 0.125 for x in base]),
              _confirmed("rerun3", "rerun", 3, base, [x + 0.375 for x in base])]
    v = verdict(trials)
    # diffs 0.25 / 0.125 / 0.375: t95 = 0.25 +- 4.303 * 0.125 / sqrt(3) = [-0.061, 0.561]: inconclusive
    assert [p["seed_offset"] for p in v.per_seed] == [1, 2, 3] and v.part == "confirmation"
    assert [p["diff"] for p in v.per_seed] == pytest.approx([0.25, 0.125, 0.375])
    assert v.t_interval == pytest.approx((0.25 - 4.302652729911275 * 0.125 / 3 ** 0.5,
                                          0.25 + 4.302652729911275 * 0.125 / 3 ** 0.5))
    assert v.selected is not None and v.selected["diff"] == pytest.approx(0.25)   # shown, not counted
    assert v.beats is False and "does NOT beat the baseline" in v.line and "selected seed 0, not counted" in v.line
    # the same gain on every problem and seed but with a spread across seeds: beats
    trials[-1] = _confirmed("rerun3", "rerun", 3, base, [x + 0.3 for x in base])
    trials[-2] = _confirmed("rerun2", "rerun", 2, base, [x + 0.2 for x in base])
    v = verdict(trials)
    assert v.beats is True and "BEATS the baseline on 3 re-run seeds" in v.line
    assert v.problem_interval is not None and v.problem_interval[0] > 0


def test_verdict_never_rests_on_two_identical_rerun_differences():
    base = [0.0, 0.5, 0.5, 1.0]
    trials = [_confirmed("best", "search", 0, [1.0] * 4, base), _confirmed("base1", "baseline", 1, base, base),
              _confirmed("base2", "baseline", 2, base, base),
              _confirmed("rerun1", "rerun", 1, base, [x + 0.25 for x in base]),
              _confirmed("rerun2", "rerun", 2, base, [x + 0.25 for x in base])]
    v = verdict(trials)
    # +0.25 on every problem and both seeds: no t-interval (2 seeds, zero spread); the pooled problem
    # bootstrap is the point 0.25, and alone it carries no verdict
    assert v.t_interval is None and v.problem_interval == pytest.approx((0.25, 0.25))
    assert "no t-interval: only 2 seed(s)" in v.line and v.beats is None
    assert "cannot be judged without a t-interval across seeds" in v.line
    v1 = verdict(trials[:-1] + [_confirmed("rerun9", "rerun", 9, base, base)])   # one paired re-run seed
    assert v1.beats is None and "cannot be judged" in v1.line


def test_verdict_without_a_split_is_refused():
    base = [0.0, 0.5, 0.5, 1.0, 0.0, 0.5]
    trials = [_trial("best", "search", 0, [x + 0.25 for x in base]), _trial("base0", "baseline", 0, base),
              *[_trial(f"base{s}", "baseline", s, base) for s in (1, 2, 3)],
              *[_trial(f"rerun{s}", "rerun", s, [x + 0.15 + 0.05 * s for x in base]) for s in (1, 2, 3)]]
    v = verdict(trials)
    # three re-run seeds with a spread, every interval above zero, yet picked on the problems it is judged on
    assert v.part == "all" and "the ones the search selected on" in v.line
    assert v.t_interval is not None and v.t_interval[0] > 0
    assert v.beats is None and "REFUSED" in v.line


def test_ranking_rows_pair_with_the_same_seed_baseline():
    trials = [_trial("t1", "search", 0, [1.0, 1.0]), _trial("b0", "baseline", 0, [0.0, 1.0]),
              _trial("b1", "baseline", 1, [1.0, 1.0]), _trial("r1", "rerun", 1, [1.0, 0.0])]
    rows = {r["run_id"]: r for r in ranking.ranking_rows(trials)}
    assert rows["t1"]["rank"] == 1 and rows["t1"]["diff_vs_baseline"] == pytest.approx(0.5)
    assert rows["t1"]["baseline_run_id"] == "b0"
    assert rows["r1"]["baseline_run_id"] == "b1" and rows["r1"]["diff_vs_baseline"] == pytest.approx(-0.5)
    assert rows["b0"]["diff_vs_baseline"] is None and rows["b0"]["rank"] is None
    csv_head = ranking_csv(list(rows.values())).splitlines()[0].split(",")
    assert csv_head[: len(ranking.RANKING_COLUMNS)] == list(ranking.RANKING_COLUMNS)


@pytest.mark.parametrize("value", [0.95, 0.09312345678, 4, "off", "dynamic", True, "0.5"])
def test_override_values_parse_back_to_the_same_type(value):
    key, parsed = parse_override(f"algo.mpt.tau={command.override_value(value)}")
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
    fixed = command.fixed_overrides(spec)
    best = _trial("r1", "search", 2, [1.0])
    best.variant = "dmmpt"
    out = command.best_trial_overrides(spec, base, fixed, best)
    assert out == {"train.max_steps": 150, "algo.mpt.mode": "dynamic", "algo.mpt.sigma": 0.2,
                   "data.seed": 2, "rollout.seed": 7, "train.seed": 2}
    seed0 = _trial("r0", "search", 0, [1.0])
    seed0.variant = "off"
    assert command.best_trial_overrides(spec, base, fixed, seed0) == {"train.max_steps": 150, "algo.mpt.mode": "off"}
