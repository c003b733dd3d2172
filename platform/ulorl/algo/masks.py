"""Masks of well-mastered positive tokens: MPT (static) and DMMPT (dynamic), Eq. 10.

All masks are Bool[B, T] with True = the token is EXCLUDED from the loss (pass as
``policy_loss(..., loss_mask=mask)``); excluded tokens still count in the loss denominator.
Inputs are treated as data (detached): masks carry no gradient.

Shapes: token_logprobs Float[B, T] (current policy, on logits / rollout temperature),
rewards Float[B] ({0, 1}), response_mask Bool[B, T] (True = response token, False = prompt or
padding), token_entropy Float[B, T] (per-token entropy of the same distribution).
"""

from __future__ import annotations

from typing import Literal, Protocol

import torch
from torch import Tensor

EntropyScope = Literal["sample", "batch"]
ENTROPY_SCOPES: tuple[str, ...] = ("sample", "batch")


def _check_bt(name: str, x: Tensor, ref: Tensor) -> None:
    if x.shape != ref.shape:
        raise ValueError(f"{name} shape {tuple(x.shape)} must equal response_mask shape {tuple(ref.shape)}")


def _check_common(token_logprobs: Tensor, rewards: Tensor, response_mask: Tensor) -> None:
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must be [B, T], got shape {tuple(response_mask.shape)}")
    if response_mask.dtype != torch.bool:
        raise TypeError(f"response_mask must be a bool tensor, got {response_mask.dtype}")
    _check_bt("token_logprobs", token_logprobs, response_mask)
    if rewards.shape != response_mask.shape[:1]:
        raise ValueError(f"rewards shape {tuple(rewards.shape)} must be [B] = ({response_mask.shape[0]},)")


def mpt_mask(token_logprobs: Tensor, rewards: Tensor, response_mask: Tensor, tau: float) -> Tensor:
    """Well-mastered positive tokens: reward == 1 sample, response token, exp(logprob) >= tau.

    Args:
        token_logprobs: Float[B, T], log-prob of each sampled token under the current policy.
        rewards: Float[B]; only samples with reward exactly 1 are positive.
        response_mask: Bool[B, T].
        tau: probability threshold in (0, 1] (paper: 0.99).

    Returns:
        Bool[B, T].
    """
    _check_common(token_logprobs, rewards, response_mask)
    positive = (rewards.detach() == 1).reshape(-1, 1)
    confident = token_logprobs.detach().exp() >= tau
    return positive & response_mask & confident


static_mpt_mask = mpt_mask
"""Static masking (Fig. 4): every MPT is excluded at every step; identical to :func:`mpt_mask`."""


def mean_response_entropy(
    token_entropy: Tensor,
    response_mask: Tensor,
    scope: EntropyScope = "sample",
    batch_entropy: float | Tensor | None = None,
) -> Tensor:
    """The entropy H compared with sigma, per sample: Float[B].

    scope="sample": H_i = mean of sample i's response-token entropies (Eq. 10); a sample with
    no response tokens gets H_i = 0 (it has no tokens to mask anyway).
    scope="batch": one H = mean over all response tokens of the batch, broadcast to [B]
    (the paper's text, "the model's current entropy"). When a batch is split into micro-batches
    or ranks, pass the global mean as ``batch_entropy`` so every part uses the same H.
    """
    if scope not in ENTROPY_SCOPES:
        raise ValueError(f"entropy scope must be one of {ENTROPY_SCOPES}, got {scope!r}")
    _check_bt("token_entropy", token_entropy, response_mask)
    ent = token_entropy.detach()
    ent = torch.where(response_mask, ent, torch.zeros((), dtype=ent.dtype, device=ent.device))
    if scope == "sample":
        counts = response_mask.sum(dim=1).clamp(min=1).to(ent.dtype)
        return ent.sum(dim=1) / counts
    if batch_entropy is None:
        h = ent.sum() / response_mask.sum().clamp(min=1).to(ent.dtype)
    else:
        h = torch.as_tensor(batch_entropy, dtype=ent.dtype, device=ent.device).detach()
        if h.numel() != 1:
            raise ValueError(f"batch_entropy must be a scalar, got shape {tuple(h.shape)}")
        h = h.reshape(())
    return h.expand(response_mask.shape[0])


