"""Entropy-control comparators of DMMPTs: Clip-Cov, KL-Cov and the high-entropy minority.

Each mode selects response tokens to act on, from one batch's pre-update statistics:

* ``clip_cov`` (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
  Language Models"; verl ``compute_policy_loss_clip_cov``): among response tokens whose PPO clip is
  not already active and whose centred covariance ``(A - mean A) (logp - mean logp)`` lies in
  ``(lb, ub)``, pick ``max(int(ratio * n), 1)`` at random; their loss term is zeroed (a mask: they
  stay in the Eq. 10 denominator, as verl's ``corr = 0``).
* ``kl_cov`` (same paper; verl ``compute_policy_loss_kl_cov``): the ``max(1, int(ratio * n))``
  response tokens of largest covariance get ``coef * |logp - old_logp|`` added to their loss; every
  token's loss is the unclipped ``-A r`` (verl's KL-Cov has no PPO clip). See :func:`kl_cov_loss`.
* ``high_entropy_minority`` (Wang et al. 2025, "Beyond the 80/20 Rule"; TRL ``top_entropy_quantile``):
  only tokens with entropy >= the ``1 - rho`` quantile of the batch's response-token entropies are
  trained; the others are masked (kept in the denominator, as TRL multiplies the per-token loss).

Means, quantiles and the top-k run over every response token of the batch handed in (verl and TRL
do it per micro-batch, where the batch is split for memory only). n = response tokens of that batch.
Inputs are data (detached): selections carry no gradient.

Shapes: token_logprobs / old_logprobs / token_entropy Float[B, T], advantages Float[B],
response_mask Bool[B, T]; every selection is Bool[B, T] (True = acted on), False off the response.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ulorl.algo.loss import LOSS_AGG, policy_loss

#: how a mode's selected tokens enter the loss
Action = Literal["none", "mask", "kl"]


def check_token_shapes(response_mask: Tensor, **bt: Tensor) -> None:
    """``response_mask`` is a bool [B, T] tensor and every named tensor has its shape (else ValueError)."""
    if response_mask.dim() != 2 or response_mask.dtype != torch.bool:
        raise ValueError(f"response_mask must be a bool [B, T] tensor, got {response_mask.dtype} "
                         f"{tuple(response_mask.shape)}")
    for name, x in bt.items():
        if x.shape != response_mask.shape:
            raise ValueError(f"{name} shape {tuple(x.shape)} must equal response_mask shape "
                             f"{tuple(response_mask.shape)}")


def _token_advantages(advantages: Tensor, response_mask: Tensor) -> Tensor:
    """Float[B] or Float[B, T] -> Float[B, T] (detached)."""
    adv = advantages.detach()
    if adv.dim() == 1 and adv.shape[0] == response_mask.shape[0]:
        return adv.reshape(-1, 1).expand(response_mask.shape)
    if adv.shape == response_mask.shape:
        return adv
    raise ValueError(f"advantages shape {tuple(adv.shape)} must be [B] or [B, T] for B, T = "
                     f"{tuple(response_mask.shape)}")


def token_covariance(token_logprobs: Tensor, advantages: Tensor, response_mask: Tensor) -> Tensor:
    """Centred covariance term per token: ``(A - mean A) * (logp - mean logp)``.

    Both means are over the response tokens of the batch (A broadcast per token, so the mean of A
    is token-weighted). Float[B, T]; ``-inf`` off the response (never selected).
    """
    check_token_shapes(response_mask, token_logprobs=token_logprobs)
    adv = _token_advantages(advantages, response_mask).to(torch.float64)
    lp = token_logprobs.detach().to(torch.float64)
    n = response_mask.sum()
    if int(n) == 0:
        return torch.full(response_mask.shape, -torch.inf, dtype=torch.float64, device=lp.device)
    adv_mean = adv[response_mask].mean()
    lp_mean = lp[response_mask].mean()
    cov = (adv - adv_mean) * (lp - lp_mean)
    return torch.where(response_mask, cov, torch.full((), -torch.inf, dtype=cov.dtype, device=cov.device))


def clip_active(token_logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
                eps_low: float, eps_high: float) -> Tensor:
    """Bool[B, T]: response tokens where the PPO clip is active (A > 0 and r > 1 + eps_high, or
    A < 0 and r < 1 - eps_low), r = exp(logp - old_logp) — verl's ``clip_by_origin``."""
    check_token_shapes(response_mask, token_logprobs=token_logprobs, old_logprobs=old_logprobs)
    adv = _token_advantages(advantages, response_mask)
    zero = torch.zeros((), dtype=token_logprobs.dtype, device=token_logprobs.device)
    r = torch.exp(torch.where(response_mask, token_logprobs.detach() - old_logprobs.detach(), zero))
    return response_mask & (((adv > 0) & (r > 1.0 + eps_high)) | ((adv < 0) & (r < 1.0 - eps_low)))


