"""GRPO group-normalised advantages (PAPER.md, base objective)."""

from __future__ import annotations

import torch
from torch import Tensor

from ulorl.algo._groups import check_same_length, group_index, group_min_max


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    eps: float = 1e-6,
    *,
    unbiased: bool = False,
) -> Tensor:
    """Advantage of each response relative to its group: (r - mean_g) / (std_g + eps).

    The same scalar is later broadcast to every token of the response.

    Which std: the **population** std (``unbiased=False``, divide by G), i.e. the std of the
    group's empirical reward distribution, which is what "std(r) over its group" describes: the
    G responses are the whole group, not a sample from which a larger population's spread is
    estimated. With binary rewards it is sqrt(p (1 - p)) for group accuracy p, independent of
    G. GRPO implementations differ (verl / DeepSeekMath code call ``torch.std``, the unbiased
    estimator, which is larger by sqrt(G / (G - 1)), e.g. 1.069x for G = 8); pass
    ``unbiased=True`` to reproduce them.

    Groups whose rewards are all equal (including singleton groups) get exactly 0, not a
    rounding residue divided by eps.

    Args:
        rewards: Float[N] (bool/int accepted), one reward per response.
        group_ids: Int[N], the prompt/group each response belongs to (any integer labels).
        eps: added to the std in the denominator.
        unbiased: divide the variance by G - 1 instead of G (singleton groups still give 0).

    Returns:
        Float[N] advantages (dtype of ``rewards`` if floating, else float32), no gradient
        relation to anything (rewards are data).
    """
    check_same_length(rewards, group_ids)
    r = rewards.detach()
    if not r.is_floating_point():
        r = r.to(torch.float32)
    if r.numel() == 0:
        return r.clone()
    inverse, num_groups = group_index(group_ids)

    counts = torch.zeros(num_groups, dtype=r.dtype, device=r.device).scatter_add_(0, inverse, torch.ones_like(r))
    sums = torch.zeros(num_groups, dtype=r.dtype, device=r.device).scatter_add_(0, inverse, r)
    mean = sums / counts
    dev = r - mean[inverse]
    sq = torch.zeros(num_groups, dtype=r.dtype, device=r.device).scatter_add_(0, inverse, dev * dev)
    dof = (counts - 1).clamp(min=1) if unbiased else counts
    std = (sq / dof).sqrt()
    adv = dev / (std[inverse] + eps)

    gmin, gmax = group_min_max(r, inverse, num_groups)
    constant = (gmin == gmax)[inverse]
    return torch.where(constant, torch.zeros_like(adv), adv)
