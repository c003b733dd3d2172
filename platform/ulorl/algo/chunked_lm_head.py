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
float32. A DeepSpeed ZeRO-3 partitioned head weight (``is_zero3_param``) goes through the head
module instead (``_HeadModuleLogProbs``: ZeRO-3's module hooks gather it per chunk in forward and
in the backward recompute, its gradient is handed to ZeRO-3's reduction once per backward).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ulorl.algo._chunking import check_labels, check_temperature, compute_dtype

#: Token rows per chunk by default: one float32 [rows x V] temporary of at most this many elements
#: (2**25 = 128 MiB; 220 rows at Qwen3's V = 151,936). Much smaller chunks are slower on CPU: each
#: chunk's weight-gradient update reads and writes the whole float32 [V, H].
HIDDEN_CHUNK_ELEMENTS = 2**25


def hidden_chunk_rows(vocab: int, chunk_tokens: int | None) -> int:
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


def _chunk_stats(x: Tensor, labels: Tensor, lse_out: Tensor, logp_out: Tensor, ent_out: Tensor | None) -> None:
    """One chunk's logsumexp, log p(label) and entropy into the ``*_out`` views (Float[c] each).

    x Float[c, V]: the chunk's logits divided by the temperature (overwritten); labels Long[c].
    """
    lse = torch.logsumexp(x, dim=-1)
    lse_out.copy_(lse)
    logp_out.copy_(x.gather(-1, labels[:, None]).squeeze(-1) - lse)
    if ent_out is not None:
        x.sub_(lse[:, None])  # log p
        p = x.exp()
        ent_out.copy_(-torch.where(p > 0, p * x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=-1))


def _logits_grad(logp: Tensor, labels: Tensor, ent: Tensor | None, gl: Tensor | None,
                 ge: Tensor | None) -> Tensor:
    """Gradient w.r.t. one chunk's raw logits: Float[c, V] (overwrites ``logp``, Float[c, V] log p).

    labels Long[c]; ent Float[c] the entropies (with ``ge``); gl, ge Float[c] the incoming gradients
    of log p(label) and of the entropy, already divided by the temperature.
    """
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    if ge is not None and ent is not None:  # -p (log p + H) * gH
        p = logp.exp()
        gx = torch.where(p > 0, p * (logp + ent[:, None]), zero).mul_(-ge[:, None])
        if gl is not None:
            gx.sub_(p * gl[:, None])
    else:
        gx = logp.exp_().mul_(-gl[:, None]) if gl is not None else torch.zeros_like(logp)
    if gl is not None:  # + 1[j = l] * gl  (with the -p * gl above)
        gx.scatter_add_(-1, labels[:, None], gl[:, None])
    return gx


class _LinearLogProbs(torch.autograd.Function):
    """h Float[N, H], W Float[V, H], b Float[V] | None, labels Long[N] (all >= 0) -> (logp Float[N], ent Float[N])."""

    @staticmethod
    def forward(
        ctx: Any, h: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor,
        temperature: float, rows: int, mm_dtype: torch.dtype, with_entropy: bool,
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)  # an unused output (often the entropy) gets None, not zeros
        n = h.shape[0]
        cd = compute_dtype(mm_dtype)
        logp = torch.empty(n, dtype=cd, device=h.device)
        lse_all = torch.empty(n, dtype=cd, device=h.device)
        ent = torch.zeros(n if with_entropy else 0, dtype=cd, device=h.device)
        w = weight.to(mm_dtype)
        # scale the [c, H] input (and bias) by 1 / t rather than the [c, V] logits: one pass less
        b = (bias / temperature).to(mm_dtype) if bias is not None else None
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, n, rows):
                e = min(s + rows, n)
                x = torch.nn.functional.linear((h[s:e] / temperature).to(mm_dtype), w, b).to(cd)
                _chunk_stats(x, labels[s:e], lse_all[s:e], logp[s:e], ent[s:e] if with_entropy else None)
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(h, weight, bias, labels, lse_all, ent)
        ctx.temperature, ctx.rows, ctx.mm_dtype = temperature, rows, mm_dtype
        return logp, ent

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g_logp: Tensor | None, g_ent: Tensor | None) -> tuple[Tensor | None, ...]:
        h, weight, bias, labels, lse_all, ent = ctx.saved_tensors
        t: float = ctx.temperature
        rows: int = ctx.rows
        mm: torch.dtype = ctx.mm_dtype
        n = h.shape[0]
        cd = lse_all.dtype
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
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
                gx = _logits_grad(logp, labels[s:e], ent[s:e] if ge is not None else None,
                                  gl[s:e] if gl is not None else None, ge[s:e] if ge is not None else None)
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


def _set_grad_ready(params: Sequence[Tensor], ready: bool) -> None:
    """ZeRO-3's flag: a parameter whose gradient hook fires with ``ds_grad_is_ready`` False keeps
    accumulating ``.grad`` instead of queueing it for reduction (DeepSpeed's tiled-compute protocol)."""
    for p in params:
        p.ds_grad_is_ready = ready  # type: ignore[attr-defined]


