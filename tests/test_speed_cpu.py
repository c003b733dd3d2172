"""A fair speed figure on a shared machine: CPU seconds per step beside wall time, and the load each run
ran under (ulorl.report.speed, the trainer's time/step_cpu_s, time/eval_cpu_s and sys/load1); the real run
also logs the staleness of its updates (ulorl.train.staleness)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from ulorl.config import load_experiment
from ulorl.dashboard import frames
from ulorl.dashboard.pages.speedup import ratio_text
from ulorl.report import speed
from ulorl.tracking import schema
from ulorl.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def test_run_speed_reads_cpu_seconds_and_load_by_the_same_window_rule():
    # S = 2: steps 3..5 stay; step 5 evaluated for 3.0 s wall / 2.5 CPU s
    step_s = {1: 0.1, 2: 0.2, 3: 1.0, 4: 2.0, 5: 4.5}
    cpu_s = {1: 0.1, 2: 0.3, 3: 1.6, 4: 1.8, 5: 4.2}
    eval_cpu = {5: 2.5}
    load = {1: 9.0, 2: 9.0, 3: 2.0, 4: 3.0, 5: 4.0}
    trained = {3: 16, 4: 16, 5: 13}
    st = speed.run_speed(step_s, 2, trained=trained, eval_s={5: 3.0}, step_cpu_s=cpu_s, eval_cpu_s=eval_cpu,
                         load=load)
    assert st is not None
    assert st.median_step_cpu_s == pytest.approx(1.7)      # median of 1.6, 1.8, 4.2 - 2.5 = 1.7
    assert st.trained_per_cpu_s == pytest.approx(45 / 5.1)  # 45 samples in 1.6 + 1.8 + 1.7 CPU s
    assert st.load == pytest.approx(3.0)                   # mean of 2, 3, 4 (warm-up's 9 left out)
    # a window step without CPU seconds (a run from before the metric): no CPU figure at all
    old = speed.run_speed(step_s, 2, step_cpu_s={3: 1.0, 4: 1.0})
    assert old is not None and math.isnan(old.median_step_cpu_s) and math.isnan(old.load)


def _run(wall: float, cpu: float, load: float, trained_per_s: float = math.nan,
         trained_per_cpu_s: float = math.nan) -> speed.RunSpeed:
    return speed.RunSpeed(steps=4, first_step=5, median_step_s=wall, total_s=4 * wall, finished=0.0,
                          trained_per_s=trained_per_s, finished_per_s=math.nan, median_step_cpu_s=cpu,
                          trained_per_cpu_s=trained_per_cpu_s, load=load)


def test_loaded_s4_against_an_idle_reference_shows_the_cpu_figure():
    # the case: S = 4 trials under load 7-8 (wall inflated 4x), the S = 1 reference alone later
    s4 = [_run(2.0, 1.00, 7.0, 10.0, 20.0), _run(2.4, 1.10, 8.0, 8.0, 19.0), _run(2.2, 1.05, 7.5, 9.0, 21.0)]
    s1 = [_run(0.55, 1.10, 1.0, 36.0, 18.0)]
    sp = speed.speedup(s1, s4, segments=4, batching="compact")
    assert sp.step_speedup == pytest.approx(0.55 / 2.2)     # 0.25x: moments compared, not schedules
    assert sp.cpu_step_speedup == pytest.approx(1.10 / 1.05)
    assert sp.cpu_throughput_x == pytest.approx(20.0 / 18.0)
    assert sp.load == pytest.approx(7.5) and sp.reference_load == pytest.approx(1.0)
    assert sp.shown == "cpu" and sp.shown_step_speedup == pytest.approx(1.10 / 1.05)
    line = speed.speedup_line(sp)
    assert "shown: CPU seconds" in line and "CPU s/step 1.050 vs 1.100 = 1.05x" in line
    assert "wall time/step 2.200 s vs 0.550 s = 0.25x" in line and "under load 7.5 vs 1.0" in line
    assert line.index("CPU s/step") < line.index("wall time/step")
    # the shown figure is above 1: no "below 1x" note although the wall ratio is 0.25x
    assert speed.below_one_note(sp) is None
    text = ratio_text(sp, "steady")
    assert "shown: CPU seconds" in text and "**1.05x** CPU seconds per step" in text and "load 7.5 vs 1.0" in text


def test_without_cpu_seconds_on_one_side_the_wall_figure_is_shown_and_said():
    sp = speed.speedup([_run(0.5, math.nan, 1.0)], [_run(1.0, 0.9, 7.0)], segments=4, batching="compact")
    assert sp.shown == "wall" and math.isnan(sp.cpu_step_speedup)
    line = speed.speedup_line(sp)
    assert "shown: wall time" in line and "= 0.50x" in line and "CPU s/step" not in line
    assert "load 7.0 vs 1.0" in line
    assert speed.below_one_note(sp) is not None
    assert "**0.50x** wall time per step" in ratio_text(sp, "steady")


def test_speedup_table_carries_cpu_ratios_and_load():
    runs = pd.DataFrame({"run_id": ["a", "b"], frames.param_col("rollout.segments"): ["1", "4"],
                         frames.param_col("rollout.batching"): ["compact", "compact"]})
    rows = []
    for rid, wall, cpu, load in (("a", 0.5, 1.2, 1.0), ("b", 2.0, 1.0, 8.0)):
        for step in range(1, 7):
            for key, v in ((speed.STEP_TIME, wall), (speed.STEP_CPU, cpu), (speed.LOAD, load),
                           (speed.TRAINED, 8.0)):
                rows.append({"run_id": rid, "metric": key, "step": step, "value": v, "timestamp": step})
    stats = frames.rollout_stats(pd.DataFrame(rows), {"a": 1, "b": 4})
    table = frames.speedup_table(stats, runs).set_index("segments")
    assert table.loc[4, "step_speedup"] == pytest.approx(0.25)
    assert table.loc[4, "cpu_speedup"] == pytest.approx(1.2)
    assert table.loc[4, "trained_cpu_x"] == pytest.approx((8 / 1.0) / (8 / 1.2))
    assert table.loc[4, "load"] == pytest.approx(8.0) and table.loc[1, "load"] == pytest.approx(1.0)
    (sp,) = frames.speedups(table.reset_index())
    assert sp.shown == "cpu" and sp.cpu_step_speedup == pytest.approx(1.2) and sp.reference_load == 1.0


def test_a_real_run_logs_cpu_seconds_and_load_in_mlflow(tmp_path):
    cfg = load_experiment(ROOT / "experiments" / "quickstart.yaml", [
        "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_response_len=32", "rollout.segments=2",
        "data.task.num_train=50", "train.threads=1", "train.max_steps=2", "train.checkpoint_every=2",
        "eval.every=2", "eval.k=1", "eval.num_problems=2", "eval.max_new_tokens=16", "eval.final.k=0",
        "tracking.sample_every=100", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
        f"train.output_dir={tmp_path}/out",
    ])
    res = Trainer(cfg, progress=False).run()
    client = MlflowClient(res.tracking_uri)

    def hist(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(res.run_id, key)}

    cpu, wall, load, ev_cpu = (hist(k) for k in (schema.STEP_CPU_METRIC, "time/step_s", schema.LOAD_METRIC,
                                                  schema.EVAL_CPU_METRIC))
    assert sorted(cpu) == sorted(wall) == sorted(load) == [1, 2]
    assert all(v > 0 for v in cpu.values()) and all(v >= 0 for v in load.values())
    assert sorted(ev_cpu) == [2] and 0 < ev_cpu[2] < cpu[2]     # the evaluation ran inside step 2
    # the staleness of each update's samples (ulorl.train.staleness), logged at the steps that released groups
    released = hist("rollout/released_groups")
    lag0 = hist("staleness/tokens_lag0")
    assert lag0 and set(lag0) == {k for k, v in released.items() if v > 0} and all(0 <= v <= 1 for v in lag0.values())
    st = speed.run_speed(wall, 1, step_cpu_s=cpu, eval_cpu_s=ev_cpu, load=load)
    assert st is not None and st.median_step_cpu_s > 0 and math.isfinite(st.load)


def test_overlapped_runs_get_their_own_rows_beside_the_synchronous_ones():
    runs = pd.DataFrame({"run_id": ["a", "b", "c", "d"],
                         frames.param_col("rollout.segments"): ["1", "4", "1", "4"],
                         frames.param_col("rollout.batching"): ["compact"] * 4,
                         frames.param_col("rollout.schedule"): ["sync", "sync", "overlap", None]})
    rows = [{"run_id": rid, "metric": speed.STEP_TIME, "step": st, "value": v, "timestamp": st}
            for rid, v in (("a", 1.0), ("b", 2.0), ("c", 0.5), ("d", 4.0)) for st in range(1, 7)]
    table = frames.speedup_table(frames.rollout_stats(pd.DataFrame(rows)), runs).set_index(["batching", "segments"])
    assert table.loc[("compact + overlap", 1), "median_step_s"] == 0.5
    assert table.loc[("compact", 4), "runs"] == 2                     # no schedule logged: synchronous
    assert table.loc[("compact", 4), "step_speedup"] == pytest.approx(1.0 / 3.0)   # median of 2 and 4 = 3