def clip_cov_candidates(token_logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
                        lb: float, ub: float, eps_low: float, eps_high: float) -> Tensor:
    """Bool[B, T]: response tokens Clip-Cov may detach: covariance in the open interval (lb, ub) and
    the PPO clip not already active."""
    cov = token_covariance(token_logprobs, advantages, response_mask)
    clipped = clip_active(token_logprobs, old_logprobs, advantages, response_mask, eps_low, eps_high)
    return response_mask & ~clipped & (cov > lb) & (cov < ub)


def clip_cov_select(candidates: Tensor, response_mask: Tensor, ratio: float, seed: int = 0) -> Tensor:
    """Clip-Cov's choice: ``max(int(ratio * n), 1)`` of the ``candidates`` (Bool[B, T]) uniformly at
    random (all of them when fewer), n = response tokens. ``seed`` fixes the draw (a generator of
    its own: every rank of a data-parallel update draws the same tokens). Bool[B, T]."""
    check_token_shapes(response_mask, candidates=candidates)
    if not ratio > 0:
        raise ValueError(f"clip_cov ratio must be > 0, got {ratio}")
    out = torch.zeros_like(response_mask)
    n = int(response_mask.sum())
    idx = torch.nonzero(candidates & response_mask)
    if n == 0 or idx.shape[0] == 0:
        return out
    want = max(int(ratio * n), 1)
    if idx.shape[0] > want:
        gen = torch.Generator().manual_seed(int(seed))
        idx = idx[torch.randperm(idx.shape[0], generator=gen)[:want].to(idx.device)]
    out[idx[:, 0], idx[:, 1]] = True
    return out


def kl_cov_select(token_logprobs: Tensor, advantages: Tensor, response_mask: Tensor, ratio: float) -> Tensor:
    """KL-Cov's choice: the ``max(1, int(ratio * n))`` response tokens of largest
    :func:`token_covariance` (n = response tokens; none when n = 0). Bool[B, T]."""
    if not ratio > 0:
        raise ValueError(f"kl_cov ratio must be > 0, got {ratio}")
    cov = token_covariance(token_logprobs, advantages, response_mask)
    out = torch.zeros_like(response_mask)
    n = int(response_mask.sum())
    if n == 0:
        return out
    k = min(max(1, int(ratio * n)), n)
    top = torch.topk(cov.reshape(-1), k, largest=True).indices
    out.view(-1)[top] = True
    return out & response_mask


def linear_quantile(values: Tensor, q: float) -> Tensor:
    """The ``q`` quantile of a 1-D tensor with linear interpolation (``torch.quantile``'s default),
    by ``kthvalue``: no input-size limit (``torch.quantile`` refuses more than 2**24 elements)."""
    if values.dim() != 1 or values.numel() == 0:
        raise ValueError(f"need a non-empty 1-D tensor, got shape {tuple(values.shape)}")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    x = values.detach().to(torch.float64)
    pos = q * (x.numel() - 1)
    lo = int(pos)
    hi = min(lo + 1, x.numel() - 1)
    v_lo = x.kthvalue(lo + 1).values
    v_hi = x.kthvalue(hi + 1).values
    return v_lo + (v_hi - v_lo) * (pos - lo)


def high_entropy_minority_mask(token_entropy: Tensor, response_mask: Tensor, rho: float) -> Tensor:
    """Tokens the 80/20 rule leaves out: response tokens with entropy below the ``1 - rho`` quantile
    (linear interpolation) of the batch's response-token entropies; tokens at or above it are trained.
    rho = 1 masks nothing; rho = 0 keeps only the tokens at the maximum. Bool[B, T] (True = masked)."""
    check_token_shapes(response_mask, token_entropy=token_entropy)
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"top_entropy_quantile must be in [0, 1], got {rho}")
    if not bool(response_mask.any()):
        return torch.zeros_like(response_mask)
    ent = token_entropy.detach()
    threshold = linear_quantile(ent[response_mask], 1.0 - rho)
    return response_mask & (ent.to(torch.float64) < threshold)


