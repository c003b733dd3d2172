"""Token log-probs (and entropy) from logits, chunked over tokens, memory-lean under autograd.

Both functions go through one custom autograd Function. Its forward walks the token rows in
chunks, upcasting each chunk to float32, and saves only the input logits (already alive in the
model's graph) plus one float32 logsumexp per token. Its backward recomputes softmax chunk by
chunk: d log p(l) / d x_j = (1[j = l] - p_j) / temperature. So no [tokens x vocab] float32
tensor is ever held whole, with or without autograd; the only full-size tensor created is the
gradient of the logits itself, in the logits' dtype.

Labels < 0 (e.g. -100 padding) give log-prob 0 and zero gradient.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ulorl.algo._chunking import check_labels, check_temperature, compute_dtype, resolve_chunk_rows


class _ChunkedLogProbs(torch.autograd.Function):
    """logits2d Float[N, V], labels Long[N] -> (logprobs Float[N], entropy Float[N] or empty)."""

    @staticmethod
    def forward(
        ctx: Any, logits2d: Tensor, labels: Tensor, temperature: float, rows: int, with_entropy: bool
    ) -> tuple[Tensor, Tensor]:
        n, _ = logits2d.shape
        cd = compute_dtype(logits2d.dtype)
        dev = logits2d.device
        valid = labels >= 0
        safe_labels = torch.where(valid, labels, torch.zeros_like(labels))
        logp = torch.empty(n, dtype=cd, device=dev)
        lse_all = torch.empty(n, dtype=cd, device=dev)
        ent = torch.empty(n if with_entropy else 0, dtype=cd, device=dev)
        zero = torch.zeros((), dtype=cd, device=dev)
        for s in range(0, n, rows):
            e = min(s + rows, n)
            x = torch.div(logits2d[s:e].to(cd), temperature)
            lse = torch.logsumexp(x, dim=-1)
            lse_all[s:e] = lse
            logp[s:e] = x.gather(-1, safe_labels[s:e, None]).squeeze(-1) - lse
            if with_entropy:
                x.sub_(lse[:, None])  # x is now log p
                p = x.exp()
                ent[s:e] = -torch.where(p > 0, p * x, zero).sum(dim=-1)
        logp = torch.where(valid, logp, zero)
        ctx.save_for_backward(logits2d, safe_labels, valid, lse_all)
        ctx.temperature = temperature
        ctx.rows = rows
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_logp: Tensor, grad_ent: Tensor | None) -> tuple[Tensor | None, ...]:
        logits2d, labels, valid, lse_all = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        t: float = ctx.temperature
        rows: int = ctx.rows
        n, _ = logits2d.shape
        cd = lse_all.dtype
        g = torch.where(valid, grad_logp.to(cd), torch.zeros((), dtype=cd, device=grad_logp.device)) / t
        grad = torch.empty_like(logits2d)
        for s in range(0, n, rows):
            e = min(s + rows, n)
            x = torch.div(logits2d[s:e].to(cd), t)
            p = x.sub_(lse_all[s:e, None]).exp_()
            gx = p.mul_(-g[s:e, None])  # -p_j * g
            gx.scatter_add_(-1, labels[s:e, None], g[s:e, None])  # + 1[j = label] * g
            grad[s:e] = gx.to(logits2d.dtype)
        return grad, None, None, None, None


def _prepare(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    if logits.dim() < 1:
        raise ValueError("logits must have a vocabulary dim [..., V]")
    check_labels(labels, logits.shape[:-1], "logits", "vocab")
    vocab = logits.shape[-1]
    # A copy happens here only for non-contiguous logits (e.g. logits[:, :-1]); slice before
    # the model's lm_head, or accept one copy in the logits' dtype.
    return logits.reshape(-1, vocab), labels.reshape(-1).long()


def logprobs_and_entropy(
    logits: Tensor,
    labels: Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Log-prob of each label and the entropy of each position, in one chunked pass.

    Both use softmax(logits / temperature), the distribution the rollout sampled from.
    The log-probs are differentiable w.r.t. ``logits`` (memory-lean backward, see module doc);
    the entropy is computed without a graph (it is returned detached): it only gates the DMMPT
    mask and is logged, UloRL has no entropy bonus.

    Args:
        logits: Float[..., V] (bf16/fp16 upcast per chunk to float32).
        labels: Int[...] = logits.shape[:-1], the sampled token at each position (< 0 = ignore).
        temperature: rollout temperature (> 0).
        chunk_size: token rows per chunk; None = auto (float32 chunk of at most 2**24 elements).

    Returns:
        (logprobs Float[...], entropy Float[...]), float32 (float64 for float64 logits).
    """
    t = check_temperature(temperature)
    flat, lab = _prepare(logits, labels)
    lead = logits.shape[:-1]
    rows = resolve_chunk_rows(flat.shape[0], flat.shape[1], chunk_size)
    logp, ent = cast(tuple[Tensor, Tensor], _ChunkedLogProbs.apply(flat, lab, t, rows, True))
    return logp.reshape(lead), ent.reshape(lead)


def logprobs_from_logits(
    logits: Tensor,
    labels: Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> Tensor:
    """log softmax(logits / temperature)[label] per position, chunked, differentiable.

    Args:
        logits: Float[..., V].
        labels: Int[...] = logits.shape[:-1] (< 0 = ignore: log-prob 0, no gradient).
        temperature: rollout temperature (> 0).
        chunk_size: token rows per chunk; None = auto.

    Returns:
        Float[...] log-probs (float32; float64 for float64 logits).
    """
    t = check_temperature(temperature)
    flat, lab = _prepare(logits, labels)
    rows = resolve_chunk_rows(flat.shape[0], flat.shape[1], chunk_size)
    logp, _ = cast(tuple[Tensor, Tensor], _ChunkedLogProbs.apply(flat, lab, t, rows, False))
    return logp.reshape(logits.shape[:-1])
