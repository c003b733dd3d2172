"""A colocated vLLM engine must wake after every update: the utilization it may reserve comes from the
trainer's steady state (AdamW moments from the first step, cached blocks released), not from what is free
when it starts, and the trainer's cached blocks are released before each wake."""

from __future__ import annotations

import math

import torch

from ulorl.rollout.engines import vllm as vllm_engine
from ulorl.rollout.engines.vllm import gpu_memory_problem, optimizer_partition_numel, wake_engine

GIB = 1 << 30


def test_start_time_free_memory_is_not_the_wake_budget():
    total = 141 * GIB
    free = 125 * GIB                      # vLLM's start check passes: 0.85 x 141 = 119.85 GiB <= 125
    assert gpu_memory_problem(free, total, 0.85, "cuda:0", colocate=False) is None
    # the first step adds 20 GiB of AdamW moments; the weight stream holds 0.5 GiB while the engine wakes
    problem = gpu_memory_problem(free, total, 0.85, "cuda:0", colocate=True, pending_bytes=20 * GIB,
                                 transient_bytes=GIB // 2)
    assert problem is not None and "could not wake" in problem
    # steady = 16 + 20 = 36 GiB; room = 141 - 36 - 0.5 = 104.5 GiB -> floor(74.1) = 0.74
    assert problem.endswith("rollout.vllm_gpu_memory_utilization=0.74")
    assert math.ceil(total * 0.74) + 36 * GIB + GIB // 2 <= total
    assert gpu_memory_problem(free, total, 0.74, "cuda:0", colocate=True, pending_bytes=20 * GIB,
                              transient_bytes=GIB // 2) is None


def test_cached_blocks_count_as_free_for_the_wake():
    total, free = 100 * GIB, 40 * GIB     # 60 GiB in use, 15 GiB of it cached free blocks
    assert gpu_memory_problem(free, total, 0.5, "cuda:0", colocate=True, releasable_bytes=15 * GIB) is None
    assert gpu_memory_problem(free, total, 0.5, "cuda:0", colocate=True) is not None


def test_optimizer_partition_counts_trainable_local_elements():
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))   # 15 + 8 elements
    m[1].bias.requires_grad_(False)
    assert optimizer_partition_numel(m, world_size=1) == 21
    assert optimizer_partition_numel(m, world_size=3) == 7      # ZeRO-1/2: the optimizer is partitioned
    w = torch.nn.Parameter(torch.empty(0))
    w.ds_tensor = torch.empty(5)                                  # ZeRO-3: the rank's own shard
    holder = torch.nn.Module()
    holder.w = w
    assert optimizer_partition_numel(holder, world_size=4) == 5


def test_wake_releases_cached_blocks_first(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(vllm_engine.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(vllm_engine.torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))

    class FakeLLM:
        def wake_up(self, tags: list[str]) -> None:
            calls.append(f"wake_up {tags}")

    wake_engine(FakeLLM(), ["weights"])
    assert calls == ["empty_cache", "wake_up ['weights']"]


def test_dev_shm_sizing_knows_a_hub_ids_largest_weight():
    from ulorl.rollout.engines.vllm import largest_weight_bytes

    # Qwen3-30B-A3B's embedding, 151,936 x 2,048 bf16 = 622 MB: larger than a 256 MiB bucket, it travels alone
    assert largest_weight_bytes("Qwen/Qwen3-30B-A3B") == 151936 * 2048 * 2
    assert largest_weight_bytes("Qwen/Qwen3-8B", "float32") == 151936 * 4096 * 4
    assert largest_weight_bytes("nobody/unknown-model-xyz") == 0


def test_vllm_message_queues_come_off_the_bucket_budget():
    from ulorl.rollout.engines.vllm import shm_left_for_buckets, vllm_message_queue_bytes

    mib = 1 << 20
    assert vllm_message_queue_bytes(1) == 0
    assert vllm_message_queue_bytes(2, chunk_mb=16) == (16 + 2 * 24) * 10 * mib      # 640 MiB
    assert vllm_message_queue_bytes(4, chunk_mb=16) == (16 + 4 * 24) * 10 * mib      # 1120 MiB
    # a default 64 MiB container /dev/shm: nothing left for buckets at TP 2 (and vLLM itself refuses)
    assert shm_left_for_buckets(64 * mib, 2) == 0
    assert shm_left_for_buckets(64 * mib, 1) == 64 * mib
    assert shm_left_for_buckets(None, 2) is None
