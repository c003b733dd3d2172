"""Short, unique labels for legends and bars; horizontal benchmark bars; the Speedup page's ratios."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from ulorl.dashboard import charts, frames
from ulorl.dashboard.store import short_names, trial_label, unique_labels


def test_trial_label_is_role_and_swept_values():
    values = {"algo.mpt.tau": "0.9", "algo.mpt.sigma": "0.0931234"}
    assert trial_label("search", None, "0", values) == "search tau=0.9 sigma=0.0931"
    assert trial_label("rerun", "", "1", values) == "rerun tau=0.9 sigma=0.0931 seed+1"
    assert trial_label("baseline", "masking_off", "1", values) == "baseline masking_off seed+1"
    assert trial_label("reference", "non_segmented", None, values) == "reference non_segmented"


def test_short_names_read_the_swept_keys_from_the_parent():
    df = pd.DataFrame([
        {"run_id": "p", "run_name": "sweep-mpt_threshold", "kind": "sweep", "parent_run_id": None,
         "params.space.algo.mpt.tau": '{"choice": [0.9]}', "params.space.algo.mpt.sigma": '{"uniform": [0.03, 0.15]}'},
        {"run_id": "a", "run_name": "mpt_threshold-8ffbe956 tau=0.9 sigma=0.0931", "kind": "train", "parent_run_id": "p",
         "tags.ulorl.trial_role": "search", "tags.ulorl.seed_offset": "0", "params.algo.mpt.tau": "0.9",
         "params.algo.mpt.sigma": "0.0931234", "variant": None},
        {"run_id": "b", "run_name": "mpt_threshold-9df3c_00003 reference segments=1 mode=off", "kind": "train",
         "parent_run_id": "p", "tags.ulorl.trial_role": "reference", "tags.ulorl.seed_offset": "0",
         "params.algo.mpt.tau": "0.99", "params.algo.mpt.sigma": "0.08", "variant": "non_segmented"},
        {"run_id": "c", "run_name": "quickstart", "kind": "train", "parent_run_id": None},
    ])
    assert short_names(df) == ["sweep-mpt_threshold", "search tau=0.9 sigma=0.0931", "reference non_segmented",
                               "quickstart"]
    # two sweeps' baselines share a short name: the id keeps them apart
    assert unique_labels(["aaaaaaaa1", "bbbbbbbb2"], ["baseline masking_off"] * 2) == [
        "baseline masking_off (aaaaaaaa)", "baseline masking_off (bbbbbbbb)"]


def test_speedups_pair_each_s_with_s1_of_its_batching():
    table = pd.DataFrame({"batching": ["compact", "compact", "static"], "segments": [1, 4, 4], "runs": [1, 7, 1],
                          "median_step_s": [0.6, 0.9, 1.0], "finished_per_s": [1.0, 1.0, 1.0],
                          "trained_per_s": [50.0, 35.0, 20.0]})
    (sp,) = frames.speedups(table)                       # static has no S = 1: no ratio
    assert (sp.segments, sp.batching, sp.runs, sp.reference_runs) == (4, "compact", 7, 1)
    assert sp.step_speedup == pytest.approx(0.6 / 0.9) and sp.throughput_x == pytest.approx(0.7)


def test_benchmark_bars_are_horizontal_with_names_on_hover():
    bench = pd.DataFrame({"label": ["search tau=0.9", "baseline masking_off"], "name": ["long-a", "long-b"],
                          "bench": ["heldout"] * 2, "avg_at_k": [40.0, 30.0], "pass_at_k": [60.0, 50.0],
                          "ci_low": [30.0, 20.0], "ci_high": [50.0, 40.0], "k": [4, 4]})
    spec = charts.benchmark_chart(bench).to_dict()
    bars = spec["layer"][0]
    assert bars["mark"]["type"] == "bar"
    assert bars["encoding"]["y"]["field"] == "label" and bars["encoding"]["x"]["field"] == "avg_at_k"
    assert bars["encoding"]["y"]["sort"] == ["search tau=0.9", "baseline masking_off"]
    assert any(t.get("field") == "name" for t in bars["encoding"]["tooltip"])
    assert spec["height"] >= 40 + 22 * 2


def test_curve_frame_carries_the_full_name_for_hover():
    runs = pd.DataFrame({"run_id": ["a"], "run_name": ["mpt_threshold-8ffbe956 tau=0.9"], "label": ["search tau=0.9"]})
    hist = pd.DataFrame({"run_id": ["a", "a"], "step": [1, 2], "value": [0.1, 0.2], "timestamp": [0, 0]})
    cf = frames.curve_frame(hist, runs)
    assert set(cf["run"]) == {"search tau=0.9"} and set(cf["name"]) == {"mpt_threshold-8ffbe956 tau=0.9"}
    assert not math.isnan(cf["value"].iloc[-1])


def test_benchmarks_default_baseline_is_the_seed_the_search_ran_with():
    from ulorl.dashboard.pages.benchmarks import default_baseline

    runs = pd.DataFrame({"run_id": ["a", "b", "c"], "tags.ulorl.trial_role": ["search", "baseline", "baseline"],
                         "tags.ulorl.seed_offset": ["0", "1", "0"]})
    assert default_baseline(runs, ["a", "b", "c"]) == 3              # [NONE, a, b, c]: c, the seed 0 baseline
    assert default_baseline(runs.drop(columns=["tags.ulorl.seed_offset"]), ["a", "b", "c"]) == 2
    assert default_baseline(runs[["run_id"]], ["a", "b", "c"]) == 0
