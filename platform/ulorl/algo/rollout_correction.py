"""Train / inference mismatch: its measurement and its correction (pure tensor functions).

The rollout engine samples each response token from its own numerics (vLLM in bf16, the HF engine in
its dtype); the loss uses the trainer's forward. Even under the same weights the two disagree, so the
PPO ratio's denominator ``old`` (the trainer's log-prob, by IS mode: ``select_old_logprobs``) is not
the behaviour policy that drew the token. Per response token t (decoded in segment k at policy
version v_k)::

    mu_t   = log mu_{v_k}(y_t)       the engine's sampled-token log-prob (``Sample.sampling_logprobs``)
    old_t  = log pi_old(y_t)         the PPO ratio's denominator (POIS / TOIS: the current model;
                                     SAIS: the trainer at v_k)
    rho_t  = exp(old_t - mu_t)       the correction ratio, bounded to exp([-20, 20]) (verl's safety bound)

A sequence ratio bounds the sum of its tokens' log-ratios, not each token's: a token at -25 among others
summing to +22 gives rho_s = e^-3, not e^(-20 + 22) (per-token clamping would turn a collapsing ratio into
a large one). The geometric-mean ratio (GSPO's length normalisation, Zheng et al. 2025, arXiv 2507.18071)
divides the summed log-ratio by the sequence's token count, so it stays near 1 at any length where the
per-token gap is small, while the raw product at 128k tokens saturates at e^+-20 whatever the policy did.

A correction mode turns rho into a per-token weight ``w`` that multiplies each token's clipped
surrogate, and a set of rejected tokens that leave the loss (their weight is 0; they stay in the
Eq. 10 denominator, as MPT-masked tokens do)::

    off        w = 1
    token_tis  w = min(rho_t, C)                                   truncated IS (Yao et al.)
    token_mis  w = rho_t, rejected where rho_t > C                 masked IS, token level
    seq_tis    w = min(rho_s, C),  rho_s = prod_{t in s} rho_t      sequence truncated IS
    seq_mis    w = rho_s, rejected (whole sequence) where rho_s > C sequence masked IS
    geo_tis    w = min(rho_g, C),  rho_g = rho_s ** (1 / |s|)      geometric-mean (length-normalised) TIS
    geo_mis    w = rho_g, rejected (whole sequence) where rho_g     geometric-mean masked IS, both sides
               is outside [1 / C, C]                               (verl's default rejection band [1/C, C])
    icepop     w = rho_t, rejected where rho_t outside [alpha, beta] IcePop (Ring-1T, arXiv 2510.18855)

A "sequence" s is the whole response (scope ``response``: the product runs over every segment, each
token with the behaviour log-prob of the version that decoded it) or one segment of it (scope
``segment``); ``sequence_groups`` builds either. platform/ulorl/docs/algorithm.md derives the
choices.

``mismatch_stats`` measures the gap between the engine's and the trainer's log-probs of the same
tokens under the same weights, overall, by segment index and by position bucket.

Shapes: B rows x T positions (the update's [B, L-1] target-aligned tensors); every function is pure
and returns detached tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

#: verl's safety bound on a log importance ratio (token, or summed over a sequence) before exp
LOG_RATIO_BOUND = 20.0
#: per-token bound applied before a sequence sum only to keep it finite (an inf token and a -inf token
#: would sum to NaN); far outside any ratio the sum bound lets through, so it never changes a weight
_FINITE_LOG_RATIO = 1e6
#: ratio band whose outside ``mismatch_stats`` counts (``ratio_out_frac``)
OUT_BAND = (0.5, 2.0)
#: position buckets of the mismatch split: 8 equal spans of max_response_len (16k each at 128k)
POSITION_BUCKETS = 8
SEQ_SCOPES: tuple[str, ...] = ("response", "segment")


@dataclass(frozen=True)
class CorrectionInputs:
    """What a correction mode reads (prime-rl style typed inputs).

    old_logprobs: Float[B, T], the PPO ratio's denominator (``select_old_logprobs``).
    engine_logprobs: Float[B, T], the engine's log-probs of the sampled tokens (finite on response tokens).
    response_mask: Bool[B, T].
    sequence_ids: Long[B, T], the sequence each response token belongs to for the sequence modes
        (``sequence_groups``); ignored by the token modes.
    threshold: C of token_tis / token_mis / seq_tis / seq_mis.
    low, high: IcePop's band [alpha, beta].
    """

    old_logprobs: Tensor
    engine_logprobs: Tensor
    response_mask: Tensor
    sequence_ids: Tensor
    threshold: float = 2.0
    low: float = 0.5
    high: float = 5.0

    def __post_init__(self) -> None:
        m = self.response_mask
        if m.dim() != 2 or m.dtype != torch.bool:
            raise ValueError(f"response_mask must be a bool [B, T] tensor, got {m.dtype} {tuple(m.shape)}")
        for name in ("old_logprobs", "engine_logprobs", "sequence_ids"):
            x = getattr(self, name)
            if x.shape != m.shape:
                raise ValueError(f"{name} shape {tuple(x.shape)} must equal response_mask shape {tuple(m.shape)}")
        if not self.threshold > 0:
            raise ValueError(f"threshold must be > 0, got {self.threshold}")
        if not 0 <= self.low < self.high:
            raise ValueError(f"need 0 <= low < high, got low={self.low}, high={self.high}")

    def raw_log_ratio(self) -> Tensor:
        """Float64[B, T]: old - engine on response tokens, unbounded (finite); 0 elsewhere."""
        lr = (self.old_logprobs.detach().double() - self.engine_logprobs.detach().double())
        lr = lr.nan_to_num(nan=0.0).clamp(-_FINITE_LOG_RATIO, _FINITE_LOG_RATIO)
        return torch.where(self.response_mask, lr, torch.zeros((), dtype=lr.dtype, device=lr.device))

    def log_ratio(self) -> Tensor:
        """Float64[B, T]: old - engine on response tokens, each bounded to [-20, 20]; 0 elsewhere."""
        return self.raw_log_ratio().clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)

    def token_ratio(self) -> Tensor:
        """Float64[B, T]: rho_t on response tokens, 1 elsewhere."""
        return self.log_ratio().exp()

    def sequence_ratio(self) -> Tensor:
        """Float64[B, T]: rho_s of each token's sequence, exp of its tokens' summed (unbounded) log-ratios with
        the sum bounded to [-20, 20]; 1 elsewhere."""
        total = group_sum(self.raw_log_ratio(), self.sequence_ids, self.response_mask)
        return total.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()

    def geometric_ratio(self) -> Tensor:
        """Float64[B, T]: rho_g = rho_s ** (1 / |s|) of each token's sequence, exp of the mean (unbounded)
        log-ratio over its response tokens, the mean bounded to [-20, 20]; 1 elsewhere."""
        resp = self.response_mask
        total = group_sum(self.raw_log_ratio(), self.sequence_ids, resp)
        count = group_sum(resp.to(total.dtype), self.sequence_ids, resp)
        mean = total / count.clamp(min=1.0)
        return mean.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()

    def ratio(self, kind: str) -> Tensor:
        """Float64[B, T]: the ratio a mode reads, by ``kind`` (a value of ``MODE_RATIO``)."""
        if kind == "token":
            return self.token_ratio()
        if kind == "sequence":
            return self.sequence_ratio()
        if kind == "geometric":
            return self.geometric_ratio()
        raise ValueError(f"ratio kind must be one of {RATIO_KINDS}, got {kind!r}")


@dataclass(frozen=True)
class Correction:
    """A mode's output: ``weights`` Float[B, T] (float32, detached; 0 at rejected and non-response
    tokens) multiplies each token's clipped surrogate; ``rejected`` Bool[B, T] are the response tokens
    it leaves out of the loss."""

    weights: Tensor
    rejected: Tensor


CorrectionFn = Callable[[CorrectionInputs], Correction]


def group_sum(values: Tensor, group_ids: Tensor, mask: Tensor) -> Tensor:
    """Per token, the sum of ``values`` over the masked tokens of its group; 0 outside ``mask``.

    values: Float[B, T]; group_ids: Long[B, T] (any non-negative ids, shared across rows or not);
    mask: Bool[B, T]. ``group_sum([[1, 2, 4]], [[0, 0, 1]], all) == [[3, 3, 4]]``.
    """
    out = torch.zeros_like(values)
    if not bool(mask.any()):
        return out
    ids = group_ids[mask].long()
    if bool((ids < 0).any()):
        raise ValueError("group_ids must be >= 0 on masked tokens")
    sums = torch.zeros(int(ids.max()) + 1, dtype=values.dtype, device=values.device).index_add_(0, ids, values[mask])
    out[mask] = sums[ids]
    return out


def sequence_groups(segment_index: Tensor, response_mask: Tensor, scope: str = "response") -> Tensor:
    """Long[B, T] sequence ids for the sequence modes: the row (scope ``response``: the whole response,
    every segment with its own behaviour log-probs) or the (row, segment) pair (scope ``segment``);
    -1 outside the response. segment_index: Long[B, T], the segment of each response token (0-based)."""
    if scope not in SEQ_SCOPES:
        raise ValueError(f"sequence scope must be one of {SEQ_SCOPES}, got {scope!r}")
    b, t = response_mask.shape
    rows = torch.arange(b, device=response_mask.device).reshape(-1, 1).expand(b, t)
    if scope == "response":
        ids = rows
    else:
        width = int(segment_index[response_mask].max()) + 1 if bool(response_mask.any()) else 1
        ids = rows * width + segment_index.long().clamp(min=0)
    return torch.where(response_mask, ids, torch.full((), -1, dtype=torch.long, device=ids.device))


def _result(weights: Tensor, rejected: Tensor, x: CorrectionInputs) -> Correction:
    rej = rejected & x.response_mask
    keep = x.response_mask & ~rej
    zero = torch.zeros((), dtype=weights.dtype, device=weights.device)
    return Correction(torch.where(keep, weights, zero).float(), rej)


def off(x: CorrectionInputs) -> Correction:
    """No correction: weight 1 on every response token."""
    return _result(torch.ones_like(x.old_logprobs, dtype=torch.float64), torch.zeros_like(x.response_mask), x)


def token_tis(x: CorrectionInputs) -> Correction:
    """Truncated IS per token: w = min(rho_t, C)."""
    return _result(x.token_ratio().clamp(max=x.threshold), torch.zeros_like(x.response_mask), x)


def token_mis(x: CorrectionInputs) -> Correction:
    """Masked IS per token: w = rho_t, tokens with rho_t > C rejected."""
    rho = x.token_ratio()
    return _result(rho, rho > x.threshold, x)


def seq_tis(x: CorrectionInputs) -> Correction:
    """Truncated IS per sequence: every token of s gets w = min(rho_s, C)."""
    return _result(x.sequence_ratio().clamp(max=x.threshold), torch.zeros_like(x.response_mask), x)


def seq_mis(x: CorrectionInputs) -> Correction:
    """Masked IS per sequence: w = rho_s, every token of a sequence with rho_s > C rejected."""
    rho = x.sequence_ratio()
    return _result(rho, rho > x.threshold, x)


def geo_tis(x: CorrectionInputs) -> Correction:
    """Truncated IS per sequence on the geometric-mean ratio: every token of s gets w = min(rho_g, C)."""
    return _result(x.geometric_ratio().clamp(max=x.threshold), torch.zeros_like(x.response_mask), x)


def geo_mis(x: CorrectionInputs) -> Correction:
    """Masked IS per sequence on the geometric-mean ratio: w = rho_g, every token of a sequence with rho_g
    outside [1 / C, C] rejected (both sides: at the geometric mean a low ratio is a per-token gap, not a
    long sequence)."""
    rho = x.geometric_ratio()
    return _result(rho, (rho > x.threshold) | (rho < 1.0 / x.threshold), x)


def icepop(x: CorrectionInputs) -> Correction:
    """IcePop: w = rho_t inside [low, high], tokens outside it rejected (both sides)."""
    rho = x.token_ratio()
    return _result(rho, (rho < x.low) | (rho > x.high), x)


#: ``algo.rollout_correction.mode`` -> correction; the config's allowed values are these keys.
ROLLOUT_CORRECTIONS: dict[str, CorrectionFn] = {
    "off": off, "token_tis": token_tis, "token_mis": token_mis, "seq_tis": seq_tis, "seq_mis": seq_mis,
    "geo_tis": geo_tis, "geo_mis": geo_mis, "icepop": icepop,
}
RATIO_KINDS: tuple[str, ...] = ("token", "sequence", "geometric")
#: the ratio each mode weighs by (``CorrectionInputs.ratio``): per token, the sequence's product, or its
#: geometric mean
MODE_RATIO: dict[str, str] = {"off": "token", "token_tis": "token", "token_mis": "token", "seq_tis": "sequence",
                              "seq_mis": "sequence", "geo_tis": "geometric", "geo_mis": "geometric", "icepop": "token"}
#: the modes whose ratio runs over a sequence (they read ``CorrectionInputs.sequence_ids``)
SEQUENCE_MODES: frozenset[str] = frozenset(m for m, kind in MODE_RATIO.items() if kind != "token")


def rollout_correction(name: str) -> CorrectionFn:
    """The correction registered as ``name``; a ValueError names a bad one and the allowed ones."""
    if name not in ROLLOUT_CORRECTIONS:
        raise ValueError(f"rollout correction mode must be one of {tuple(ROLLOUT_CORRECTIONS)}, got {name!r}")
    return ROLLOUT_CORRECTIONS[name]


def correction_stats(c: Correction, x: CorrectionInputs, sequence: bool = False,
                     ratio_kind: str | None = None) -> dict[str, float]:
    """What a correction did, over the response tokens: ``rejected_frac`` (share of response tokens
    rejected), ``truncated_frac`` (share of response tokens kept with a weight below their ratio: a TIS
    mode clipping at C; the ratio is ``ratio_kind``'s, a value of ``MODE_RATIO``, or with ``sequence`` the
    sequence's product) and the weight's mean / min / max over the kept tokens."""
    resp = x.response_mask
    n = int(resp.sum())
    keep = resp & ~c.rejected
    ratio = x.ratio(ratio_kind or ("sequence" if sequence else "token"))
    truncated = keep & (c.weights.double() < ratio * (1 - 1e-6))
    out = {"rejected_frac": float(c.rejected.sum()) / n if n else 0.0,
           "truncated_frac": float(truncated.sum()) / n if n else 0.0}
    w = c.weights[keep].double()
    if w.numel():
        out.update(weight_mean=float(w.mean()), weight_min=float(w.min()), weight_max=float(w.max()))
    return out


# ----------------------------------------------------------------------------- measurement


def position_buckets(positions: Tensor, max_response_len: int, buckets: int = POSITION_BUCKETS) -> Tensor:
    """Long like ``positions``: the bucket of each response position j, ``j // ceil(max_len / buckets)``
    capped at ``buckets - 1`` (at 131,072 tokens: 0-16k, ..., 112k-128k; at 192: 24-token spans)."""
    if max_response_len < 1 or buckets < 1:
        raise ValueError(f"need max_response_len >= 1 and buckets >= 1, got {max_response_len}, {buckets}")
    width = bucket_width(max_response_len, buckets)
    return (positions.long().clamp(min=0) // width).clamp(max=buckets - 1)


def bucket_width(max_response_len: int, buckets: int = POSITION_BUCKETS) -> int:
    """Tokens per position bucket: ``ceil(max_response_len / buckets)``."""
    return max(1, math.ceil(max_response_len / buckets))


def _token_stats(delta: Tensor) -> dict[str, float]:
    """Gap statistics of a flat Float[n] of log-ratio deltas (trainer - engine), n > 0."""
    ratio = delta.exp()
    lo, hi = OUT_BAND
    return {
        "tokens": float(delta.numel()),
        "abs_mean": float(delta.abs().mean()),
        "abs_max": float(delta.abs().max()),
        "delta_mean": float(delta.mean()),
        # k3 estimator of KL(engine || trainer) from tokens the engine sampled: E[(r - 1) - log r]
        "k3_kl": float((ratio - 1 - delta).mean()),
        "ratio_out_frac": float(((ratio < lo) | (ratio > hi)).double().mean()),
    }


def mismatch_stats(trainer_logprobs: Tensor, engine_logprobs: Tensor, measured: Tensor, segment_index: Tensor,
                   positions: Tensor, max_response_len: int, buckets: int = POSITION_BUCKETS) -> dict[str, float]:
    """The same-weights gap between the trainer's and the engine's log-probs of sampled tokens.

    Args:
        trainer_logprobs, engine_logprobs: Float[B, T] log-probs of the same tokens under the same weights.
        measured: Bool[B, T], the tokens to measure (response tokens where both are of the same weights).
        segment_index: Long[B, T], the segment (0-based) of each response token.
        positions: Long[B, T], the response position j of each response token.
        max_response_len: the run's global maximum response length (sets the position buckets).

    Returns (empty when nothing is measured), with delta = trainer - engine, r = exp(delta):
        ``tokens``, ``abs_mean``, ``abs_max``, ``delta_mean``, ``k3_kl`` (mean of r - 1 - delta),
        ``ratio_out_frac`` (share of r outside [0.5, 2]); ``seq_logratio_mean`` / ``seq_logratio_min``
        (per response, the sum of delta over its measured tokens; over responses with one or more);
        the token statistics again per segment (``seg<k>/...``) and per position bucket (``pos<b>/...``).
    """
    if not bool(measured.any()):
        return {}
    delta_all = trainer_logprobs.detach().double() - engine_logprobs.detach().double()
    delta_all = torch.where(measured, delta_all, torch.zeros((), dtype=delta_all.dtype, device=delta_all.device))
    out = _token_stats(delta_all[measured])
    rows = measured.any(dim=1)
    per_seq = delta_all.sum(dim=1)[rows]
    out["seq_logratio_mean"] = float(per_seq.mean())
    out["seq_logratio_min"] = float(per_seq.min())
    seg = segment_index.long()
    for k in sorted(set(seg[measured].tolist())):
        sel = measured & (seg == k)
        out.update({f"seg{k}/{name}": v for name, v in _token_stats(delta_all[sel]).items()})
    bucket = position_buckets(positions, max_response_len, buckets)
    for b in sorted(set(bucket[measured].tolist())):
        sel = measured & (bucket == b)
        out.update({f"pos{b}/{name}": v for name, v in _token_stats(delta_all[sel]).items()})
    return out


__all__ = ["LOG_RATIO_BOUND", "MODE_RATIO", "OUT_BAND", "POSITION_BUCKETS", "RATIO_KINDS", "ROLLOUT_CORRECTIONS",
           "SEQUENCE_MODES", "SEQ_SCOPES", "Correction", "CorrectionFn", "CorrectionInputs", "bucket_width",
           "correction_stats", "geo_mis", "geo_tis", "group_sum", "icepop", "mismatch_stats", "off", "position_buckets",
           "rollout_correction", "seq_mis", "seq_tis", "sequence_groups", "token_mis", "token_tis"]