def kl_cov_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    kl_tokens: Tensor,
    coef: float,
    loss_mask: Tensor | None = None,
    num_tokens: float | Tensor | None = None,
    *,
    loss_agg: str = "token_mean",
    num_seqs: float | Tensor | None = None,
    on_policy: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-Cov loss (verl ``compute_policy_loss_kl_cov``): per token ``-A r``, plus
    ``coef * |log r|`` on ``kl_tokens``; no PPO clip; aggregated like :func:`policy_loss`.

    r = exp(logprobs - old_logprobs). ``on_policy``: the update is the first and only one on this
    batch, so old = logprobs detached (verl's ``on_policy`` shortcut): r = 1 exactly and the penalty
    is 0 with zero gradient (|x| at 0), not a +-coef gradient from float noise between two passes.

    Args:
        logprobs: Float[B, T] with grad; old_logprobs: Float[B, T]; advantages: Float[B] or Float[B, T];
        response_mask, kl_tokens, loss_mask: Bool[B, T]; coef: verl's ``ppo_kl_coef`` (>= 0);
        num_tokens, loss_agg, num_seqs: as :func:`policy_loss`.

    Returns:
        (loss, metrics): the metrics of :func:`policy_loss` (ratio statistics, masked_frac, ...), with
        ``pg_loss`` this loss, ``clip_frac`` 0 (nothing is clipped) and ``kl_penalty`` (the mean of
        ``|log r|`` over ``kl_tokens``; 0 when none).
    """
    check_token_shapes(response_mask, logprobs=logprobs, old_logprobs=old_logprobs, kl_tokens=kl_tokens)
    if coef < 0:
        raise ValueError(f"kl_cov coef must be >= 0, got {coef}")
    if loss_agg not in LOSS_AGG:
        raise ValueError(f"loss_agg must be one of {tuple(LOSS_AGG)}, got {loss_agg!r}")
    old = logprobs.detach() if on_policy else old_logprobs.detach()
    mask = torch.zeros_like(response_mask) if loss_mask is None else loss_mask
    keep = response_mask & ~mask
    adv = _token_advantages(advantages, response_mask)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    log_ratio = torch.where(keep, logprobs - old, zero)
    per_token = -adv.to(logprobs.dtype) * torch.exp(log_ratio) + coef * log_ratio.abs() * kl_tokens.to(logprobs.dtype)
    loss, _ = LOSS_AGG[loss_agg](per_token, keep, response_mask, num_tokens, num_seqs)
    _, metrics = policy_loss(logprobs.detach(), old, advantages, response_mask, mask, 0.0, 0.0, num_tokens,
                             loss_agg=loss_agg, num_seqs=num_seqs)
    with torch.no_grad():
        sel = kl_tokens & keep
        penalty = log_ratio.detach().abs()[sel].mean() if bool(sel.any()) else zero.detach()
    metrics.update({"pg_loss": loss.detach(), "clip_frac": torch.zeros_like(metrics["clip_frac"]),
                    "kl_penalty": penalty})
    return loss, metrics


# ---- registry: algo.entropy_control.mode -> (selection, action) ---------------------------------


@dataclass(frozen=True)
class ControlInputs:
    """What an entropy-control mode reads for one batch (all treated as data).

    token_logprobs, old_logprobs, token_entropy: Float[B, T]; advantages: Float[B]; response_mask:
    Bool[B, T]; eps_low / eps_high: the PPO clip range (Clip-Cov skips tokens it already clips);
    the ratios / bounds / rho as in ``algo.entropy_control``; seed: Clip-Cov's random draw.
    """

    token_logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    response_mask: Tensor
    token_entropy: Tensor
    eps_low: float = 0.2
    eps_high: float = 0.2
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-4
    top_entropy_quantile: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        check_token_shapes(self.response_mask, token_logprobs=self.token_logprobs, old_logprobs=self.old_logprobs,
                           token_entropy=self.token_entropy)
        _token_advantages(self.advantages, self.response_mask)


@dataclass(frozen=True)
class EntropyControl:
    """One ``algo.entropy_control.mode``: ``select`` -> Bool[B, T], the response tokens it acts on
    (``train/entropy_control_frac``); ``action``: "mask" (excluded from the loss, kept in the
    denominator), "kl" (KL-penalised by :func:`kl_cov_loss`) or "none"."""

    select: Callable[[ControlInputs], Tensor]
    action: Action


def _select_nothing(x: ControlInputs) -> Tensor:
    return torch.zeros_like(x.response_mask)


def _select_clip_cov(x: ControlInputs) -> Tensor:
    cand = clip_cov_candidates(x.token_logprobs, x.old_logprobs, x.advantages, x.response_mask,
                               x.clip_cov_lb, x.clip_cov_ub, x.eps_low, x.eps_high)
    return clip_cov_select(cand, x.response_mask, x.clip_cov_ratio, x.seed)


def _select_kl_cov(x: ControlInputs) -> Tensor:
    return kl_cov_select(x.token_logprobs, x.advantages, x.response_mask, x.kl_cov_ratio)


def _select_low_entropy(x: ControlInputs) -> Tensor:
    return high_entropy_minority_mask(x.token_entropy, x.response_mask, x.top_entropy_quantile)


#: ``algo.entropy_control.mode`` -> :class:`EntropyControl`; the config's allowed values are these keys.
ENTROPY_CONTROLS: dict[str, EntropyControl] = {
    "off": EntropyControl(_select_nothing, "none"),
    "clip_cov": EntropyControl(_select_clip_cov, "mask"),
    "kl_cov": EntropyControl(_select_kl_cov, "kl"),
    "high_entropy_minority": EntropyControl(_select_low_entropy, "mask"),
}


def entropy_control(mode: str) -> EntropyControl:
    """The registry entry of ``mode``; ValueError naming the allowed modes otherwise."""
    if mode not in ENTROPY_CONTROLS:
        raise ValueError(f"entropy_control mode must be one of {tuple(ENTROPY_CONTROLS)}, got {mode!r}")
    return ENTROPY_CONTROLS[mode]


def draw_seed(*parts: int) -> int:
    """A 31-bit seed from integers (Clip-Cov's draw from the run seed and the batch's first sample id)."""
    digest = hashlib.blake2b(":".join(str(int(p)) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF
