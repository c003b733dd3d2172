"""The steady-window speed rule (ulorl.report.speed) on hand-made step series."""

from __future__ import annotations

import math

import pytest

from ulorl.report import speed


def test_steady_window_keeps_the_steps_after_the_first_s():
    assert speed.steady_window([1, 2, 3], [9, 1, 2], 1) == [(2, 1), (3, 2)]
    assert speed.steady_window([1, 2, 3, 4, 5], [9] * 5, 4) == [(5, 9)]
    assert speed.steady_window([1, 2], [1, 1], 4) == []


def test_run_speed_leaves_out_the_warm_up_and_the_eval_time():
    # S = 2: steps 3..5 stay; step 5 had a 3 s evaluation -> step times 1.0, 2.0, 4.5 - 3.0 = 1.5
    step_s = {1: 0.1, 2: 0.2, 3: 1.0, 4: 2.0, 5: 4.5}
    eval_s = {5: 3.0}
    trained = {1: 0, 2: 8, 3: 16, 4: 16, 5: 13}
    finished = {3: 10, 4: 12, 5: 14}
    st = speed.run_speed(step_s, 2, trained=trained, finished=finished, eval_s=eval_s)
    assert st is not None
    assert st.steps == 3 and st.first_step == 3
    assert st.median_step_s == pytest.approx(1.5)          # median of 1.0, 2.0, 1.5
    assert st.total_s == pytest.approx(4.5)
    assert st.trained_per_s == pytest.approx(45 / 4.5)     # 16 + 16 + 13 samples in 4.5 s
    assert st.finished_per_s == pytest.approx(36 / 4.5) and st.finished == 36


def test_run_speed_without_a_window_or_rates():
    assert speed.run_speed({1: 1.0, 2: 1.0}, 4) is None
    st = speed.run_speed({1: 2.0, 2: 4.0}, 0)
    assert st is not None and st.median_step_s == 3.0
    assert math.isnan(st.trained_per_s) and math.isnan(st.finished_per_s)


def _run(step: float, trained: float) -> speed.RunSpeed:
    return speed.RunSpeed(steps=4, first_step=5, median_step_s=step, total_s=4 * step, finished=0.0,
                          trained_per_s=trained, finished_per_s=math.nan)


def test_speedup_is_the_ratio_of_medians_over_runs():
    s4 = [_run(0.8, 40.0), _run(1.0, 30.0), _run(0.9, 35.0)]     # medians 0.9 s, 35/s
    s1 = [_run(0.6, 50.0)]
    sp = speed.speedup(s1, s4, segments=4, batching="compact")
    assert sp.step_s == pytest.approx(0.9) and sp.reference_step_s == pytest.approx(0.6)
    assert sp.step_speedup == pytest.approx(0.6 / 0.9)
    assert sp.throughput_x == pytest.approx(35.0 / 50.0)
    line = speed.speedup_line(sp)
    assert line.startswith("speedup S=4 vs S=1 (compact batching") and "= 0.67x" in line and "= 0.70x" in line
    assert "median over 3 run(s) vs 1" in line
    note = speed.below_one_note(sp)
    assert note is not None and "compaction on a CPU" in note and "ulorl-sim paper" in note


def test_no_below_one_note_when_segments_win():
    sp = speed.speedup([_run(1.0, 20.0)], [_run(0.5, 40.0)], segments=4, batching="static")
    assert sp.step_speedup == pytest.approx(2.0) and sp.throughput_x == pytest.approx(2.0)
    assert speed.below_one_note(sp) is None
