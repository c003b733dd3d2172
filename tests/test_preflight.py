"""The dry-run's preflight (ulorl.scale.preflight): vLLM's KV admission, the trainer, a colocated engine's
wake budget, host memory while loading, /dev/shm; arithmetic on tiny numbers derived by hand, the paper
profiles on the cards they name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ulorl.config import load_experiment
from ulorl.model_shapes import KNOWN_SHAPES, ModelShape, model_shape
from ulorl.rollout.colocate import colocated_utilization, pending_adam_bytes, trainer_steady_bytes
from ulorl.scale import preflight as pf

ROOT = Path(__file__).resolve().parents[1]
PAPER = sorted((ROOT / "experiments" / "paper").glob("*.yaml"))
GIB = 1024**3

# layers 2, hidden 8, 2 heads, 1 KV head of 4, vocab 10, MLP 16, untied
TINY = ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, vocab=10, intermediate=16)


def test_tiny_shape_params_by_hand():
    # per layer: q,k,v 8 x 4 x (2 + 2) = 128, o 2 x 4 x 8 = 64, MLP 3 x 8 x 16 = 384, norms 2 x 8 + 2 x 4 = 24
    # -> 600; x 2 layers = 1200; embedding + LM head 2 x 10 x 8 = 160; final norm 8
    assert TINY.params == 1368
    assert TINY.kv_bytes_per_token(1) == 2 * 1 * 4 * 2 * 2 == 32
    assert TINY.kv_bytes_per_token(2) == 32       # one KV head: replicated, not split, over TP 2


def test_qwen3_shapes_match_the_model_cards():
    assert round(KNOWN_SHAPES["Qwen/Qwen3-4B"].params / 1e9, 2) == 4.02
    assert round(KNOWN_SHAPES["Qwen/Qwen3-8B"].params / 1e9, 2) == 8.19
    assert round(KNOWN_SHAPES["Qwen/Qwen3-30B-A3B"].params / 1e9, 1) == 30.5
    # the 30B embedding is the largest streamed tensor: 151,936 x 2,048 x 2 bytes = 622 MB
    assert KNOWN_SHAPES["Qwen/Qwen3-30B-A3B"].largest_tensor_params * 2 == 622_329_856


def test_issue_numbers_30b_a3b_kv_cache():
    s = KNOWN_SHAPES["Qwen/Qwen3-30B-A3B"]
    assert s.kv_bytes_per_token(1) == 48 * 4 * 128 * 2 * 2 == 96 * 1024
    need = pf.kv_cache_bytes_needed(s, 135168, tensor_parallel=1)
    assert need == 8448 * 16 * 98304                     # 135,168 / 16 blocks
    assert round(need / GIB, 3) == 12.375
    assert pf.kv_cache_bytes_needed(s, 135168, tensor_parallel=2) == need // 2
    assert s.kv_bytes_per_token(8) == 48 * 1 * 128 * 2 * 2   # 4 KV heads over 8 ranks: one each


def test_engine_kv_check_tiny_numbers():
    # requested ceil(10000 x 0.5) = 5000; weights 1368 x 2 = 2736; allowance 1000; null block 16 x 32 = 512
    assert pf.kv_cache_bytes_available(TINY, 10000, 0.5, 1, overhead_bytes=1000) == 752
    # 17 tokens -> 2 blocks x 512 = 1024 > 752: refused
    c = pf.engine_kv_check(TINY, total_bytes=10000, utilization=0.5, tensor_parallel=1, max_model_len=17,
                           gpus_per_node=8, engines=2, overhead_bytes=1000)
    assert not c.ok
    # TP 2: weights 1368, available 5000 - 1368 - 1000 - 512 = 2120 >= 1024; the same 2 engine GPUs = 1 engine
    assert "resources.gpus_per_engine=2 with resources.rollout_engines=1" in c.fix
    # utilization: (1024 + 2736 + 1000 + 512) / 10000 = 0.5272 -> 0.53
    assert "rollout.vllm_gpu_memory_utilization=0.53" in c.fix
    # 752 // 512 = 1 block -> 16 tokens
    assert "rollout.engine_max_model_len=16" in c.fix
    ok = pf.engine_kv_check(TINY, total_bytes=10000, utilization=0.53, tensor_parallel=1, max_model_len=17,
                            gpus_per_node=8, engines=2, overhead_bytes=1000)
    assert ok.ok and ok.fix is None


def test_engine_kv_check_30b_tp1_fails_on_80_passes_on_141():
    s = KNOWN_SHAPES["Qwen/Qwen3-30B-A3B"]
    kw = dict(utilization=0.85, tensor_parallel=1, max_model_len=135168, gpus_per_node=8, engines=8)
    on80 = pf.engine_kv_check(s, total_bytes=pf.card_total_bytes(80), **kw)
    assert not on80.ok and "resources.gpus_per_engine=2 with resources.rollout_engines=4" in on80.fix
    assert pf.engine_kv_check(s, total_bytes=pf.card_total_bytes(141), **kw).ok


def test_trainer_check_names_the_sequence_parallel_that_fits():
    peaks = {1: 96.0, 2: 75.0, 4: 70.0, 8: 60.0}
    c = pf.trainer_check(peaks.__getitem__, sequence_parallel=1, gpu_memory_gib=80, trainer_workers=8)
    assert not c.ok and c.fix.startswith("train.sequence_parallel=4")     # 0.9 x 80 = 72: 2 is 75, 4 is 70
    assert pf.trainer_check(peaks.__getitem__, sequence_parallel=1, gpu_memory_gib=141, trainer_workers=8).ok


def test_colocated_wake_budget_counts_the_steady_state():
    # want 500 + steady 400 + 2 x 30 = 960 <= 1000
    assert pf.colocated_wake_check(total_bytes=1000, utilization=0.5, steady_bytes=400, bucket_bytes=30).ok
    c = pf.colocated_wake_check(total_bytes=1000, utilization=0.5, steady_bytes=450, bucket_bytes=30)
    # room 1000 - 450 - 60 = 490 -> 0.49
    assert not c.ok and c.fix == "rollout.vllm_gpu_memory_utilization=0.49"


def test_colocated_utilization_from_steady_state_not_from_free_now():
    total = 1000
    used_now = 300               # weights, grads, fp32 master; 100 of it cached free blocks
    steady = trainer_steady_bytes(used_now, releasable_cache=100, pending_optimizer=pending_adam_bytes(20))
    assert steady == 200 + 160   # AdamW moments: 8 bytes x 20 elements
    assert colocated_utilization(total, steady, transient_bytes=40) == 0.60   # (1000 - 360 - 40) / 1000
    assert pending_adam_bytes(20, state_allocated=True) == 0
    assert colocated_utilization(total, 2000) == 0.0


def test_trainer_steady_state_zero_stages():
    # 1368 params, 4 ranks, bf16: ZeRO-3 -> (2 + 2 + 12) x 1368 / 4 = 5472
    assert pf.trainer_steady_state_bytes(TINY, ranks=4, zero_stage=3, low_precision=True) == 5472
    # ZeRO-1: weights and grads whole (2 + 2) x 1368 = 5472, optimizer 12 x 1368 / 4 = 4104
    assert pf.trainer_steady_state_bytes(TINY, ranks=4, zero_stage=1, low_precision=True) == 5472 + 4104


def test_dev_shm_counts_vllm_message_queues_for_tp():
    mib = 1024**2
    # TP 1: two 256 MiB buckets (the 100 MiB tensor fits one)
    assert pf.dev_shm_bytes(bucket_bytes=256 * mib, largest_tensor_bytes=100 * mib, tensor_parallel=1,
                            engines_on_node=1, stream=True) == 512 * mib
    # TP 2: + (16 + 24 x 2) x 10 = 640 MiB of queues; a tensor larger than the bucket travels alone
    assert pf.dev_shm_bytes(bucket_bytes=256 * mib, largest_tensor_bytes=600 * mib, tensor_parallel=2,
                            engines_on_node=2, stream=True) == 2 * (1200 + 640) * mib
    assert pf.dev_shm_bytes(bucket_bytes=256 * mib, largest_tensor_bytes=0, tensor_parallel=2,
                            engines_on_node=1, stream=False) == 640 * mib


def test_host_load_moe_counts_fused_experts_per_reading_rank():
    s = KNOWN_SHAPES["Qwen/Qwen3-30B-A3B"]
    fused = 48 * 128 * 3 * 2048 * 768 * 2
    c8 = pf.host_load_check(s, ranks_on_node=8, loading_ranks=8, zero3=True)
    c1 = pf.host_load_check(s, ranks_on_node=8, loading_ranks=1, zero3=True)
    assert f"8 x {fused / GIB:.1f} GiB" in c8.detail and f"1 x {fused / GIB:.1f} GiB" in c1.detail
    assert not pf.host_load_check(s, ranks_on_node=8, loading_ranks=8, zero3=True, host_gib=400).ok


@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.stem)
def test_every_paper_profile_passes_on_the_card_it_names(path):
    from ulorl.cli.preflight_text import preflight_dict

    cfg = load_experiment(str(path), [])
    out = preflight_dict(cfg)
    failing = [c for c in out["checks"] if not c["ok"]]
    assert out["passes"], f"{path.name} on {cfg.resources.gpu_memory_gib} GiB: {failing}"
    names = {c["name"] for c in out["checks"]}
    assert {"engine_kv", "trainer_memory", "host_load", "dev_shm"} <= names
    other = [k for k in out if k.startswith("on_")]
    assert len(other) == 1


def test_30b_profile_says_what_to_change_on_80_gib():
    from ulorl.cli.preflight_text import preflight_dict

    out = preflight_dict(load_experiment(str(ROOT / "experiments/paper/qwen3_30b_a3b_128k.yaml"), []))
    changes = " ".join(out["on_80_gib"])
    assert "resources.gpus_per_engine=2" in changes and "train.sequence_parallel=4" in changes
    # the change it names passes on 80 GiB
    cfg80 = load_experiment(str(ROOT / "experiments/paper/qwen3_30b_a3b_128k.yaml"),
                            ["resources.gpu_memory_gib=80", "resources.gpus_per_engine=2",
                             "resources.rollout_engines=4", "train.sequence_parallel=4"])
    assert preflight_dict(cfg80)["passes"]


def test_model_shape_reads_a_local_config(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2, '
                                          '"num_key_value_heads": 1, "vocab_size": 10, "intermediate_size": 16}')
    assert model_shape(tmp_path) == ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, vocab=10,
                                               intermediate=16)
    assert model_shape("nobody/unknown-model-xyz") is None


def test_dry_run_prints_the_preflight():
    out = subprocess.run([sys.executable, "-m", "ulorl.cli.train", str(ROOT / "experiments/paper/qwen3_8b_128k.yaml"),
                          "--dry-run"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    pre = json.loads(out.stdout.split("# preflight\n", 1)[1].split("# plan\n", 1)[0])
    assert pre["passes"] and pre["card_gib"] == 141
    assert pre["on_80_gib"] == ["trainer_memory: train.sequence_parallel=2 (peak 63.9 GiB)"]
    json.loads(out.stdout.split("# plan\n", 1)[1])   # the plan stays the last section, JSON to the end
