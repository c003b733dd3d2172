"""Every Altair builder yields a Vega-Lite spec that passes Altair's schema validation."""

from __future__ import annotations

import pandas as pd

from ulorl.dashboard import charts, frames, paper_ref


def _spec(chart) -> dict:
    return chart.to_dict()  # validates against the Vega-Lite schema


def test_curve_and_band_charts_validate_with_log_and_sigma():
    curves = pd.DataFrame({"run_id": ["a", "a"], "run": ["A", "A"], "step": [1, 2], "x": [1.0, 2.0],
                           "raw": [0.3, 0.2], "value": [0.3, 0.25]})
    sigma = pd.DataFrame({"run": ["A"], "sigma": [0.2], "mask_mode": ["dynamic"]})
    spec = _spec(charts.curves_chart(curves, "train/entropy", log=True, sigma=sigma))
    assert len(spec["layer"]) == 2 and spec["layer"][1]["mark"]["type"] == "rule"
    assert spec["layer"][0]["encoding"]["y"]["scale"]["type"] == "log"
    runs = pd.DataFrame({"run_id": ["a"], "params.algo.mpt.mode": ["dynamic"]})
    bands = frames.group_bands(curves, runs, "algo.mpt.mode")
    spec = _spec(charts.bands_chart(bands, "train/entropy", x="wall", sigma=sigma))
    assert [layer["mark"]["type"] for layer in spec["layer"]] == ["area", "line", "rule"]
    _spec(charts.small_multiples(curves.assign(metric="pool/unfinished")))


def test_other_charts_validate():
    speed = pd.DataFrame({"batching": ["compact"], "segments": [1], "runs": [1], "median_step_s": [1.0],
                          "finished_per_s": [2.0], "step_speedup": [1.0], "throughput_x": [1.0]})
    _spec(charts.speedup_chart(speed, "step_speedup", "x"))
    _spec(charts.paper_table1_chart(paper_ref.table1()))
    bench = pd.DataFrame({"label": ["a"], "bench": ["aime2025"], "avg_at_k": [40.0], "pass_at_k": [60.0],
                          "ci_low": [30.0], "ci_high": [50.0], "k": [4]})
    assert len(_spec(charts.benchmark_chart(bench))["layer"]) == 2
    trials = pd.DataFrame({"run_id": ["i1", "i2", "i3"], "run_name": ["r1", "r2", "r3"], "params.n": ["1", "2", "3"], "metrics.o": [0.1, 0.3, 0.2],
                           "start_time": pd.to_datetime([1, 2, 3], unit="s")})
    _spec(charts.parallel_chart(frames.parallel_frame(trials, ["n"], "metrics.o"), "o"))
    _spec(charts.importance_chart(frames.param_importance(trials, ["n"], "metrics.o")))
    _spec(charts.history_chart(frames.optimization_history(trials, "metrics.o"), "o"))


def test_paper_tables_from_report_module():
    assert paper_ref.table1()["speedup"].tolist() == [1.0, 1.6, 2.06]
    t2 = paper_ref.table2().set_index("model")
    assert t2.loc["UloRL-A3B-w/o-DMMPTs", ["AIME-2025", "BeyondAIME", "AVG"]].tolist() == [78.6, 57.1, 67.9]
    t3 = paper_ref.table3().set_index("model")
    assert t3.loc["UloRL-A3B-64k", "segments"] == 4