class _HeadModuleLogProbs(torch.autograd.Function):
    """The same as ``_LinearLogProbs`` through the head *module*, for ZeRO-3 partitioned weights.

    h Float[N, H], labels Long[N] (all >= 0) -> (logp Float[N], ent Float[N]). ZeRO-3 gathers a
    parameter only inside its module's forward / backward (module hooks), and reduces its gradient
    from the hook on ``.grad`` accumulation; so, as DeepSpeed's ``SequenceTiledCompute`` does, the
    forward calls ``head`` per chunk without a graph, and the backward recomputes each chunk through
    ``head`` with a graph and runs a nested ``torch.autograd.backward`` from the chunk's logits
    gradient: the hidden-state gradient lands in the chunk's leaf, the weight gradient accumulates
    in ``weight.grad`` with ``ds_grad_is_ready`` False on every chunk but the last, so ZeRO-3
    reduces the weight once, with the sum. A head tied to the input embedding (``tied``) gets its
    embedding gradient later in the same backward: it stays unready through all chunks and is
    reduced when that last contribution arrives. Outputs are the ``head`` dtype's logits in float32.
    """

    @staticmethod
    def forward(
        ctx: Any, h: Tensor, labels: Tensor, head: torch.nn.Module, temperature: float, rows: int,
        with_entropy: bool, tied: bool,
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        n = h.shape[0]
        cd = torch.float64 if h.dtype == torch.float64 else torch.float32
        logp = torch.empty(n, dtype=cd, device=h.device)
        lse_all = torch.empty(n, dtype=cd, device=h.device)
        ent = torch.zeros(n if with_entropy else 0, dtype=cd, device=h.device)
        for s in range(0, n, rows):
            e = min(s + rows, n)
            x = head(h[s:e]).to(cd).div_(temperature)
            _chunk_stats(x, labels[s:e], lse_all[s:e], logp[s:e], ent[s:e] if with_entropy else None)
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(h, labels, lse_all, ent)
        ctx.head, ctx.temperature, ctx.rows, ctx.tied = head, temperature, rows, tied
        dev = h.device.type
        ctx.autocast = (torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
        return logp, ent

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g_logp: Tensor | None, g_ent: Tensor | None) -> tuple[Tensor | None, ...]:
        h, labels, lse_all, ent = ctx.saved_tensors
        head: torch.nn.Module = ctx.head
        t: float = ctx.temperature
        rows: int = ctx.rows
        n = h.shape[0]
        cd = lse_all.dtype
        params = [p for p in head.parameters() if p.requires_grad]
        gl = (g_logp.to(cd) / t) if g_logp is not None else None
        ge = (g_ent.to(cd) / t) if (g_ent is not None and ent.numel()) else None
        need_h = ctx.needs_input_grad[0]
        grad_h = torch.empty_like(h) if need_h else None
        if gl is None and ge is None:
            return (grad_h.zero_() if grad_h is not None else None, None, None, None, None, None, None)
        enabled, dtype = ctx.autocast
        starts = list(range(0, n, rows))
        try:
            for i, s in enumerate(starts):
                e = min(s + rows, n)
                _set_grad_ready(params, i == len(starts) - 1 and not ctx.tied)
                hc = h[s:e].detach().requires_grad_(need_h)
                with torch.enable_grad(), torch.autocast(h.device.type, dtype=dtype, enabled=enabled):
                    x = head(hc)
                logp = x.detach().to(cd).div_(t).sub_(lse_all[s:e, None])
                gx = _logits_grad(logp, labels[s:e], ent[s:e] if ge is not None else None,
                                  gl[s:e] if gl is not None else None, ge[s:e] if ge is not None else None)
                torch.autograd.backward(x, gx.to(x.dtype))
                if grad_h is not None and hc.grad is not None:
                    grad_h[s:e] = hc.grad
        finally:
            _set_grad_ready(params, True)
        return (grad_h, None, None, None, None, None, None)


def logprobs_from_hidden(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    temperature: float = 1.0,
    bias: Tensor | None = None,
    chunk_tokens: int | None = None,
    lm_head: Callable[[Tensor], Tensor] | None = None,
    with_entropy: bool = True,
    tied: bool = False,
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
        lm_head: the head module (``weight`` is its weight); needed for a DeepSpeed ZeRO-3
            partitioned weight, which only the module's own calls gather.
        with_entropy: False skips the entropy (returned as zeros, not differentiable): the
            training pass needs log-probs only.
        tied: the head weight is also the input embedding (ZeRO-3 only: its gradient is then
            reduced with the embedding's, later in the same backward).

    Returns:
        (logprobs Float[...], entropy Float[...]), float32 (float64 for float64 inputs). Both are
        differentiable w.r.t. ``hidden``, ``weight`` and ``bias``.
    """
    t = check_temperature(temperature)
    check_labels(labels, hidden.shape[:-1], "hidden", "hidden")
    lead = hidden.shape[:-1]
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_l = labels.reshape(-1).long()
    valid = flat_l >= 0
    idx = valid.nonzero().squeeze(-1)
    n_all = flat_l.shape[0]
    zero3 = is_zero3_param(weight)
    vocab = int(weight.ds_shape[0]) if zero3 else weight.shape[0]  # type: ignore[attr-defined]
    rows = hidden_chunk_rows(vocab, chunk_tokens)
    mm = _matmul_dtype(flat_h, weight)
    cd = compute_dtype(mm)
    h_valid = flat_h.index_select(0, idx)
    l_valid = flat_l.index_select(0, idx)
    if zero3:
        if not isinstance(lm_head, torch.nn.Module):
            raise ValueError("a DeepSpeed ZeRO-3 partitioned LM head weight needs the head module (lm_head=...)")
        lp_v, ent_v = cast(tuple[Tensor, Tensor],
                           _HeadModuleLogProbs.apply(h_valid, l_valid, lm_head, t, rows, with_entropy, tied))
    else:
        lp_v, ent_v = cast(tuple[Tensor, Tensor],
                           _LinearLogProbs.apply(h_valid, weight, bias, l_valid, t, rows, mm, with_entropy))
    lp = torch.zeros(n_all, dtype=cd, device=hidden.device).index_put((idx,), lp_v.to(cd))
    ent = torch.zeros(n_all, dtype=cd, device=hidden.device)
    if ent_v.numel():
        ent = ent.index_put((idx,), ent_v.to(cd))
    return lp.reshape(lead), ent.reshape(lead)
