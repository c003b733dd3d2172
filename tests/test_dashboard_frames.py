"""Pure transforms of the dashboard, on tiny frames with hand-derived expectations."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from ulorl.dashboard import charts, frames


def _runs(rows: list[dict]) -> pd.DataFrame:
    base = {"run_name": None, "experiment": "ulorl", "kind": "train", "status": "FINISHED", "start_time": None}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_ema_matches_hand_values_and_skips_nan():
    np.testing.assert_allclose(frames.ema([1.0, 3.0, 5.0], 0.5), [1.0, 2.0, 3.5])
    np.testing.assert_allclose(frames.ema([1.0, float("nan"), 3.0], 0.5), [1.0, 1.0, 2.0])
    np.testing.assert_allclose(frames.ema([4.0, 2.0], 0.0), [4.0, 2.0])
    with pytest.raises(ValueError, match="smoothing weight"):
        frames.ema([1.0], 1.0)


def test_curve_frame_step_wall_and_smoothing():
    runs = _runs([{"run_id": "a", "run_name": "A", "start_time": pd.Timestamp(1_000, unit="ms", tz="UTC")}])
    hist = pd.DataFrame({"run_id": "a", "step": [2, 1, 3], "value": [3.0, 1.0, 5.0],
                         "timestamp": [3_000, 2_000, 5_000]})
    c = frames.curve_frame(hist, runs, x="step", smoothing=0.5)
    assert list(c["step"]) == [1, 2, 3] and list(c["x"]) == [1.0, 2.0, 3.0]
    assert list(c["raw"]) == [1.0, 3.0, 5.0]
    np.testing.assert_allclose(c["value"], [1.0, 2.0, 3.5])
    assert set(c["run"]) == {"A"}
    # wall-clock from timestamps minus the run's start (1 s): 1, 2, 4 s
    w = frames.curve_frame(hist, runs, x="wall")
    np.testing.assert_allclose(w["x"], [1.0, 2.0, 4.0])
    # wall-clock from the trainer's time/wall_s when given
    wall = pd.DataFrame({"run_id": "a", "step": [1, 2, 3], "value": [10.0, 20.0, 30.0]})
    np.testing.assert_allclose(frames.curve_frame(hist, runs, x="wall", wall=wall)["x"], [10.0, 20.0, 30.0])


def test_group_bands_mean_min_max_per_step():
    runs = _runs([{"run_id": r, "run_name": r, "params.algo.mpt.tau": t} for r, t in
                  (("a", "0.9"), ("b", "0.9"), ("c", "0.99"))])
    curves = pd.DataFrame({
        "run_id": ["a", "a", "b", "b", "c", "c"], "step": [1, 2, 1, 2, 1, 2],
        "x": [1.0, 2.0, 1.0, 2.0, 1.0, 2.0], "value": [1.0, 2.0, 3.0, 4.0, 10.0, 20.0],
    })
    b = frames.group_bands(curves, runs, "algo.mpt.tau").set_index(["group", "step"])
    assert b.loc[("algo.mpt.tau=0.9", 1)][["mean", "min", "max", "n"]].tolist() == [2.0, 1.0, 3.0, 2]
    assert b.loc[("algo.mpt.tau=0.9", 2)][["mean", "min", "max", "n"]].tolist() == [3.0, 2.0, 4.0, 2]
    assert b.loc[("algo.mpt.tau=0.99", 2)][["mean", "min", "max", "n"]].tolist() == [20.0, 20.0, 20.0, 1]


def test_sigma_lines_reads_param_per_run():
    runs = _runs([{"run_id": "a", "run_name": "A", "params.algo.mpt.sigma": "0.2", "params.algo.mpt.mode": "dynamic"},
                  {"run_id": "b", "run_name": "B", "params.algo.mpt.sigma": "0.5", "params.algo.mpt.mode": "off"}])
    s = frames.sigma_lines(runs, ["b"])
    assert s.to_dict("records") == [{"run": "B", "sigma": 0.5, "mask_mode": "off"}]


def test_rollout_stats_and_speedup_relative_to_s1_per_batching():
    # compact: S=1 [2,2,4] s, finished 4/step -> median 2, 12/8 = 1.5/s; S=4 [0.5,0.5,1] s,
    # finished 2,4,6 -> median 0.5, 12/2 = 6/s. static: S=1 median 3 (1/s), S=4 median 1.5 (2/s),
    # two S=4 static seeds with medians 1.5 and 2.5 average to 2.0.
    series = {"c1": ([2, 2, 4], [4, 4, 4]), "c4": ([0.5, 0.5, 1], [2, 4, 6]),
              "s1": ([3, 3, 3], [3, 3, 3]), "s4": ([1.5, 1.5, 1.5], [3, 3, 3]), "s4b": ([2.5, 2.5, 2.5], [3, 3, 3])}
    rows = []
    for rid, (t, f) in series.items():
        for step, (tv, fv) in enumerate(zip(t, f), start=1):
            rows.append({"run_id": rid, "metric": "time/step_s", "step": step, "value": float(tv), "timestamp": 0})
            rows.append({"run_id": rid, "metric": "rollout/finished", "step": step, "value": float(fv), "timestamp": 0})
    stats = frames.rollout_stats(pd.DataFrame(rows)).set_index("run_id")
    assert stats.loc["c1", "median_step_s"] == 2.0 and stats.loc["c1", "finished_per_s"] == 1.5
    assert stats.loc["c4", "median_step_s"] == 0.5 and stats.loc["c4", "finished_per_s"] == 6.0
    assert stats.loc["c4", "steps"] == 3 and stats.loc["c4", "total_s"] == 2.0

    runs = _runs([{"run_id": r, "params.rollout.segments": r[1], "params.rollout.batching":
                   "compact" if r[0] == "c" else "static"} for r in series])
    table = frames.speedup_table(stats.reset_index(), runs).set_index(["batching", "segments"])
    assert table.loc[("compact", 1), "step_speedup"] == 1.0
    assert table.loc[("compact", 4), "step_speedup"] == 4.0            # 2.0 / 0.5
    assert table.loc[("compact", 4), "throughput_x"] == 4.0            # 6.0 / 1.5
    assert table.loc[("static", 4), "runs"] == 2
    assert table.loc[("static", 4), "median_step_s"] == 2.0            # mean of 1.5 and 2.5
    assert table.loc[("static", 4), "step_speedup"] == 1.5             # 3.0 / 2.0
    assert math.isclose(table.loc[("static", 4), "throughput_x"], (3 / 1.5 * 0.5 + 3 / 2.5 * 0.5) / 1.0)


def test_speedup_without_baseline_leaves_relative_columns_empty():
    stats = pd.DataFrame({"run_id": ["a"], "steps": [2], "median_step_s": [1.0], "total_s": [2.0],
                          "finished": [4.0], "finished_per_s": [2.0]})
    runs = _runs([{"run_id": "a", "params.rollout.segments": "4", "params.rollout.batching": "compact"}])
    t = frames.speedup_table(stats, runs)
    assert len(t) == 1 and t["step_speedup"].isna().all() and t["throughput_x"].isna().all()


def test_benchmark_table_and_deltas_against_baseline():
    runs = _runs([
        {"run_id": "b", "run_name": "eval-b", "kind": "eval", "model_label": "base", "tags.ulorl.k": "4",
         "metrics.eval/aime2025/avg_at_k": 0.40, "metrics.eval/aime2025/pass_at_k": 0.60,
         "metrics.eval/aime2025/ci_low": 0.3, "metrics.eval/aime2025/ci_high": 0.5},
        {"run_id": "t", "run_name": "eval-t", "kind": "eval", "model_label": None, "tags.ulorl.k": "4",
         "metrics.eval/aime2025/avg_at_k": 0.55, "metrics.eval/aime2025/pass_at_k": 0.70,
         "metrics.eval/heldout/avg_at_k": 0.9},
        {"run_id": "x", "run_name": "train-x", "kind": "train"},
    ])
    assert frames.benchmarks_in(runs) == ["aime2025", "heldout"]
    table = frames.benchmark_table(runs)
    assert sorted(zip(table["run_id"], table["bench"])) == [("b", "aime2025"), ("t", "aime2025"), ("t", "heldout")]
    assert list(table[table["run_id"] == "b"]["label"]) == ["base"]
    assert list(table[table["run_id"] == "t"]["label"]) == ["eval-t", "eval-t"]   # no label tag -> run name
    d = frames.benchmark_deltas(table, "b").set_index(["run_id", "bench"])
    assert math.isclose(d.loc[("t", "aime2025"), "delta_avg"], 0.15)
    assert math.isclose(d.loc[("t", "aime2025"), "delta_pass"], 0.10)
    assert d.loc[("b", "aime2025"), "delta_avg"] == 0.0
    assert math.isnan(d.loc[("t", "heldout"), "delta_avg"])                     # baseline has no heldout
    assert frames.benchmark_deltas(table, None)["delta_avg"].isna().all()


def test_spearman_hand_values():
    assert math.isclose(frames.spearman([1, 2, 3, 4], [10, 20, 30, 40]), 1.0)
    assert math.isclose(frames.spearman([1, 2, 3], [3, 2, 1]), -1.0)
    # ties: ranks x = [1.5, 1.5, 3.5, 3.5], y = [1, 2, 3, 4] -> 4 / (2 * sqrt(5))
    assert math.isclose(frames.spearman([1, 1, 2, 2], [1, 2, 3, 4]), 4 / (2 * math.sqrt(5)))
    # categories rank by sort order: dynamic=1, off=2, static=3 -> [2, 3, 1] vs [1, 2, 3] -> -0.5
    assert math.isclose(frames.spearman(["off", "static", "dynamic"], [1.0, 2.0, 3.0]), -0.5)
    # numbers logged as strings are compared as numbers ("10" > "9")
    assert math.isclose(frames.spearman(["9", "10", "11"], [1.0, 2.0, 3.0]), 1.0)
    assert math.isnan(frames.spearman([1, 1, 1], [1, 2, 3]))
    assert math.isnan(frames.spearman([1, 2], [1, 2]))


def test_param_importance_sorted_by_abs_rho():
    trials = pd.DataFrame({"params.a": ["1", "2", "3"], "params.b": ["3", "1", "2"], "obj": [0.1, 0.2, 0.3]})
    imp = frames.param_importance(trials, ["b", "a"], "obj")
    assert list(imp["param"]) == ["a", "b"]
    assert math.isclose(imp.loc[0, "spearman"], 1.0) and math.isclose(imp.loc[1, "spearman"], -0.5)


def test_optimization_history_best_so_far():
    trials = pd.DataFrame({"run_id": ["i1", "i2", "i3"], "run_name": ["x", "y", "z"], "obj": [0.3, 0.2, 0.5],
                           "start_time": pd.to_datetime([1, 2, 3], unit="s")})
    h = frames.optimization_history(trials, "obj", "max")
    assert list(h["trial"]) == [1, 2, 3] and list(h["best"]) == [0.3, 0.3, 0.5]
    assert list(frames.optimization_history(trials, "obj", "min")["best"]) == [0.3, 0.2, 0.2]


def test_parallel_frame_scales_axes_to_unit_interval():
    trials = pd.DataFrame({"run_id": ["i1", "i2", "i3"], "run_name": ["r1", "r2", "r3"], "params.n": ["1", "2", "3"], "params.c": ["b", "a", "b"],
                           "params.k": ["5", "5", "5"], "metrics.obj": [0.0, 1.0, 0.5]})
    long = frames.parallel_frame(trials, ["n", "c", "k"], "metrics.obj")
    by = {a: list(g.sort_values("run")["norm"]) for a, g in long.groupby("axis")}
    assert by["n"] == [0.0, 0.5, 1.0]
    assert by["c"] == [1.0, 0.0, 1.0]
    assert by["k"] == [0.5, 0.5, 0.5]
    assert by["obj"] == [0.0, 1.0, 0.5]
    assert list(long.drop_duplicates("axis").sort_values("order")["axis"]) == ["n", "c", "k", "obj"]


def test_filter_runs_and_runs_table():
    runs = _runs([
        {"run_id": "r1", "run_name": "quick-dyn", "kind": "train", "status": "FINISHED",
         "params.rollout.segments": "4", "params.algo.mpt.mode": "dynamic", "metrics.train/reward_mean": 0.5},
        {"run_id": "r2", "run_name": "quick-off", "kind": "train", "status": "FAILED",
         "params.rollout.segments": "1", "params.algo.mpt.mode": "off"},
        {"run_id": "r3", "run_name": "eval-x", "kind": "eval", "status": "FINISHED", "experiment": "other"},
    ])
    assert list(frames.filter_runs(runs, kinds=["train"])["run_id"]) == ["r1", "r2"]
    assert list(frames.filter_runs(runs, statuses=["FAILED"])["run_id"]) == ["r2"]
    assert list(frames.filter_runs(runs, experiments=["other"])["run_id"]) == ["r3"]
    assert list(frames.filter_runs(runs, param="algo.mpt.mode", param_values=["off"])["run_id"]) == ["r2"]
    assert list(frames.filter_runs(runs, text="DYN")["run_id"]) == ["r1"]
    assert len(frames.filter_runs(runs)) == 3
    table = frames.runs_table(runs)
    assert list(table["segments"].iloc[:2]) == [4, 1]                 # params coerced to numbers
    assert list(table["mask_mode"].iloc[:2]) == ["dynamic", "off"]
    assert table.loc[0, "final reward_mean"] == 0.5
    assert table.columns[-1] == "run_id"
    assert frames.varying_params(runs) == ["rollout.segments", "algo.mpt.mode"]


def test_runs_sharing_a_name_get_distinct_labels_everywhere():
    """Runs are identities, names are labels: same-named runs never share a series, bar or path."""
    from ulorl.dashboard.store import unique_labels

    assert unique_labels(["aaaaaaaa11", "bbbbbbbb22", "cccccccc33"], ["q", "q", "solo"]) == \
        ["q (aaaaaaaa)", "q (bbbbbbbb)", "solo"]
    assert unique_labels(["abcdefgh1", "abcdefgh2"], ["q", "q"]) == ["q (abcdefgh1)", "q (abcdefgh2)"]
    runs = pd.DataFrame({"run_id": ["r1", "r2"], "run_name": ["quickstart", "quickstart"], "kind": ["train"] * 2,
                         "start_time": pd.to_datetime([1, 2], unit="s"),
                         "metrics.eval/heldout/avg_at_k": [0.5, 0.5], "params.algo.mpt.tau": ["0.9", "0.9"]})
    hist = pd.DataFrame({"run_id": ["r1", "r1", "r2", "r2"], "step": [1, 2, 1, 2], "value": [1.0, 2.0, 3.0, 4.0],
                         "timestamp": [1, 2, 1, 2]})
    curves = frames.curve_frame(hist, runs)
    assert curves.groupby("run")["run_id"].nunique().max() == 1 and curves["run"].nunique() == 2
    bench = frames.benchmark_table(runs)
    assert bench["label"].is_unique and len(bench) == 2
    long = frames.parallel_frame(runs, ["algo.mpt.tau"], "metrics.eval/heldout/avg_at_k")
    assert long["run_id"].nunique() == 2 and long["run"].nunique() == 2      # tied trials stay two paths
    assert frames.optimization_history(runs, "metrics.eval/heldout/avg_at_k")["run"].is_unique


def test_paired_deltas_against_the_baseline():
    table = pd.DataFrame({"run_id": ["a", "b"], "label": ["a", "b"], "bench": ["heldout"] * 2,
                          "avg_at_k": [0.75, 0.5]})
    scores = {("a", "heldout"): {"p1": 1.0, "p2": 0.5, "p3": 0.0},
              ("b", "heldout"): {"p1": 0.5, "p2": 0.5, "p4": 1.0}}
    out = frames.paired_deltas(table, "b", scores).set_index("run_id")
    assert out.loc["a", "paired_problems"] == 2                               # p1, p2 only
    assert out.loc["a", "diff"] == pytest.approx(0.25)                         # (0.5 + 0) / 2
    assert 0.0 <= out.loc["a", "diff_low"] <= 0.25 <= out.loc["a", "diff_high"] <= 0.5
    assert pd.isna(out.loc["b", "diff"])


def test_rollout_stats_steady_window_skips_the_first_s_steps():
    rows = [{"run_id": "a", "metric": m, "step": st, "value": v, "timestamp": 0}
            for m, vals in (("time/step_s", [0.1, 0.1, 1.0, 3.0]), ("rollout/finished", [0, 0, 4, 8]),
                            ("train/samples", [0, 2, 6, 10])) for st, v in enumerate(vals, 1)]
    steady = frames.rollout_stats(pd.DataFrame(rows), {"a": 2}).iloc[0]
    assert steady["steps"] == 2 and steady["first_step"] == 3 and steady["median_step_s"] == 2.0
    assert steady["finished_per_s"] == 12 / 4.0 and steady["trained_per_s"] == 16 / 4.0
    everything = frames.rollout_stats(pd.DataFrame(rows)).iloc[0]
    assert everything["steps"] == 4 and everything["trained_per_s"] == 18 / 4.2


def test_bench_series_splits_a_benchmark_scored_under_two_extraction_modes():
    table = pd.DataFrame({"run_id": ["a", "b", "c", "d"], "label": list("abcd"),
                          "bench": ["heldout", "heldout", "aime2025", "aime2025"],
                          "extraction": ["boxed", "boxed_or_final", "boxed", "boxed"],
                          "avg_at_k": [0.5, 0.6, 0.1, 0.2], "ci_low": [0.4, 0.5, 0.0, 0.1], "ci_high": [0.6, 0.7, 0.2, 0.3]})
    assert list(frames.bench_series(table)) == ["heldout [boxed]", "heldout [boxed_or_final]", "aime2025", "aime2025"]
    spec = charts.benchmark_chart(table).to_dict()
    series = {row["series"] for row in next(iter(spec["datasets"].values()))}
    assert series == {"heldout [boxed]", "heldout [boxed_or_final]", "aime2025"}