def dmmpt_mask(
    token_logprobs: Tensor,
    rewards: Tensor,
    response_mask: Tensor,
    token_entropy: Tensor,
    tau: float,
    sigma: float,
    scope: EntropyScope = "sample",
    *,
    batch_entropy: float | Tensor | None = None,
) -> Tensor:
    """Dynamic masking (Eq. 10): ``mpt_mask`` AND (mean entropy H < sigma).

    I_mask(i, t) = 1 iff H_i < sigma and token t of sample i is an MPT. H_i per
    :func:`mean_response_entropy` (``scope`` and ``batch_entropy`` as there).

    Args:
        token_logprobs: Float[B, T]; rewards: Float[B]; response_mask: Bool[B, T];
        token_entropy: Float[B, T]; tau: MPT threshold; sigma: target entropy.

    Returns:
        Bool[B, T].
    """
    mpt = mpt_mask(token_logprobs, rewards, response_mask, tau)
    gate = mean_response_entropy(token_entropy, response_mask, scope, batch_entropy) < sigma
    return mpt & gate.reshape(-1, 1)


# ---- registry with one signature ------------------------------------------------------------


class MaskFn(Protocol):
    def __call__(
        self,
        token_logprobs: Tensor,
        rewards: Tensor,
        response_mask: Tensor,
        token_entropy: Tensor | None,
        *,
        tau: float,
        sigma: float,
        scope: EntropyScope = "sample",
        batch_entropy: float | Tensor | None = None,
    ) -> Tensor: ...


def _mask_off(
    token_logprobs: Tensor,
    rewards: Tensor,
    response_mask: Tensor,
    token_entropy: Tensor | None,
    *,
    tau: float,
    sigma: float,
    scope: EntropyScope = "sample",
    batch_entropy: float | Tensor | None = None,
) -> Tensor:
    _check_common(token_logprobs, rewards, response_mask)
    return torch.zeros_like(response_mask)


def _mask_static(
    token_logprobs: Tensor,
    rewards: Tensor,
    response_mask: Tensor,
    token_entropy: Tensor | None,
    *,
    tau: float,
    sigma: float,
    scope: EntropyScope = "sample",
    batch_entropy: float | Tensor | None = None,
) -> Tensor:
    return static_mpt_mask(token_logprobs, rewards, response_mask, tau)


def _mask_dynamic(
    token_logprobs: Tensor,
    rewards: Tensor,
    response_mask: Tensor,
    token_entropy: Tensor | None,
    *,
    tau: float,
    sigma: float,
    scope: EntropyScope = "sample",
    batch_entropy: float | Tensor | None = None,
) -> Tensor:
    if token_entropy is None:
        raise ValueError("mpt mode 'dynamic' needs token_entropy [B, T]")
    return dmmpt_mask(
        token_logprobs, rewards, response_mask, token_entropy, tau, sigma, scope, batch_entropy=batch_entropy
    )


#: ``algo.mpt.mode`` -> mask function. Call as
#: ``MASK_FNS[mode](token_logprobs, rewards, response_mask, token_entropy, tau=, sigma=, scope=)``.
MASK_FNS: dict[str, MaskFn] = {"off": _mask_off, "static": _mask_static, "dynamic": _mask_dynamic}


def mask_active_samples(
    mode: str,
    token_entropy: Tensor | None,
    response_mask: Tensor,
    *,
    sigma: float,
    scope: EntropyScope = "sample",
    batch_entropy: float | Tensor | None = None,
) -> Tensor:
    """Which samples had the masking gate open, Bool[B] (for ``train/mask_active_frac``).

    "off": none; "static": all; "dynamic": H_i < sigma (whether or not the sample has MPTs;
    the count of actually masked tokens is ``train/masked_frac``).
    """
    if mode not in MASK_FNS:
        raise ValueError(f"mpt mode must be one of {tuple(MASK_FNS)}, got {mode!r}")
    b = response_mask.shape[0]
    if mode == "off":
        return torch.zeros(b, dtype=torch.bool, device=response_mask.device)
    if mode == "static":
        return torch.ones(b, dtype=torch.bool, device=response_mask.device)
    if token_entropy is None:
        raise ValueError("mpt mode 'dynamic' needs token_entropy [B, T]")
    return mean_response_entropy(token_entropy, response_mask, scope, batch_entropy) < sigma
