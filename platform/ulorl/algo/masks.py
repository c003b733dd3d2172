"""Masks of well-mastered positive tokens: MPT (static) and DMMPT (dynamic), Eq. 10.

All masks are Bool[B, T] with True = the token is EXCLUDED from the loss (pass as
``policy_loss(..., loss_mask=mask)``); excluded tokens still count in the loss denominator.
Inputs are treated as data (detached): masks carry no gradient.

Shapes: token_logprobs Float[B, T] (current policy, on logits / rollout temperature),
rewards Float[B] ({0, 1}), response_mask Bool[B, T] (True = response token, False = prompt or
padding), token_entropy Float[B, T] (per-token entropy of the same distribution).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Optional

import torch
from torch import Tensor

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


def mean_response_entropy(
    token_entropy: Tensor,
    response_mask: Tensor,
    scope: str = "sample",
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
    scope: str = "sample",
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
    return _mask_dmmpt(MaskInputs(token_logprobs, rewards, response_mask, token_entropy, tau=tau, sigma=sigma,
                                  scope=scope, batch_entropy=batch_entropy))


# ---- registry: algo.mpt.mode -> (loss mask, gate-open samples) --------------------------------


@dataclass(frozen=True)
class MaskInputs:
    """What a masking mode reads for one batch (all treated as data).

    token_logprobs: Float[B, T]; rewards: Float[B]; response_mask: Bool[B, T];
    token_entropy: Float[B, T] or None (needed by "dynamic"); tau, sigma, scope, batch_entropy
    as in :func:`dmmpt_mask`. Shapes are checked at construction.
    """

    token_logprobs: Tensor
    rewards: Tensor
    response_mask: Tensor
    token_entropy: Optional[Tensor] = None
    tau: float = 0.99
    sigma: float = 0.2
    scope: str = "sample"
    batch_entropy: float | Tensor | None = None

    def __post_init__(self) -> None:
        _check_common(self.token_logprobs, self.rewards, self.response_mask)
        if self.scope not in ENTROPY_SCOPES:
            raise ValueError(f"entropy scope must be one of {ENTROPY_SCOPES}, got {self.scope!r}")
        if self.token_entropy is not None:
            _check_bt("token_entropy", self.token_entropy, self.response_mask)

    def entropy(self) -> Tensor:
        if self.token_entropy is None:
            raise ValueError("mpt mode 'dynamic' needs token_entropy [B, T]")
        return self.token_entropy

    @cached_property
    def mpt(self) -> Tensor:
        """Bool[B, T]: :func:`mpt_mask` of these inputs, computed once (the static and dynamic masks
        and the trainer's ``train/mpt_frac`` share it)."""
        return mpt_mask(self.token_logprobs, self.rewards, self.response_mask, self.tau)


@dataclass(frozen=True)
class MaskMode:
    """One ``algo.mpt.mode``: ``mask`` -> Bool[B, T] (True = excluded from the loss);
    ``active`` -> Bool[B], the samples whose masking gate is open (``train/mask_active_frac``)."""

    mask: Callable[[MaskInputs], Tensor]
    active: Callable[[MaskInputs], Tensor]


def _mask_nothing(x: MaskInputs) -> Tensor:
    return torch.zeros_like(x.response_mask)


def _mask_mpt(x: MaskInputs) -> Tensor:
    return x.mpt


def _mask_dmmpt(x: MaskInputs) -> Tensor:
    """:func:`dmmpt_mask` over the inputs' shared MPT mask."""
    return x.mpt & _gate_open(x).reshape(-1, 1)


def _no_rows(x: MaskInputs) -> Tensor:
    return torch.zeros(x.response_mask.shape[0], dtype=torch.bool, device=x.response_mask.device)


def _all_rows(x: MaskInputs) -> Tensor:
    return torch.ones(x.response_mask.shape[0], dtype=torch.bool, device=x.response_mask.device)


def _gate_open(x: MaskInputs) -> Tensor:
    return mean_response_entropy(x.entropy(), x.response_mask, x.scope, x.batch_entropy) < x.sigma


#: ``algo.mpt.mode`` -> :class:`MaskMode`; the config's allowed values are these keys (read through
#: :func:`mask_mode`). "off": nothing masked, no sample active; "static": every MPT, every sample
#: active (Fig. 4); "dynamic": DMMPT, MPTs of samples with H < sigma, those samples active (whether
#: or not they hold MPTs: ``train/masked_frac`` counts the masked tokens).
MASK_MODES: dict[str, MaskMode] = {
    "off": MaskMode(mask=_mask_nothing, active=_no_rows),
    "static": MaskMode(mask=_mask_mpt, active=_all_rows),
    "dynamic": MaskMode(mask=_mask_dmmpt, active=_gate_open),
}


def mask_mode(mode: str) -> MaskMode:
    """The one way to a masking mode: the registry entry of ``mode`` (``.mask`` -> Bool[B, T] excluded
    tokens, ``.active`` -> Bool[B] gate-open samples); ValueError naming the bad mode and the allowed ones."""
    if mode not in MASK_MODES:
        raise ValueError(f"mpt mode must be one of {tuple(MASK_MODES)}, got {mode!r}")
    return MASK_MODES[mode]
