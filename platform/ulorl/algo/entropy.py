"""Per-token entropy of the (temperature-scaled) policy, chunked over tokens."""

from __future__ import annotations

import torch
from torch import Tensor

from ulorl.algo._chunking import check_temperature, compute_dtype, resolve_chunk_rows


def _chunk_entropy(x: Tensor) -> Tensor:
    """x: Float[c, V] scaled logits (a fresh tensor, may be modified in place) -> Float[c]."""
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    # In place only when no graph is recorded (logsumexp saves x for its backward).
    logp = x - lse if (x.requires_grad and torch.is_grad_enabled()) else x.sub_(lse)
    p = logp.exp()
    # p * logp is NaN where a logit is -inf (0 * -inf); such tokens contribute 0.
    plogp = torch.where(p > 0, p * logp, torch.zeros((), dtype=p.dtype, device=p.device))
    return -plogp.sum(dim=-1)


def token_entropy(logits: Tensor, chunk_size: int | None = None, temperature: float = 1.0) -> Tensor:
    """Natural-log entropy H = -sum_j p_j log p_j of softmax(logits / temperature).

    The leading dims are flattened into N token rows and processed ``chunk_size`` rows at a
    time; each chunk is upcast to float32 (bf16/fp16 inputs), so the float32 temporaries are
    [chunk_size x V], never [N x V]. Stable: log p = x - logsumexp(x).

    The memory bound holds when no autograd graph is recorded (``torch.no_grad()`` or a
    detached input), which is how the trainer uses it: entropy only gates the DMMPT mask and
    is logged. With autograd on, the result is differentiable but each chunk's temporaries are
    kept for backward. For entropy together with log-probs in one pass over the logits, use
    :func:`ulorl.algo.logprobs_and_entropy`.

    Args:
        logits: Float[..., V] (any float dtype).
        chunk_size: rows per chunk; None = auto (float32 chunk of at most 2**24 elements).
        temperature: the rollout temperature; entropy of softmax(logits / temperature).

    Returns:
        Float[...] (float32; float64 for float64 input), shape ``logits.shape[:-1]``.
    """
    t = check_temperature(temperature)
    if logits.dim() < 1:
        raise ValueError("logits must have a vocabulary dim [..., V]")
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    n = flat.shape[0]
    cd = compute_dtype(logits.dtype)
    if n == 0:
        return torch.zeros(lead, dtype=cd, device=logits.device)
    rows = resolve_chunk_rows(n, vocab, chunk_size)
    parts = [_chunk_entropy(torch.div(flat[s : s + rows].to(cd), t)) for s in range(0, n, rows)]
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    return out.reshape(lead)
