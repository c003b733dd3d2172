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
float32. A DeepSpeed ZeRO-3 partitioned head weight (``is_zero3_param``) lives in shards outside its
module's calls: the whole chunked computation then runs as *one* call of the head module
(``call_with_forward``), so ZeRO-3's module hooks gather the weight once for the forward and once
for the backward (its pre-backward hook), whatever the number of chunks, and its gradient reaches
ZeRO-3's reduction once, through autograd, summed with a tied input embedding's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
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


@contextlib.contextmanager
def forward_replaced(module: torch.nn.Module, body: Callable[..., Any]) -> Iterator[None]:
    """Inside: calling ``module`` runs ``body`` as its forward, with every hook the module has (an
    instance attribute shadows the class's ``forward`` for ``nn.Module.__call__``); restored after."""
    previous = module.__dict__.get("forward")
    module.forward = body
    try:
        yield
    finally:
        if previous is None:
            del module.forward
        else:
            module.forward = previous


def call_with_forward(module: torch.nn.Module, body: Callable[..., Any], *args: Any) -> Any:
    """``body(*args)`` run as one call of ``module`` (its pre / post forward hooks around it).

    DeepSpeed ZeRO-3 gathers a module's parameters in the pre-forward hook, releases them in the
    post-forward hook, and wraps the call's tensor inputs and outputs so that the backward through
    them gathers the parameters again and releases them after: ``body`` sees the full weight, and a
    backward that needs it (``_LinearLogProbs``) finds it gathered."""
    with forward_replaced(module, body):
        return module(*args)


def logprobs_from_hidden(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    temperature: float = 1.0,
    bias: Tensor | None = None,
    chunk_tokens: int | None = None,
    lm_head: Callable[[Tensor], Tensor] | None = None,
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
        lm_head: the head module (``weight`` is its weight); needed for a DeepSpeed ZeRO-3
            partitioned weight, which only the module's own calls gather: the whole computation
            then runs as one call of it (gathered once per forward, once per backward).
        with_entropy: False skips the entropy (returned as zeros, not differentiable): the
            training pass needs log-probs only.

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
        head = lm_head

        def gathered(h: Tensor) -> tuple[Tensor, Tensor]:
            # inside the head's call: ZeRO-3 has gathered its weight (and bias) in full
            b = cast(Tensor | None, getattr(head, "bias", None))
            return cast(tuple[Tensor, Tensor],
                        _LinearLogProbs.apply(h, head.weight, b, l_valid, t, rows, mm, with_entropy))

        lp_v, ent_v = cast(tuple[Tensor, Tensor], call_with_forward(head, gathered, h_valid))
    else:
        lp_v, ent_v = cast(tuple[Tensor, Tensor],
                           _LinearLogProbs.apply(h_valid, weight, bias, l_valid, t, rows, mm, with_entropy))
    lp = torch.zeros(n_all, dtype=cd, device=hidden.device).index_put((idx,), lp_v.to(cd))
    ent = torch.zeros(n_all, dtype=cd, device=hidden.device)
    if ent_v.numel():
        ent = ent.index_put((idx,), ent_v.to(cd))
    return lp.reshape(lead), ent.reshape(lead)
