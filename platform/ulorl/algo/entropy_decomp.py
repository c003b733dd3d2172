"""Where the entropy goes: the first-order change of mean token entropy, split by token class.

One update moves the parameters by ``dtheta``; the mean token entropy H of a probe batch changes by
``dH ~ <grad H, dtheta>`` to first order. The loss depends on the parameters only through the
sampled tokens' log-probs lp_t, so ``grad L = -sum_t w_t grad lp_t`` with the per-token weight
``w_t = -dL / d lp_t`` (:func:`loss_token_weights`: ``A_t / N`` for the on-policy UloRL loss, 0 where
the PPO clip is active). For a plain gradient step ``dtheta = -lr grad L``::

    dH = lr * sum_t w_t * s_t,        s_t = <grad H, grad lp_t>   (the token's *influence*)

and for Adam with its diagonal preconditioner P frozen at this step's value (``ulorl.train.
entropy_probe``) the same with ``s_t = <P grad H, grad lp_t>`` and ``lr`` times the bias-corrected
share of the fresh gradient. Either way dH is a sum of per-token terms (:func:`first_order_terms`),
so any partition of the tokens splits it exactly, and removing tokens from the loss (a mask)
removes exactly their terms (the weights of the other tokens do not depend on the mask: Eq. 10 keeps
masked tokens in the denominator).

Token classes (:func:`token_classes`): advantage sign x probability bucket of the sampled token,
``pos_high`` (A > 0, p >= tau: the paper's MPTs, ``ulorl.algo.masks.mpt_mask`` with binary rewards),
``pos_mid`` (0.5 <= p < tau), ``pos_low`` (p < 0.5), and the same for A <= 0 (``neg_*``; tokens with
A = 0 have weight 0 and add nothing). :func:`decompose` sums per-token terms per class over the
tokens the loss trains, plus the masked tokens' terms (what the mask removed) apart.

Cheap proxies of the same per-token terms, from the no-grad pass alone (any model size):

* :func:`cov_proxy`: Clip-Cov's token covariance (Cui et al. 2025, arXiv 2505.22617),
  ``-(lp - mean lp)(A - mean A) / N`` centred over the batch's response tokens: their Lemma's
  "entropy change = -Cov(log p, logit change)" with the natural-gradient logit change A;
* :func:`state_cov_proxy`: the same covariance centred per position instead of per batch,
  ``-A (lp + H_t) / N`` (``E_{a ~ p}[log p(a)] = -H_t``: a one-sample estimate of the Lemma's
  per-state covariance).

For a softmax with free logits (tabular) and a sampled token of probability p, the exact term is
``-(A / T^2) [p (lp + H) - sum_k p_k^2 (log p_k + H)]``; with the rest of the mass q = 1 - p on
one token it is ``-(A / T^2) q [p (lp + H) - q (log q + H)]``, of order q^2 log(1/q) as q -> 0. The
batch-centred covariance keeps ``lp - mean lp ~ -mean lp`` for such a token instead: it gives MPTs
a share the exact form does not (platform/ulorl/docs/entropy.md measures both).

Shapes: B x T = samples x response positions (the trainer's [B, L-1] frame); per-token tensors are
Float[B, T] with 0 off the response.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ulorl.algo.entropy_control import check_token_shapes, token_covariance
from ulorl.algo.loss import LOSS_AGG, policy_loss

__all__ = ["BUCKETS", "CLASSES", "MPT_CLASS", "SIGNS", "Agreement", "Decomposition", "agreement",
           "cov_proxy", "decompose", "first_order_terms", "loss_token_weights", "probability_bins",
           "state_cov_proxy", "token_classes", "token_advantages"]

SIGNS = ("pos", "neg")
#: probability buckets of the sampled token: p >= tau, 0.5 <= p < tau, p < 0.5
BUCKETS = ("high", "mid", "low")
CLASSES: tuple[str, ...] = tuple(f"{s}_{b}" for s in SIGNS for b in BUCKETS)
MPT_CLASS = "pos_high"
#: probability edges of :func:`probability_bins` (the map's resolution; tau = 0.8 ... 0.99 are edges)
P_EDGES: tuple[float, ...] = (0.0, 0.5, 0.8, 0.85, 0.9, 0.95, 0.99, 1.0)


def token_advantages(advantages: Tensor, response_mask: Tensor) -> Tensor:
    """Float[B] (one per sample) or Float[B, T] -> Float[B, T], detached, 0 off the response."""
    adv = advantages.detach()
    if adv.dim() == 1 and adv.shape[0] == response_mask.shape[0]:
        adv = adv.reshape(-1, 1).expand(response_mask.shape)
    elif adv.shape != response_mask.shape:
        raise ValueError(f"advantages shape {tuple(adv.shape)} must be [B] or [B, T] for B, T = "
                         f"{tuple(response_mask.shape)}")
    return torch.where(response_mask, adv, torch.zeros((), dtype=adv.dtype, device=adv.device))


def token_classes(token_logprobs: Tensor, advantages: Tensor, response_mask: Tensor, tau: float) -> dict[str, Tensor]:
    """Partition of the response tokens into :data:`CLASSES`, each Bool[B, T].

    Sign: A > 0 is ``pos``, A <= 0 is ``neg``. Bucket of p = exp(lp): ``high`` p >= tau (the same
    comparison as ``mpt_mask``), ``low`` p < 0.5 (and below tau), ``mid`` the rest.

    Args:
        token_logprobs: Float[B, T] log-prob of each sampled token (at the rollout temperature).
        advantages: Float[B] or Float[B, T]; response_mask: Bool[B, T]; tau: in (0, 1].
    """
    check_token_shapes(response_mask, token_logprobs=token_logprobs)
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got {tau}")
    adv = token_advantages(advantages, response_mask)
    p = token_logprobs.detach().exp()
    high = p >= tau
    low = (p < 0.5) & ~high
    mid = ~high & ~low
    pos = (adv > 0) & response_mask
    neg = response_mask & ~pos
    out: dict[str, Tensor] = {}
    for sign, sm in (("pos", pos), ("neg", neg)):
        for bucket, bm in (("high", high), ("mid", mid), ("low", low)):
            out[f"{sign}_{bucket}"] = sm & bm
    return out


def loss_token_weights(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    loss_agg: str = "token_mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> Tensor:
    """``w_t = -dL / d lp_t`` of the clipped token-level loss (``ulorl.algo.policy_loss``) at ``logprobs``,
    over every response token (no mask): Float[B, T], 0 off the response.

    ``grad_theta L = -sum_t w_t grad_theta lp_t`` exactly (the loss depends on the parameters only
    through ``lp``). A masked token's weight is the one it would have: the loss denominators count
    masked tokens (Eq. 10), so the mask changes no other token's weight. On the on-policy first update
    (ratio 1) ``w_t = A_t / N`` (token_mean); where the clip is active, 0. KL-Cov's penalty is not
    part of this loss.
    """
    check_token_shapes(response_mask, logprobs=logprobs, old_logprobs=old_logprobs)
    if loss_agg not in LOSS_AGG:
        raise ValueError(f"loss_agg must be one of {tuple(LOSS_AGG)}, got {loss_agg!r}")
    lp = logprobs.detach().to(torch.float64).clone().requires_grad_(True)
    with torch.enable_grad():
        loss, _ = policy_loss(lp, old_logprobs.detach().to(torch.float64), advantages.detach().to(torch.float64),
                              response_mask, None, eps_low, eps_high, num_tokens, loss_agg=loss_agg, num_seqs=num_seqs)
        (grad,) = torch.autograd.grad(loss, lp)
    return torch.where(response_mask, -grad, torch.zeros((), dtype=grad.dtype, device=grad.device))


def first_order_terms(weights: Tensor, influence: Tensor, scale: float) -> Tensor:
    """Per-token first-order entropy change ``scale * w_t * s_t``: Float[B, T].

    Args:
        weights: Float[B, T] from :func:`loss_token_weights` (0 off the response).
        influence: Float[B, T], ``s_t = <d, grad lp_t>`` with d = grad H (SGD) or P grad H (Adam).
        scale: the step size multiplying ``-grad L`` (``lr``; for Adam the fresh gradient's share).
    """
    if weights.shape != influence.shape:
        raise ValueError(f"weights {tuple(weights.shape)} and influence {tuple(influence.shape)} must match")
    return scale * weights.to(torch.float64) * influence.detach().to(torch.float64)


def cov_proxy(token_logprobs: Tensor, advantages: Tensor, response_mask: Tensor) -> Tensor:
    """Clip-Cov's per-token covariance, negated and over N: ``-(A - mean A)(lp - mean lp) / N``,
    means over the batch's response tokens (``ulorl.algo.entropy_control.token_covariance``).
    Float[B, T] (float64), 0 off the response; the sum is -Cov(lp, A) over the batch's tokens."""
    cov = token_covariance(token_logprobs, advantages, response_mask)
    n = max(int(response_mask.sum()), 1)
    return torch.where(response_mask, -cov / n, torch.zeros((), dtype=cov.dtype, device=cov.device))


def state_cov_proxy(token_logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
                    token_entropy: Tensor) -> Tensor:
    """The covariance centred at each position: ``-A_t (lp_t + H_t) / N``, Float[B, T] (float64), 0 off
    the response. ``lp + H`` is the sampled token's log-prob minus its expectation under the policy at
    that position, so a near-certain token (lp ~ 0, H ~ 0) gets ~0, unlike :func:`cov_proxy`."""
    check_token_shapes(response_mask, token_logprobs=token_logprobs, token_entropy=token_entropy)
    adv = token_advantages(advantages, response_mask).to(torch.float64)
    centred = token_logprobs.detach().to(torch.float64) + token_entropy.detach().to(torch.float64)
    n = max(int(response_mask.sum()), 1)
    out = -adv * centred / n
    return torch.where(response_mask, out, torch.zeros((), dtype=out.dtype, device=out.device))


@dataclass(frozen=True)
class Decomposition:
    """Per-token terms summed by class.

    ``classes[c]``: the terms of class c's *trained* tokens (not masked); ``masked``: the terms of the
    masked tokens (what the loss mask removed); ``mpt``: the MPT class's terms, masked or not (what
    ``pos_high`` carries in the unmasked update); ``tokens`` / ``masked_tokens``: counts per class.
    ``total = sum(classes)`` is the applied update's change, ``unmasked = total + masked`` the
    change without the mask.
    """

    classes: dict[str, float]
    masked: float
    mpt: float
    tokens: dict[str, int]
    masked_tokens: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return math.fsum(self.classes.values())

    @property
    def unmasked(self) -> float:
        return self.total + self.masked

    @property
    def mpt_share(self) -> float:
        """MPT terms / the unmasked update's change (NaN when that is 0). Positive when MPTs move the
        entropy the way the whole update does; above 1 when other classes cancel."""
        u = self.unmasked
        return self.mpt / u if u != 0 else float("nan")

    def metrics(self, prefix: str) -> dict[str, float]:
        """``{prefix}/<class>``, ``{prefix}/masked``, ``{prefix}/total``, ``{prefix}/mpt``,
        ``{prefix}/mpt_share`` (omitted when NaN)."""
        out = {f"{prefix}/{c}": v for c, v in self.classes.items()}
        out.update({f"{prefix}/masked": self.masked, f"{prefix}/total": self.total, f"{prefix}/mpt": self.mpt})
        share = self.mpt_share
        if math.isfinite(share):
            out[f"{prefix}/mpt_share"] = share
        return out


def decompose(per_token: Tensor, classes: Mapping[str, Tensor], loss_mask: Tensor | None = None) -> Decomposition:
    """Sum ``per_token`` (Float[B, T]) over each class's trained tokens, the masked tokens apart.

    Args:
        per_token: Float[B, T] terms (:func:`first_order_terms`, a proxy).
        classes: :func:`token_classes` (a partition of the response tokens).
        loss_mask: Bool[B, T], True = left out of the loss (MPT / DMMPT mask, a masking entropy
            control); None = nothing masked.
    """
    x = per_token.detach().to(torch.float64)
    mask = torch.zeros_like(classes[MPT_CLASS]) if loss_mask is None else loss_mask.to(torch.bool)
    kept = {c: m & ~mask for c, m in classes.items()}
    masked_any = torch.zeros_like(mask)
    for m in classes.values():
        masked_any |= m & mask
    return Decomposition(
        classes={c: float(x[m].sum()) for c, m in kept.items()},
        masked=float(x[masked_any].sum()),
        mpt=float(x[classes[MPT_CLASS]].sum()),
        tokens={c: int(m.sum()) for c, m in kept.items()},
        masked_tokens={c: int((m & mask).sum()) for c, m in classes.items()},
    )


def probability_bins(per_token: Tensor, token_logprobs: Tensor, advantages: Tensor, response_mask: Tensor,
                     edges: Sequence[float] = P_EDGES) -> dict[str, dict[str, float]]:
    """Per-token terms summed by advantage sign and probability bin [edges[i], edges[i+1]) (the last
    bin closed at 1): ``{"pos": {"0.95-0.99": x, ...}, "neg": {...}}``. The MPT term at threshold
    tau = an edge is the sum of the ``pos`` bins from tau up."""
    check_token_shapes(response_mask, per_token=per_token, token_logprobs=token_logprobs)
    if list(edges) != sorted(edges) or edges[0] > 0.0 or edges[-1] < 1.0:
        raise ValueError(f"edges must be increasing from <= 0 to >= 1, got {list(edges)}")
    x = per_token.detach().to(torch.float64)
    p = token_logprobs.detach().to(torch.float64).exp()
    adv = token_advantages(advantages, response_mask)
    out: dict[str, dict[str, float]] = {}
    for sign, sm in (("pos", (adv > 0) & response_mask), ("neg", response_mask & ~(adv > 0))):
        row: dict[str, float] = {}
        for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
            last = i == len(edges) - 2
            in_bin = (p >= lo) & ((p <= hi) if last else (p < hi))
            row[f"{lo:g}-{hi:g}"] = float(x[sm & in_bin].sum())
        out[sign] = row
    return out


@dataclass(frozen=True)
class Agreement:
    """How well a proxy tracks the exact terms over paired values (e.g. steps x classes)."""

    n: int
    pearson: float        # NaN with < 2 values or a constant side
    spearman: float
    sign_agreement: float  # fraction of pairs with the same sign (pairs where either is 0 count as agreeing
    #                        only when both are 0)


def _ranks(x: Sequence[float]) -> list[float]:
    order = sorted(range(len(x)), key=lambda i: x[i])
    ranks = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0
        i = j + 1
    return ranks


def _pearson(x: Sequence[float], y: Sequence[float]) -> float:
    n = len(x)
    if n < 2:
        return float("nan")
    mx, my = math.fsum(x) / n, math.fsum(y) / n
    sxy = math.fsum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = math.fsum((a - mx) ** 2 for a in x)
    syy = math.fsum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


def agreement(proxy: Sequence[float], exact: Sequence[float]) -> Agreement:
    """Pearson and Spearman correlation and sign agreement of paired proxy / exact values."""
    if len(proxy) != len(exact):
        raise ValueError(f"need paired values, got {len(proxy)} proxy and {len(exact)} exact")
    x, y = [float(v) for v in proxy], [float(v) for v in exact]
    same = sum(1 for a, b in zip(x, y) if (a > 0 and b > 0) or (a < 0 and b < 0) or (a == 0 and b == 0))
    return Agreement(n=len(x), pearson=_pearson(x, y), spearman=_pearson(_ranks(x), _ranks(y)),
                     sign_agreement=same / len(x) if x else float("nan"))
