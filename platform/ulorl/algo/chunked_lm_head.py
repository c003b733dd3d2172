"""Token log-probs and entropy straight from final hidden states, chunked through the LM head.

``logprobs_from_hidden(hidden, weight, labels)`` equals
``logprobs_and_entropy(hidden @ weight.T (+ bias), labels)`` but never holds a ``[tokens x V]``
tensor of the whole row, in forward or in backward: the forward walks the tokens in chunks,
computes each chunk's logits ``[c, V]``, keeps only one float32 logsumexp and one entropy per
token and drops the logits; the backward recomputes each chunk's logits and turns them into the
chunk's gradients for the hidden states ``[c, H]`` and the weight ``[V, H]`` (accumulated in
float32). Peak extra memory: a few ``[c, V]`` float32 temporaries plus one float32 ``[V, H]``.

Gradients (x = logits / t, p = softmax(x), H = entropy):
  d log p(l) / d logits_j = (1[j = l] - p_j) / t
  d H / d logits_j        = -p_j (log p_j + H) / t

Positions with label < 0 are skipped entirely (no logits computed): log-prob 0, entropy 0, no
gradient. Tied input/output embeddings need nothing special: pass ``lm_head.weight`` (the same
Parameter as the input embedding), autograd accumulates both uses into it.

Under autocast the chunk matmuls run in the autocast dtype (as ``lm_head`` would), softmax math in
float32. A DeepSpeed ZeRO-3 partitioned head weight is refused (``is_zero3_param``): the
trainer then takes the model's own forward (``ulorl.train.forward``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, cast

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ulorl.algo._chunking import check_temperature, compute_dtype

#: Token rows per chunk by default: one float32 [rows x V] temporary of at most this many elements
#: (2**25 = 128 MiB; 220 rows at Qwen3's V = 151,936). Much smaller chunks are slower on CPU: each
#: chunk's weight-gradient update reads and writes the whole float32 [V, H].
HIDDEN_CHUNK_ELEMENTS = 2**25


def hidden_chunk_rows(vocab: int, chunk_tokens: Optional[int]) -> int:
    """Rows per chunk: ``chunk_tokens`` if given (>= 1), else max(1, HIDDEN_CHUNK_ELEMENTS // vocab)."""
    if chunk_tokens is None:
        return max(1, HIDDEN_CHUNK_ELEMENTS // max(1, vocab))
    if int(chunk_tokens) < 1:
        raise ValueError(f"logprob chunk size must be >= 1 token, got {chunk_tokens}")
    return int(chunk_tokens)


def _matmul_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype ``F.linear(hidden, weight)`` computes in here (autocast's if it applies)."""
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev) and hidden.is_floating_point():
        return torch.get_autocast_dtype(dev)
    return torch.promote_types(hidden.dtype, weight.dtype)


class _LinearLogProbs(torch.autograd.Function):
    """h Float[N, H], W Float[V, H], b Float[V] | None, labels Long[N] (all >= 0) -> (logp Float[N], ent Float[N])."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, h: Tensor, weight: Tensor, bias: Optional[Tensor], labels: Tensor,
        temperature: float, rows: int, mm_dtype: torch.dtype, with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)  # an unused output (often the entropy) gets None, not zeros
        n = h.shape[0]
        cd = compute_dtype(mm_dtype)
        logp = torch.empty(n, dtype=cd, device=h.device)
        lse_all = torch.empty(n, dtype=cd, device=h.device)
        ent = torch.zeros(n if with_entropy else 0, dtype=cd, device=h.device)
        zero = torch.zeros((), dtype=cd, device=h.device)
        w = weight.to(mm_dtype)
        # scale the [c, H] input (and bias) by 1 / t rather than the [c, V] logits: one pass less
        b = (bias / temperature).to(mm_dtype) if bias is not None else None
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, n, rows):
                e = min(s + rows, n)
                x = torch.nn.functional.linear((h[s:e] / temperature).to(mm_dtype), w, b).to(cd)
                lse = torch.logsumexp(x, dim=-1)
                lse_all[s:e] = lse
                logp[s:e] = x.gather(-1, labels[s:e, None]).squeeze(-1) - lse
                if with_entropy:
                    x.sub_(lse[:, None])  # log p
                    p = x.exp()
                    ent[s:e] = -torch.where(p > 0, p * x, zero).sum(dim=-1)
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(h, weight, bias, labels, lse_all, ent)
        ctx.temperature, ctx.rows, ctx.mm_dtype = temperature, rows, mm_dtype
        return logp, ent

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g_logp: Optional[Tensor], g_ent: Optional[Tensor]) -> tuple[Optional[Tensor], ...]:
        h, weight, bias, labels, lse_all, ent = ctx.saved_tensors
        t: float = ctx.temperature
        rows: int = ctx.rows
        mm: torch.dtype = ctx.mm_dtype
        n = h.shape[0]
        cd = lse_all.dtype
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        zero = torch.zeros((), dtype=cd, device=h.device)
        gl = (g_logp.to(cd) / t) if g_logp is not None else None
        ge = (g_ent.to(cd) / t) if (g_ent is not None and ent.numel()) else None
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=cd, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=cd, device=weight.device) if need_b else None
        w = weight.to(mm)
        b = (bias / t).to(mm) if bias is not None else None
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, n, rows):
                e = min(s + rows, n)
                hc = h[s:e].to(mm)
                logp = torch.nn.functional.linear(hc / t, w, b).to(cd).sub_(lse_all[s:e, None])
                if ge is not None:  # -p (log p + H) * gH
                    p = logp.exp()
                    gx = torch.where(p > 0, p * (logp + ent[s:e, None]), zero).mul_(-ge[s:e, None])
                    if gl is not None:
                        gx.sub_(p * gl[s:e, None])
                else:
                    gx = logp.exp_().mul_(-gl[s:e, None]) if gl is not None else torch.zeros_like(logp)
                if gl is not None:  # + 1[j = l] * gl  (with the -p * gl above)
                    gx.scatter_add_(-1, labels[s:e, None], gl[s:e, None])
                gxm = gx.to(mm)
                if grad_h is not None:
                    grad_h[s:e] = (gxm @ w).to(h.dtype)
                if grad_w is not None:
                    if mm == cd:
                        grad_w.addmm_(gxm.t(), hc)  # in place: no [V, H] temporary per chunk
                    else:
                        grad_w.add_((gxm.t() @ hc).to(cd))
                if grad_b is not None:
                    grad_b.add_(gx.sum(0))
        return (
            grad_h,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None, None, None, None, None,
        )


def is_zero3_param(weight: Tensor) -> bool:
    """A DeepSpeed ZeRO-3 partitioned parameter (its data lives in shards outside a forward)."""
    return hasattr(weight, "ds_id")


def logprobs_from_hidden(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    temperature: float = 1.0,
    bias: Optional[Tensor] = None,
    chunk_tokens: Optional[int] = None,
    lm_head: Optional[Callable[[Tensor], Tensor]] = None,
    with_entropy: bool = True,
) -> tuple[Tensor, Tensor]:
    """(log-probs, entropy) of softmax((hidden @ weight.T + bias) / temperature), chunked over tokens.

    Args:
        hidden: Float[..., H] final hidden states (after the model's final norm), positions
            aligned with ``labels`` (slice ``[:, :-1]`` for next-token targets).
        weight: Float[V, H] the LM head weight (``model.get_output_embeddings().weight``).
        labels: Int[...] = hidden.shape[:-1]; < 0 = skipped (log-prob 0, entropy 0, no gradient).
        temperature: rollout temperature (> 0).
        bias: Float[V] LM head bias, if the model has one.
        chunk_tokens: token rows per chunk; None = auto (float32 [rows x V] of <= 2**25 elements).
        lm_head: unused; kept for callers that pass the head module.
        with_entropy: False skips the entropy (returned as zeros, not differentiable): the
            training pass needs log-probs only.

    Returns:
        (logprobs Float[...], entropy Float[...]), float32 (float64 for float64 inputs). Both are
        differentiable w.r.t. ``hidden``, ``weight`` and ``bias``.
    """
    t = check_temperature(temperature)
    if labels.shape != hidden.shape[:-1]:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal hidden shape without the hidden dim "
            f"{tuple(hidden.shape[:-1])}"
        )
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise TypeError(f"labels must be an integer tensor, got {labels.dtype}")
    lead = hidden.shape[:-1]
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_l = labels.reshape(-1).long()
    valid = flat_l >= 0
    idx = valid.nonzero().squeeze(-1)
    n_all = flat_l.shape[0]
    if is_zero3_param(weight):
        # Through the partitioned head the ZeRO-3 gradients came out wrong (1e-3 vs torch on the
        # 2-rank test): callers take the model's own forward (``full`` path) under ZeRO-3.
        raise ValueError("a DeepSpeed ZeRO-3 partitioned LM head weight: use the full log-prob path")
    vocab = weight.shape[0]
    rows = hidden_chunk_rows(vocab, chunk_tokens)
    mm = _matmul_dtype(flat_h, weight)
    cd = compute_dtype(mm)
    h_valid = flat_h.index_select(0, idx)
    l_valid = flat_l.index_select(0, idx)
    lp_v, ent_v = cast(tuple[Tensor, Tensor], _LinearLogProbs.apply(h_valid, weight, bias, l_valid, t, rows, mm, with_entropy))  # type: ignore[no-untyped-call]
    lp = torch.zeros(n_all, dtype=cd, device=hidden.device).index_put((idx,), lp_v.to(cd))
    ent = torch.zeros(n_all, dtype=cd, device=hidden.device)
    if ent_v.numel():
        ent = ent.index_put((idx,), ent_v.to(cd))
    return lp.reshape(lead), ent.reshape(lead)
