"""Clipped token-level policy-gradient loss (DAPO objective with the Eq. 10 denominator)."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class LossAgg(Protocol):
    def __call__(
        self,
        per_token: Tensor,
        keep: Tensor,
        response_mask: Tensor,
        num_tokens: float | Tensor | None,
        num_seqs: float | Tensor | None,
    ) -> tuple[Tensor, Tensor]: ...


def _as_denominator(value: float | Tensor, name: str, like: Tensor) -> Tensor:
    d = torch.as_tensor(value, dtype=like.dtype, device=like.device).detach().reshape(())
    if not bool(d > 0):
        raise ValueError(f"{name} must be > 0, got {float(d)}")
    return d


def token_mean(
    per_token: Tensor,
    keep: Tensor,
    response_mask: Tensor,
    num_tokens: float | Tensor | None,
    num_seqs: float | Tensor | None,
) -> tuple[Tensor, Tensor]:
    """sum over kept tokens / number of response tokens (masked ones included), Eq. 10.

    ``num_tokens`` replaces the local response-token count (global count across micro-batches
    or ranks). Returns (loss scalar, denominator used).
    """
    total = torch.where(keep, per_token, torch.zeros((), dtype=per_token.dtype, device=per_token.device)).sum()
    if num_tokens is None:
        denom = response_mask.sum().to(per_token.dtype).clamp(min=1)
    else:
        denom = _as_denominator(num_tokens, "num_tokens", per_token)
    return total / denom, denom


def seq_mean(
    per_token: Tensor,
    keep: Tensor,
    response_mask: Tensor,
    num_tokens: float | Tensor | None,
    num_seqs: float | Tensor | None,
) -> tuple[Tensor, Tensor]:
    """Mean over sequences of (sum over the sequence's kept tokens / its response-token count).

    The GRPO-paper aggregation, for comparison (long responses weigh less per token).
    ``num_seqs`` replaces the local sequence count. Returns (loss scalar, denominator used).
    """
    zero = torch.zeros((), dtype=per_token.dtype, device=per_token.device)
    per_seq_sum = torch.where(keep, per_token, zero).sum(dim=1)
    per_seq_len = response_mask.sum(dim=1).to(per_token.dtype).clamp(min=1)
    if num_seqs is None:
        denom = torch.tensor(float(max(per_token.shape[0], 1)), dtype=per_token.dtype, device=per_token.device)
    else:
        denom = _as_denominator(num_seqs, "num_seqs", per_token)
    return (per_seq_sum / per_seq_len).sum() / denom, denom


#: Loss aggregation by name. "token_mean" is the paper's (and the default).
LOSS_AGG: dict[str, LossAgg] = {"token_mean": token_mean, "seq_mean": seq_mean}


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_mask: Tensor | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    num_tokens: float | Tensor | None = None,
    *,
    loss_agg: str = "token_mean",
    num_seqs: float | Tensor | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate, token-level: loss = sum_kept -w min(r A, clip(r, 1-eps_low, 1+eps_high) A) / D.

    r = exp(logprobs - old_logprobs) per token (old_logprobs detached). Kept tokens are
    response tokens with ``loss_mask`` False. D (token_mean) = number of response tokens
    INCLUDING masked ones (Eq. 10: masking multiplies the term by 1 - I_mask, it does not
    shrink the denominator), or ``num_tokens`` when given: pass the global response-token
    count when the batch is split into micro-batches or across ranks, so the parts sum to the
    whole loss and gradient.

    Gradient: exactly zero at padding and masked tokens (their log-ratio is replaced by 0
    before exp, so even an overflowing ratio there cannot produce NaN), and zero where the
    clip is active (A > 0 and r > 1+eps_high, or A < 0 and r < 1-eps_low).

    ``is_weights`` w (the rollout correction, ``ulorl.algo.rollout_correction``; 1 when None) is data:
    it scales each kept token's term and its gradient and is never differentiated. Tokens a correction
    rejects belong in ``loss_mask`` (their weight is 0 and they stay in the denominator, as masked ones do).

    Args:
        logprobs: Float[B, T], current policy log-probs (with grad).
        old_logprobs: Float[B, T], behaviour log-probs per IS mode (see ``select_old_logprobs``).
        advantages: Float[B] (broadcast over tokens) or Float[B, T]; treated as data (detached).
        response_mask: Bool[B, T], True = response token.
        loss_mask: Bool[B, T] or None, True = excluded (e.g. a DMMPT mask).
        eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high] (clip-higher: eps_high > eps_low).
        num_tokens: denominator override for "token_mean" (> 0).
        loss_agg: key of ``LOSS_AGG``.
        num_seqs: denominator override for "seq_mean" (> 0).
        is_weights: Float[B, T] or None, per-token correction weights (detached, >= 0).

    Returns:
        (loss scalar, metrics). Metrics are detached 0-dim tensors over THIS call's response
        tokens (weight them by ``num_tokens`` to combine micro-batches):
        clip_frac (response tokens where clipping is active, masked ones included),
        ratio_mean / ratio_max / ratio_min (over response tokens; NaN if there are none),
        pg_loss (the loss), masked_frac (response tokens excluded by loss_mask),
        num_tokens (local response-token count), denominator (the D used).
    """
    if response_mask.dim() != 2 or response_mask.dtype != torch.bool:
        raise ValueError(
            f"response_mask must be a bool [B, T] tensor, got {response_mask.dtype} {tuple(response_mask.shape)}"
        )
    shape = response_mask.shape
    for name, x in (("logprobs", logprobs), ("old_logprobs", old_logprobs)):
        if x.shape != shape:
            raise ValueError(f"{name} shape {tuple(x.shape)} must equal response_mask shape {tuple(shape)}")
    if advantages.dim() == 1 and advantages.shape[0] == shape[0]:
        adv = advantages.detach().reshape(-1, 1).expand(shape)
    elif advantages.shape == shape:
        adv = advantages.detach()
    else:
        raise ValueError(f"advantages shape {tuple(advantages.shape)} must be [B] or [B, T] for B, T = {tuple(shape)}")
    if loss_mask is None:
        loss_mask = torch.zeros_like(response_mask)
    elif loss_mask.shape != shape or loss_mask.dtype != torch.bool:
        raise ValueError(
            f"loss_mask must be a bool tensor of shape {tuple(shape)}, got {loss_mask.dtype} {tuple(loss_mask.shape)}"
        )
    if eps_low < 0 or eps_low >= 1 or eps_high < 0:
        raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    if loss_agg not in LOSS_AGG:
        raise ValueError(f"loss_agg must be one of {tuple(LOSS_AGG)}, got {loss_agg!r}")
    if is_weights is not None and is_weights.shape != shape:
        raise ValueError(f"is_weights shape {tuple(is_weights.shape)} must equal response_mask shape {tuple(shape)}")

    keep = response_mask & ~loss_mask
    log_ratio = logprobs - old_logprobs.detach()
    zero = torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
    ratio = torch.exp(torch.where(keep, log_ratio, zero))
    adv = adv.to(ratio.dtype)
    surr = ratio * adv
    surr_clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -torch.minimum(surr, surr_clipped)
    if is_weights is not None:
        per_token = per_token * is_weights.detach().to(per_token.dtype)
    loss, denom = LOSS_AGG[loss_agg](per_token, keep, response_mask, num_tokens, num_seqs)

    with torch.no_grad():
        r_all = torch.exp(torch.where(response_mask, log_ratio.detach(), zero))
        n_resp = response_mask.sum()
        n = n_resp.to(r_all.dtype)
        n_safe = n.clamp(min=1)
        clipped = ((adv > 0) & (r_all > 1.0 + eps_high)) | ((adv < 0) & (r_all < 1.0 - eps_low))
        nan = torch.full((), float("nan"), dtype=r_all.dtype, device=r_all.device)
        if int(n_resp) > 0:
            r_sel = r_all[response_mask]
            ratio_mean, ratio_max, ratio_min = r_sel.mean(), r_sel.max(), r_sel.min()
        else:
            ratio_mean = ratio_max = ratio_min = nan
        metrics = {
            "clip_frac": (clipped & response_mask).sum().to(r_all.dtype) / n_safe,
            "ratio_mean": ratio_mean,
            "ratio_max": ratio_max,
            "ratio_min": ratio_min,
            "pg_loss": loss.detach(),
            "masked_frac": (loss_mask & response_mask).sum().to(r_all.dtype) / n_safe,
            "num_tokens": n,
            "denominator": denom.detach(),
        }
    return loss, metrics
