"""Per-group reductions over flat sample tensors (shared by advantages and filters)."""

from __future__ import annotations

import torch
from torch import Tensor


def group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary integer group ids to dense indices.

    Args:
        group_ids: Int[N], any integer labels (need not be contiguous or sorted).

    Returns:
        (inverse Long[N] with values in [0, G), G = number of distinct groups).
    """
    if group_ids.dim() != 1:
        raise ValueError(f"group_ids must be 1-D [N], got shape {tuple(group_ids.shape)}")
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool:
        raise TypeError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(uniq.numel())


def check_same_length(rewards: Tensor, group_ids: Tensor) -> None:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must have the same shape [N]"
        )


def group_min_max(values: Tensor, inverse: Tensor, num_groups: int) -> tuple[Tensor, Tensor]:
    """Per-group min and max. values: Float[N]; returns (Float[G], Float[G])."""
    gmin = torch.full((num_groups,), float("inf"), dtype=values.dtype, device=values.device)
    gmax = torch.full((num_groups,), float("-inf"), dtype=values.dtype, device=values.device)
    gmin = gmin.scatter_reduce(0, inverse, values, reduce="amin", include_self=True)
    gmax = gmax.scatter_reduce(0, inverse, values, reduce="amax", include_self=True)
    return gmin, gmax
