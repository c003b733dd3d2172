"""ulorl-bench overlap's arithmetic on hand-made step metrics (the runs themselves: platform/ulorl/docs/performance.md)."""

from __future__ import annotations

import pytest

from ulorl.bench.overlap import cell_summary, format_report


def _m(wall: float, cpu: float, trained: float, both: float = 0.0) -> dict[str, float]:
    return {"time/step_s": wall, "time/step_cpu_s": cpu, "train/samples": trained, "overlap/both_s": both,
            "overlap/trainer_idle_s": 0.5}


def test_cell_summary_leaves_out_the_warm_up():
    steps = [_m(9.0, 9.0, 0.0), _m(9.0, 9.0, 0.0), _m(1.0, 2.0, 8.0, 0.2), _m(3.0, 4.0, 16.0, 0.4),
             _m(2.0, 3.0, 8.0, 0.6)]
    c = cell_summary(steps, 2)
    assert c["steps"] == 3 and c["step_s"] == 2.0 and c["cpu_s"] == 3.0
    assert c["trained_per_s"] == pytest.approx(32 / 6)
    assert c["both_s"] == pytest.approx(0.4) and c["trainer_idle_s"] == pytest.approx(0.5)


def test_report_ratios():
    cells = [{"schedule": sc, "segments": s, "steps": 4.0, "step_s": st, "cpu_s": 1.0, "trained_per_s": tr,
              "both_s": 0.0, "trainer_idle_s": 0.0}
             for sc, s, st, tr in (("sync", 1, 2.0, 8.0), ("overlap", 1, 1.0, 12.0), ("sync", 4, 4.0, 4.0),
                                   ("overlap", 4, 2.0, 0.0))]
    text = format_report({"steps": 6, "cells": cells, "cpus": 2, "loadavg_start": [1.0, 1.0, 1.0],
                          "loadavg_end": [2.0, 1.0, 1.0], "wall_s": 10.0})
    assert "S=1: overlap vs sync: time/step 2.00x, trained samples/s 1.50x" in text
    assert "S=4: overlap vs sync: time/step 2.00x, trained samples/s 0.00x" in text
    assert "overlap: S=4 vs S=1: time/step 0.50x, trained samples/s 0.00x" in text
    assert "sync: S=4 vs S=1: time/step 0.50x, trained samples/s 0.50x" in text
    assert "load average (1, 5, 15 min) start [1.0, 1.0, 1.0] end [2.0, 1.0, 1.0]" in text
