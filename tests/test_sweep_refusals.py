"""A sweep cannot be talked into a verdict it has no grounds for: its objective may not read the
problems it is judged on, a NaN objective ranks last everywhere, identical arms are said to be identical."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from ulorl.sweep import ranking
from ulorl.sweep.ranking import Trial, best_index, ranking_rows, verdict
from ulorl.sweep.spec import SweepError, judged_part, load_sweep

ROOT = Path(__file__).resolve().parents[1]
BASE = (ROOT / "experiments" / "quickstart.yaml").as_posix()


def _spec(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(f"name: t\nbase: {BASE}\n" + body)
    return p


@pytest.mark.parametrize("metric, part", [("eval/heldout_confirm/avg_at_k", "confirmation"),
                                          ("eval/heldout_final/avg_at_k", "final"),
                                          ("eval/heldout_final/pass_at_1", "final")])
def test_a_search_may_not_select_on_the_problems_it_is_judged_on(tmp_path: Path, metric: str, part: str) -> None:
    # before: accepted (the confirmation metric only needed eval.select_problems; the final one nothing)
    body = ("overrides: {eval.select_problems: 32}\nspace:\n  algo.mpt.tau: {choice: [0.9, 0.99]}\n"
            f"metric: {metric}\n")
    with pytest.raises(SweepError, match=rf"metric: {metric} reads the {part} problems.*must not select on them"):
        load_sweep(_spec(tmp_path, body))
    # in a list of objectives the entry is named
    body = ("overrides: {eval.select_problems: 32}\nspace:\n  algo.mpt.tau: {choice: [0.9, 0.99]}\n"
            f"metric: [time/step_s, {metric}]\nmode: [min, max]\n")
    with pytest.raises(SweepError, match=r"metric\[1\]: "):
        load_sweep(_spec(tmp_path, body))


def test_the_selection_part_and_other_metrics_are_not_judged_parts(tmp_path: Path) -> None:
    assert judged_part("eval/heldout_select/avg_at_k") is None and judged_part("eval/heldout/avg_at_k") is None
    assert judged_part("train/entropy") is None and judged_part("time/step_s") is None
    body = ("overrides: {eval.select_problems: 32}\nspace:\n  algo.mpt.tau: {choice: [0.9, 0.99]}\n"
            "metric: eval/heldout_select/avg_at_k\n")
    assert load_sweep(_spec(tmp_path, body))[0].metrics == ["eval/heldout_select/avg_at_k"]


def _trial(run_id: str, role: str, seed: int, confirm: list[float], objective: float | None = None,
           selection: list[float] | None = None) -> Trial:
    sel = selection if selection is not None else [0.5] * len(confirm)
    return Trial(run_id=run_id, run_name=run_id, trial_id=run_id, role=role, seed_offset=seed, status="FINISHED",
                 objective=float(np.mean(sel)) if objective is None else objective, steps=20.0,
                 scores={f"s{i}": v for i, v in enumerate(sel)}, confirm={f"c{i}": v for i, v in enumerate(confirm)})


def test_a_nan_objective_ranks_last_in_the_ranking_the_best_index_and_the_verdict() -> None:
    # objectives [0.5, nan, 0.7, 0.6]: before, the ranking's sort judged the 0.5 trial while best_index picked 0.7
    objectives = [0.5, math.nan, 0.7, 0.6]
    base = [0.0, 0.5, 0.5, 1.0]
    trials = [_trial(f"t{i}", "search", 0, base, objective=o) for i, o in enumerate(objectives)]
    trials += [_trial(f"b{s}", "baseline", s, base) for s in range(4)]
    trials += [_trial(f"r{s}", "rerun", s, [x + 0.1 * s for x in base]) for s in range(1, 4)]
    rows = ranking_rows(trials)
    search = [r["run_id"] for r in rows if r["role"] == "search"]
    assert search == ["t2", "t3", "t0", "t1"]                   # 0.7, 0.6, 0.5, then NaN
    assert best_index(objectives, [f"t{i}" for i in range(4)]) == 2
    assert "best trial t2 " in verdict(trials).line
    # mode min: NaN still last
    assert [r["run_id"] for r in ranking_rows(trials, "min") if r["role"] == "search"] == ["t0", "t3", "t2", "t1"]
    assert best_index(objectives, [f"t{i}" for i in range(4)], "min") == 0 and "best trial t0 " in verdict(
        trials, "min").line
    # only NaN objectives: no best trial to judge
    nan_only = [_trial("n0", "search", 0, base, objective=math.nan), *trials[4:]]
    assert "no baseline" in verdict(nan_only).line or "best trial" not in verdict(nan_only).line
    assert ranking.finite_objective(math.inf) is None and ranking.finite_objective(0.25) == 0.25


def test_identical_arms_are_said_to_be_identical_not_judged() -> None:
    # every trial scores exactly the same on every problem: before, "cannot be judged without a t-interval"
    base = [0.0, 0.5, 0.5, 1.0]
    trials = [_trial(f"t{i}", "search", 0, base, selection=[0.5, 0.25]) for i in range(4)]
    trials += [_trial(f"b{s}", "baseline", s, base) for s in range(4)]
    trials += [_trial(f"r{s}", "rerun", s, base) for s in range(1, 4)]
    v = verdict(trials)
    assert v.beats is None and "(arms identical)" in v.line and "no difference to judge" in v.line
    assert "all 4 search trials scored identically on every problem" in v.line
    # one re-run differs: an ordinary verdict line again
    trials[-1] = _trial("r3", "rerun", 3, [x + 0.25 for x in base])
    assert "arms identical" not in verdict(trials).line
