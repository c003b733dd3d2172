"""ZeRO-3 gathers the chunked LM head once per pass, not per chunk (real DeepSpeed, 2 gloo ranks).

``ulorl.bench.zero3_gathers`` on this checkout with parameters released after each use: a tied
Qwen3 whose head / embedding weight is the only parameter above ZeRO-3's persistence threshold, one
row of 256 tokens per rank in 8 chunks of 32. Each forward, backward and no-grad pass must gather
that weight exactly once (the chunk loop is one call of the head module), ZeRO-3's parameter trace
must be complete (the root hook runs, so prefetching is on) and overlap_comm on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ulorl.bench.zero3_gathers import add_arguments, run_tree

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # two DeepSpeed ranks: ~30 s idle, minutes on a loaded machine
def test_head_gathered_once_per_pass_with_the_trace_complete(tmp_path):
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args(["--row-tokens", "256", "--chunk-tokens", "32", "--vocab", "4096", "--hidden", "128",
                          "--layers", "1", "--steps", "2", "--warmup", "2", "--release-after-use"])
    res = run_tree(ROOT, tmp_path / "r.json", args)
    assert res["chunks_per_row"] == 8 and res["release_after_use"]
    for step in res["steps"]:
        assert step["forward"]["head_gathers"] == 1, step
        assert step["backward"]["head_gathers"] == 1, step
    assert res["no_grad"]["head_gathers"] == 1
    assert res["trace_complete"] and res["overlap_comm"]
