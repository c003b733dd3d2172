"""A colocated vLLM engine's memory budget beside the trainer's steady state (pure arithmetic).

vLLM reserves ``ceil(total x gpu_memory_utilization)`` when it starts (``vllm/v1/worker/utils.py``,
``request_memory``) and, after each sleep, gets back only the blocks it reserved then: waking needs
that much free. The trainer's memory when the engine starts is not its steady state: AdamW's two
fp32 moments appear at the first optimizer step, and PyTorch's caching allocator keeps freed blocks
until ``torch.cuda.empty_cache()``. So the utilization a colocated engine may ask for is what stays
free after the trainer's steady state, not what is free at start::

    steady = trainer_steady_bytes(used_now, releasable_cache, pending_optimizer)
    colocated_utilization(total, steady, transient)   # the largest utilization that wakes every step
"""

from __future__ import annotations

import math

__all__ = ["ADAM_MOMENT_BYTES", "pending_adam_bytes", "trainer_steady_bytes", "colocated_utilization"]

#: AdamW's exp_avg and exp_avg_sq, fp32 each, per trainable element of this rank's optimizer partition
ADAM_MOMENT_BYTES = 8


def pending_adam_bytes(local_trainable_numel: int, state_allocated: bool = False) -> int:
    """Bytes AdamW's two fp32 moments will add at the first optimizer step (0 once they exist)."""
    return 0 if state_allocated else ADAM_MOMENT_BYTES * int(local_trainable_numel)


def trainer_steady_bytes(used_now: int, releasable_cache: int, pending_optimizer: int) -> int:
    """The trainer's GPU bytes between steps in steady state: what is in use now (total - free, every
    process and context on the GPU included), less the caching allocator's free blocks that
    ``empty_cache()`` returns before each wake, plus the optimizer state the first step allocates."""
    return max(0, int(used_now) - int(releasable_cache)) + int(pending_optimizer)


def colocated_utilization(total_bytes: int, steady_bytes: int, transient_bytes: int = 0) -> float:
    """The largest ``gpu_memory_utilization`` (in hundredths, rounded down) whose reservation fits beside
    the trainer's steady state and the ``transient_bytes`` alive while the engine wakes (the weight
    stream's gathered buckets); 0.0 when nothing fits."""
    if total_bytes <= 0:
        return 0.0
    room = int(total_bytes) - int(steady_bytes) - int(transient_bytes)
    util = max(0.0, math.floor(100 * room / int(total_bytes)) / 100)
    while util > 0 and math.ceil(int(total_bytes) * util) > room:   # vLLM's ceil(total x utilization)
        util = round(util - 0.01, 2)
    return max(0.0, util)
