"""Token sampling shared by the rollout engines: counter-based uniforms and one batched draw.

Every draw of a request is a pure function of ``(sampling seed, request seed, response position,
logits)``: the uniform for response position ``p`` of a request is a hash of its seed and ``p``
(``counter_uniforms``), and the token is drawn by inverting the (truncated) CDF at that uniform.
So a request's tokens do not depend on which other requests share its batch, on the batching
regime, or on row order — and two runs with the same seeds give the same tokens.

Returned log-probs are ``log_softmax(logits / T)`` at the drawn token, i.e. of the full
temperature-scaled distribution BEFORE top-k / top-p truncation (what the trainer recomputes).
"""

from __future__ import annotations

import numpy as np
import torch

from ulorl.rollout.types import SamplingParams

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    z = z.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z


def counter_uniforms(seeds: list[int], start_positions: list[int], n: int) -> np.ndarray:
    """Uniforms in [0, 1) for positions ``start .. start + n - 1`` of each seed, float64 [B, n].

    ``u[b, j] = H(seed_b, start_b + j)`` with H a splitmix64 hash: independent of the batch.
    """
    s = _mix64(np.asarray([x & 0xFFFFFFFFFFFFFFFF for x in seeds], dtype=np.uint64))
    pos = np.asarray(start_positions, dtype=np.uint64)[:, None] + np.arange(n, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        z = _mix64(s[:, None] + (pos + np.uint64(1)) * _GOLDEN)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def combine_seed(sampling_seed: int, request_seed: int) -> int:
    """One 64-bit stream key from the call-level and the request-level seed."""
    a = _mix64(np.asarray([sampling_seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        z = _mix64(np.asarray([a ^ np.uint64(request_seed & 0xFFFFFFFFFFFFFFFF)], dtype=np.uint64))[0]
    return int(z)


def truncation_active(sampling: SamplingParams) -> bool:
    return (sampling.top_k is not None and sampling.top_k > 0) or sampling.top_p < 1.0


def sample_tokens(logits: torch.Tensor, sampling: SamplingParams,
                  u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row.

    logits: [B, V] (any float dtype; computed in float32). u: [B] float64 uniforms (ignored when
    greedy). Returns ``(tokens [B] int64, logprobs [B] float32)`` with
    ``logprobs = log_softmax(logits / T)[token]`` (before truncation).

    top-k keeps the k most likely tokens (``top_k <= 0`` = off); top-p then keeps, in the
    renormalised top-k distribution sorted by probability, each token whose preceding mass is
    below ``top_p`` (the smallest set with mass >= top_p; ``top_p = 1`` = off).
    """
    logits = logits.float()
    temp = float(sampling.temperature)
    logp = torch.log_softmax(logits / temp, dim=-1)
    if sampling.greedy:
        tok = logits.argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    if u is None:
        raise ValueError("sampling needs uniforms")
    if not truncation_active(sampling):
        cdf = logp.exp().double().cumsum(dim=-1)
        idx = _invert_cdf(cdf, u)
        tok = idx
    else:
        vocab = logp.shape[-1]
        k = sampling.top_k if sampling.top_k is not None and 0 < sampling.top_k < vocab else vocab
        if k < vocab:
            top_lp, top_idx = torch.topk(logp, k, dim=-1)          # sorted descending
        else:
            top_lp, top_idx = torch.sort(logp, dim=-1, descending=True)
        probs = top_lp.double().exp()
        probs = probs / probs.sum(dim=-1, keepdim=True)
        if sampling.top_p < 1.0:
            before = probs.cumsum(dim=-1) - probs
            probs = torch.where(before < sampling.top_p, probs, torch.zeros_like(probs))
        cdf = probs.cumsum(dim=-1)
        j = _invert_cdf(cdf, u)
        tok = top_idx.gather(-1, j[:, None]).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def _invert_cdf(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """First index i with cdf[i] > u * total: always a token of positive probability. [B]."""
    total = cdf[:, -1:]
    x = torch.minimum(u.to(cdf.dtype)[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    idx = torch.searchsorted(cdf, x, right=True).squeeze(-1)
    return idx.clamp_(max=cdf.shape[-1] - 1)
