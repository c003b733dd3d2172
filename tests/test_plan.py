"""``ulorl-train --dry-run`` plans paper-profile runs on a machine without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ulorl.cli.train import main
from ulorl.config import load_experiment
from ulorl.train.plan import plan_dict

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((ROOT / "experiments" / "paper").glob("*.yaml")), ids=lambda p: p.name)
def test_paper_profiles_dry_run_exit_zero(path, capsys):
    assert main([str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    plan = json.loads(out.split("# plan\n", 1)[1])
    assert plan["segment_len"] * plan["segments"] == plan["max_response_len"]
    assert plan["memory_estimate_gib"]["params_b"] > 1
    assert plan["processes"]["trainer_workers"] >= 1


def test_plan_numbers_for_30b():
    cfg = load_experiment(ROOT / "experiments" / "paper" / "qwen3_30b_a3b_128k.yaml")
    plan = plan_dict(cfg)
    mem = plan["memory_estimate_gib"]
    # KV per token = 2 (K,V) x 48 layers x 4 kv heads x 128 dims x 2 bytes = 98,304 B = 96 KiB
    assert mem["kv_cache_per_token_kib"] == 96.0
    # one full 128k sequence = 96 KiB x 131072 = 12 GiB
    assert mem["kv_cache_one_full_sequence"] == 12.0
    # AdamW state 12 B/param over 8 ZeRO-3 ranks: 30.5e9 x 12 / 8 / 2^30 = 42.6 GiB
    assert mem["optimizer_state_per_trainer_gpu"] == pytest.approx(42.6, abs=0.1)
    sim = plan["simulated_step_time_s"]
    assert sim["S=8"]["step_time_s"] < sim["S=1"]["step_time_s"]
    assert plan["gpus_per_role"] == {"trainer": 8.0, "rollout": 8.0}
