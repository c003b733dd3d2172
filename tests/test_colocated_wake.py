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
