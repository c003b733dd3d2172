"""The policy's token log-probs and entropy on a ``TrainBatch``: one forward, two interchangeable paths.

``chunked`` (default): the decoder's final hidden states go through the LM head in token chunks
(``ulorl.algo.chunked_lm_head``), so no ``[B, L, V]`` logits tensor exists, in forward or backward;
only response positions are scored. ``full``: the model's own ``logits`` (``[B, L, V]``) then
``logprobs_and_entropy`` — the path before chunking, kept for ``ulorl-bench memory`` and as a
reference in tests. Under DeepSpeed ZeRO-3 (partitioned LM head) ``chunked`` runs the chunks as one
call of the head module, so ZeRO-3 gathers the head weight once per forward and once per backward
(``ulorl.algo.chunked_lm_head``).

A DeepSpeed engine's policy is run through the engine's own forward (``through_root``) with the
root module's body replaced by the chunked computation: the engine then starts the micro-step
and hooks the backward prologue on the outputs (ZeRO reduces gradients in buckets, its epilogue
once per backward), and ZeRO-3's start-of-forward hook on the root resets its parameter trace, so
prefetching switches on once the trace is recorded. Calling the inner base model directly skipped
all of this.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any, Literal, Optional, TypeVar, cast

import torch
from torch import Tensor

from ulorl.algo.chunked_lm_head import forward_replaced, is_zero3_param, logprobs_from_hidden
from ulorl.algo.logprobs import logprobs_and_entropy, logprobs_from_logits
from ulorl.train.batch import TrainBatch, micro_batches, scatter_rows
from ulorl.train.routing_replay import routed_forward

LogprobPath = Literal["chunked", "full"]
LOGPROB_PATHS: tuple[str, ...] = ("chunked", "full")
IGNORE = -100
T = TypeVar("T")


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


def engine_root(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module a DeepSpeed engine wraps (``engine.module``); None when ``model`` is no engine
    (deepspeed is only looked up if something imported it already)."""
    engine_mod = sys.modules.get("deepspeed.runtime.engine")
    if engine_mod is not None and isinstance(model, engine_mod.DeepSpeedEngine):
        return cast(torch.nn.Module, model.module)
    return None


def through_root(model: torch.nn.Module, body: Callable[[], T]) -> T:
    """``body()`` run as the forward of ``model``'s root module, so that the root's hooks run.

    A DeepSpeed engine: ``engine()`` with ``engine.module``'s forward replaced by ``body`` (the engine
    starts the micro-step, ZeRO-3's root hook resets the parameter trace, the engine hooks its
    backward prologue on the outputs). A ZeRO-3 partitioned module outside an engine: the module's
    own call (its root hook). Anything else: ``body()`` as it is.
    """
    root = engine_root(model)
    caller = model
    if root is None:
        get_head = getattr(model, "get_output_embeddings", None)
        head = get_head() if callable(get_head) else None
        if head is None or not is_zero3_param(cast(Tensor, getattr(head, "weight", None))):
            return body()
        root = model

    def forward(*_args: Any, **_kwargs: Any) -> T:
        return body()

    with forward_replaced(root, forward):
        return cast(T, caller())


def hidden_states(model: torch.nn.Module, **inputs: Any) -> Tensor:
    """``model.base_model(**inputs, use_cache=False).last_hidden_state``: Float[B, L, H]. Call it
    inside ``through_root`` when ``model`` is a DeepSpeed engine (the engine forwards the attribute)."""
    base = cast(torch.nn.Module, model.base_model)
    return cast(Tensor, base(use_cache=False, **inputs).last_hidden_state)


def chunked_stats_from_ids(model: torch.nn.Module, inputs: dict[str, Any], labels: Tensor, temperature: float,
                           chunk_tokens: int | None, with_entropy: bool) -> tuple[Tensor, Tensor]:
    """(log-probs, entropy) of ``labels`` (Int[B, L], < 0 skipped) from the hidden states of
    ``inputs`` through the chunked LM head, each Float[B, L]; one root forward (``through_root``)."""
    head = output_head(model)

    def body() -> tuple[Tensor, Tensor]:
        hidden = hidden_states(model, **inputs)
        weight = cast(Tensor, head.weight)
        return logprobs_from_hidden(hidden[:, : labels.shape[1]], weight, labels, temperature,
                                    bias=getattr(head, "bias", None), chunk_tokens=chunk_tokens, lm_head=head,
                                    with_entropy=with_entropy)

    return through_root(model, body)


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
    # an MoE model under an active route table (ulorl.train.routing_replay): R3 replay and route capture
    with routed_forward(model, batch.input_ids, batch.attention_mask):
        return _token_stats(model, batch, temperature, device, path, chunk_tokens, with_entropy)


def _token_stats(model: torch.nn.Module, batch: TrainBatch, temperature: float, device: torch.device, path: str,
                 chunk_tokens: int | None, with_entropy: bool) -> tuple[Tensor, Tensor]:
    mask = batch.response_mask.to(device)
    if path == "chunked":
        inputs = {"input_ids": batch.input_ids.to(device).long(), "attention_mask": _attention_mask(batch, device)}
        # labels are L - 1 wide: the hidden states of positions 0 .. L - 2 predict them
        return chunked_stats_from_ids(model, inputs, response_labels(batch).to(device), temperature, chunk_tokens,
                                      with_entropy)
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
