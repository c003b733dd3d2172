"""``ulorl-train --dry-run`` plans paper-profile runs on a machine without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ulorl.cli.train import main
from ulorl.config import load_experiment
from ulorl.cli.plan import plan_dict

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


@pytest.mark.parametrize("path", sorted((ROOT / "experiments" / "paper").glob("*.yaml")), ids=lambda p: p.name)
def test_paper_profiles_trainer_fits(path):
    mem = plan_dict(load_experiment(path))["memory_estimate_gib"]
    assert mem["trainer_fits"] is True
    assert mem["trainer_peak_per_gpu"] <= 0.9 * mem["trainer_gpu_memory"]


def test_trainer_memory_terms_by_hand():
    """Qwen3-4B, 128k row, ZeRO-3 over 4 bf16 ranks: each term from the formulas in plan.py."""
    cfg = load_experiment(ROOT / "experiments" / "paper" / "qwen3_4b_128k.yaml")
    gib = 1024**3
    mem = plan_dict(cfg)["memory_estimate_gib"]
    tokens = 131072 + 1024
    assert mem["trainer_row_tokens_per_gpu"] == tokens
    assert mem["trainer_weights_per_gpu"] == pytest.approx(4.02e9 * 2 / 4 / gib, abs=0.05)
    assert mem["trainer_optimizer_per_gpu"] == pytest.approx(4.02e9 * 12 / 4 / gib, abs=0.05)
    assert mem["trainer_activations_no_checkpointing_per_gpu"] == pytest.approx(34 * 2560 * 36 * tokens / gib, abs=0.05)
    ckpt = (2 * 2560 * 36 + 34 * 2560) * tokens / gib
    assert mem["trainer_activations_checkpointing_per_gpu"] == pytest.approx(ckpt, abs=0.05)
    assert mem["trainer_activations_per_gpu"] == mem["trainer_activations_checkpointing_per_gpu"]  # profile: on
    off = plan_dict(cfg.model_copy(update={"train": cfg.train.model_copy(update={"gradient_checkpointing": False})}))
    assert off["memory_estimate_gib"]["trainer_fits"] is False  # ~385 GiB of activations
    sp2 = cfg.model_copy(update={"train": cfg.train.model_copy(update={"sequence_parallel": 2})})
    half = plan_dict(sp2)["memory_estimate_gib"]
    assert half["trainer_activations_per_gpu"] == pytest.approx(mem["trainer_activations_per_gpu"] / 2, abs=0.1)
