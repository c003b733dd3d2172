"""Launches of one sweep are pooled only when a later one adds seeds; a seed run twice never lets the
later run replace the first (ulorl.report.claims.sweep_groups / by_seed), on hand-made RunInfo records."""

from __future__ import annotations

from ulorl.report import claims as C
from ulorl.report.store import RunInfo
from ulorl.tracking import schema


def _run(run_id: str, parent: str, mode: str, seed: int, start: int, lr: str = "0.0001") -> RunInfo:
    return RunInfo(run_id=run_id, experiment_id="1", name=run_id, status="FINISHED", start_time=start,
                   tags={schema.SWEEP_TAG: "choice_mpt_mode", schema.PARENT_TAG: parent},
                   params={"algo.mpt.mode": mode, "train.lr": lr, "data.seed": str(seed), "rollout.seed": str(seed),
                           "train.seed": str(seed)})


def _launch(parent: str, seeds: range, start: int) -> list[RunInfo]:
    return [_run(f"{parent}-{mode}-{s}", parent, mode, s, start + 10 * s + i)
            for s in seeds for i, mode in enumerate(("off", "static"))]


def test_a_later_launch_that_adds_seeds_is_pooled_and_named() -> None:
    runs = _launch("aaaaaaaa11", range(0, 3), 1000) + _launch("bbbbbbbb22", range(3, 6), 5000)
    groups = C.sweep_groups(runs)
    assert list(groups) == [("choice_mpt_mode", "aaaaaaaa+bbbbbbbb")] and len(groups[next(iter(groups))]) == 12


def test_a_later_launch_that_reruns_seeds_is_kept_apart() -> None:
    # before: pooled into one group, where by_seed let the later runs of seeds 1-2 replace the first ones
    runs = _launch("aaaaaaaa11", range(0, 3), 1000) + _launch("bbbbbbbb22", range(1, 5), 5000)
    groups = C.sweep_groups(runs)
    assert sorted(groups) == [("choice_mpt_mode", "aaaaaaaa"), ("choice_mpt_mode", "bbbbbbbb")]
    assert {r.parent_id for r in groups[("choice_mpt_mode", "bbbbbbbb")]} == {"bbbbbbbb22"}


def test_a_seed_run_twice_keeps_the_first_run_and_says_so() -> None:
    first, again = _run("first", "p", "off", 3, 1000), _run("again", "p", "off", 3, 2000)
    kept, notes = C.by_seed([again, first, _run("other", "p", "off", 4, 1500)])
    # before: the later run replaced the first
    assert kept[("3", "3", "3")].run_id == "first" and len(kept) == 2
    assert notes == ["duplicate seed 3/3/3: run again left out, the first started first counts (a later run of a "
                     "seed never replaces it)"]
