"""The policy's token log-probs and entropy on a ``TrainBatch``: one forward, two interchangeable paths.

``chunked`` (default): the decoder's final hidden states go through the LM head in token chunks
(``ulorl.algo.chunked_lm_head``), so no ``[B, L, V]`` logits tensor exists, in forward or backward;
only response positions are scored. ``full``: the model's own ``logits`` (``[B, L, V]``) then
``logprobs_and_entropy`` — the path before chunking, kept for ``ulorl-bench memory`` and as a
reference in tests. Under DeepSpeed ZeRO-3 (partitioned LM head) ``chunked`` goes through the head
module per chunk, so ZeRO-3 gathers and reduces the head weight (``ulorl.algo.chunked_lm_head``).
"""

from __future__ import annotations

import contextlib
from typing import Literal, Optional, cast

import torch
from torch import Tensor

from ulorl.algo.chunked_lm_head import logprobs_from_hidden
from ulorl.algo.logprobs import logprobs_and_entropy, logprobs_from_logits
from ulorl.train.batch import TrainBatch, micro_batches, scatter_rows

LogprobPath = Literal["chunked", "full"]
LOGPROB_PATHS: tuple[str, ...] = ("chunked", "full")
IGNORE = -100


class UnsupportedHeadError(ValueError):
    """The model's logits are not a plain linear head of its final hidden states."""


def _attention_mask(batch: TrainBatch, device: torch.device) -> Tensor | None:
    """None when no row is padded: attention is then plain causal (no [L, L] mask is built)."""
    mask = batch.attention_mask
    if bool(mask.all()):
        return None
    return mask.to(device).long()


def output_head(model: torch.nn.Module) -> torch.nn.Module:
    """The LM head (``get_output_embeddings``); refuses heads that rescale logits."""
    cfg = getattr(model, "config", None)
    for key in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        val = getattr(cfg, key, None)
        if val not in (None, 1, 1.0):
            raise UnsupportedHeadError(f"model config {key}={val!r}: use train.logprob_path: full for this model")
    head = model.get_output_embeddings()  # type: ignore[operator]
    if head is None or not hasattr(head, "weight"):
        raise UnsupportedHeadError(f"{type(model).__name__} has no linear output embeddings")
    return head


def tied_head(model: torch.nn.Module, weight: Tensor) -> bool:
    """The head weight is also the input embedding's (tied embeddings)."""
    get_embed = getattr(model, "get_input_embeddings", None)
    embed = get_embed() if callable(get_embed) else None
    return embed is not None and getattr(embed, "weight", None) is weight


def start_engine_micro_step(model: torch.nn.Module) -> None:
    """What a DeepSpeed engine's own forward does first, for a forward that bypasses it.

    ``DeepSpeedEngine.forward`` starts each micro-step with ZeRO's ``clear_backward_seen_flag``,
    which advances ZeRO's micro-step counter after a backward: without it ZeRO-3 takes every later
    micro-batch for the first one and overwrites (instead of adds to) the gradients accumulated so
    far. ``forward_hidden`` calls the inner base model, so it does this here; a no-op for a plain model.
    """
    clear = getattr(getattr(model, "optimizer", None), "clear_backward_seen_flag", None)
    if callable(clear):
        clear()


def forward_hidden(model: torch.nn.Module, batch: TrainBatch, device: torch.device) -> Tensor:
    """Final hidden states at the positions predicting ``batch.targets``: Float[B, L-1, H]."""
    start_engine_micro_step(model)
    base = cast(torch.nn.Module, model.base_model)
    ids = batch.input_ids.to(device).long()
    out = base(input_ids=ids, attention_mask=_attention_mask(batch, device), use_cache=False)
    return out.last_hidden_state[:, :-1]


def forward_logits(model: torch.nn.Module, batch: TrainBatch, device: torch.device) -> Tensor:
    """Full logits predicting ``batch.targets``: Float[B, L-1, V] (the ``full`` path)."""
    out = model(input_ids=batch.input_ids.to(device).long(), attention_mask=batch.attention_mask.to(device).long(),
                use_cache=False)
    return out.logits[:, :-1]


def response_labels(batch: TrainBatch) -> Tensor:
    """Targets at response positions, ``IGNORE`` elsewhere: Int[B, L-1]."""
    return torch.where(batch.response_mask, batch.targets, torch.full_like(batch.targets, IGNORE))


def token_stats(
    model: torch.nn.Module,
    batch: TrainBatch,
    temperature: float,
    device: torch.device,
    path: str = "chunked",
    chunk_tokens: int | None = None,
    with_entropy: bool = True,
) -> tuple[Tensor, Tensor]:
    """(log-probs, entropy) of every response target, each Float[B, L-1] on ``device``, 0 elsewhere.

    Differentiable when grad is enabled (chunked: both outputs; full: log-probs only). Runs under
    whatever autocast the caller set. ``with_entropy=False``: entropy returned as zeros (chunked)
    or not computed (full), for the training pass that needs log-probs only.
    """
    mask = batch.response_mask.to(device)
    if path == "chunked":
        head = output_head(model)
        hidden = forward_hidden(model, batch, device)
        labels = response_labels(batch).to(device)
        weight = cast(Tensor, head.weight)
        return logprobs_from_hidden(hidden, weight, labels, temperature,
                                    bias=getattr(head, "bias", None), chunk_tokens=chunk_tokens, lm_head=head,
                                    with_entropy=with_entropy, tied=tied_head(model, weight))
    if path == "full":
        logits = forward_logits(model, batch, device)
        if not with_entropy:
            lp = logprobs_from_logits(logits, batch.targets.to(device).long(), temperature)
            return lp * mask, torch.zeros_like(lp)
        lp, ent = logprobs_and_entropy(logits, batch.targets.to(device).long(), temperature)
        return lp * mask, ent * mask
    raise ValueError(f"logprob path must be one of {LOGPROB_PATHS}, got {path!r}")


def autocast_ctx(bf16: bool, device: torch.device) -> contextlib.AbstractContextManager:
    if bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def current_token_stats(
    model: torch.nn.Module,
    batch: TrainBatch,
    temperature: float,
    token_budget: int,
    device: torch.device,
    bf16: bool = False,
    path: str = "chunked",
    chunk_tokens: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs, entropy) of every response target under the current model, each Float[B, L-1] (cpu).

    ``path``: "chunked" (hidden states through the LM head in chunks) or "full" (model logits).
    """
    lp = torch.zeros(batch.targets.shape, dtype=torch.float32)
    ent = torch.zeros(batch.targets.shape, dtype=torch.float32)
    for rows in micro_batches(batch, token_budget):
        sub = batch.rows(rows)
        with autocast_ctx(bf16, device):
            sub_lp, sub_ent = token_stats(model, sub, temperature, device, path, chunk_tokens)
        scatter_rows(lp, rows, sub_lp.float().cpu())
        scatter_rows(ent, rows, sub_ent.float().cpu())
    return lp * batch.response_mask, ent * batch.response_mask
