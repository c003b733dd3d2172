"""``ulorl-bench memory``: JSON shape, fresh subprocess per measurement, refusal of the full path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ulorl.bench.memory import measure_micro_step, predicted_full_peak_mb, summarize

ROOT = Path(__file__).resolve().parents[1]
SHAPE = ["--vocab", "300", "--hidden", "32", "--layers", "1", "--threads", "1"]


@pytest.mark.slow  # a fresh interpreter importing transformers: ~10 s on an idle 2-core machine
def test_cli_json_runs_chunked_in_a_subprocess_and_refuses_full_over_the_limit():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "platform")}
    proc = subprocess.run([sys.executable, "-m", "ulorl.cli.bench", "memory", "--seq-lens", "96", *SHAPE,
                           "--memory-limit-mb", "1", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    chunked, full = out["results"]
    assert chunked["path"] == "chunked" and chunked["seq_len"] == 96
    assert chunked["peak_rss_mb"] > 50 and chunked["seconds"] > 0
    assert full["path"] == "full" and full["peak_rss_mb"] is None and "predicted peak" in full["refused"]
    # the measurement ran with glibc's mmap threshold pinned: its peak is live memory, not heap retention
    assert out["malloc_mmap_threshold_kb"] == 64 and chunked["malloc_mmap_threshold"] == str(64 << 10)


def test_measurements_pin_glibcs_mmap_threshold_unless_told_not_to(monkeypatch):
    from ulorl.bench.memory import one_env

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "7")
    assert one_env(64)["MALLOC_MMAP_THRESHOLD_"] == str(64 << 10)
    assert "MALLOC_MMAP_THRESHOLD_" not in one_env(0)


def test_both_paths_give_the_same_loss_in_process():
    kw = dict(vocab=300, hidden=32, layers=1, model=None, device="cpu")
    a = measure_micro_step(80, "chunked", **kw)
    b = measure_micro_step(80, "full", **kw)
    assert set(a) >= {"seq_len", "path", "peak_rss_mb", "seconds"}
    assert abs(a["loss"] - b["loss"]) < 1e-5


def test_prediction_and_summary():
    # full path: ~12 bytes per token per vocabulary entry dominate
    assert predicted_full_peak_mb(4096, 151936, 128, 4) > 4096 * 12 * 151936 / 2**20
    res = [{"seq_len": 1000, "path": "chunked", "peak_rss_mb": 100.0, "seconds": 1.0},
           {"seq_len": 3000, "path": "chunked", "peak_rss_mb": 120.0, "seconds": 2.0},
           {"seq_len": 1000, "path": "full", "peak_rss_mb": 900.0, "seconds": 1.0}]
    s = summarize(res)
    assert s["chunked_kb_per_token"] == round(20 * 1024 / 2000, 2)
    assert s["time_ratio_chunked_over_full"] == {"1000": 1.0}
