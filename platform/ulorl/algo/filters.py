"""Dynamic sampling (DAPO): drop groups that carry no learning signal."""

from __future__ import annotations

import torch
from torch import Tensor

from ulorl.algo._groups import check_same_length, group_index, group_min_max


def dynamic_sampling_filter(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Keep the samples of groups whose rewards are not all equal.

    A group with all rewards equal (all 0, all 1, or a single response) has zero advantage
    everywhere and would only dilute the token-mean loss denominator.

    Args:
        rewards: Float[N] (bool/int accepted).
        group_ids: Int[N], any integer labels.

    Returns:
        Bool[N], True = keep.
    """
    check_same_length(rewards, group_ids)
    r = rewards.detach()
    if not r.is_floating_point():
        r = r.float()
    if r.numel() == 0:
        return r.new_zeros(0, dtype=torch.bool)
    inverse, num_groups = group_index(group_ids)
    gmin, gmax = group_min_max(r, inverse, num_groups)
    return (gmin != gmax)[inverse]
