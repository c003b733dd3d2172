"""Sequence parallelism (``train.sequence_parallel``): one row split along the sequence over an SP group.

A row longer than ``train.micro_batch_tokens`` is cut into ``sp`` equal shards of consecutive
positions (the row is padded at its end to a multiple of ``sp``; padding sits after every real
token, so causal attention never sees it, and its labels are ignored). SP rank k holds positions
``[k c, (k+1) c)`` with their **global** position ids, and the labels of those positions: the label
of a shard's last token is the next shard's first token. Inside every decoder layer, DeepSpeed's
Ulysses attention for Hugging Face models (``UlyssesSPAttentionHF``) exchanges the shards by
all-to-all so each rank attends over the whole row for ``heads / sp`` of the heads, then exchanges
back; every other layer (norms, MLP, LM head) runs on the shard alone. Each rank then computes the
log-probs / entropy of its shard from its shard's hidden states through the chunked LM-head path
(``ulorl.algo.chunked_lm_head.logprobs_from_hidden``), so per-rank activations are those of
``T / sp`` tokens.

The loss of a shard is its part of the Eq. 10 sum over the mini-batch's global response-token
count (the whole row counted once), so the parts of an SP group sum to the row's loss, and the
per-rank parameter gradients sum (the data-parallel all-reduce over every rank) to the row's
gradient. Only ``algo.loss_agg: token_mean`` splits that way.

The attention hook: ``install_ulysses_attention`` wraps the model's attention implementation in
``transformers``' ``ALL_ATTENTION_FUNCTIONS`` (as DeepSpeed's ``register_with_transformers`` does)
with a dispatcher that routes a call through Ulysses only when the forward carried ``SP_KWARG``;
every other forward (short rows, the rollout copy of the model) keeps plain attention. The marker
travels in the layer's kwargs, so activation checkpointing recomputes through Ulysses too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ulorl.config import TrainConfig
from ulorl.train.batch import TrainBatch
from ulorl.train.forward import IGNORE, chunked_stats_from_ids, response_labels

#: forward kwarg that routes attention through Ulysses (popped by the dispatcher)
SP_KWARG = "ulorl_sequence_parallel"
#: attention implementations Ulysses can wrap (eager needs a [T, T] mask)
SP_ATTENTION = ("sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")


class SequenceParallelUnavailable(ValueError):
    """``train.sequence_parallel`` cannot run with this configuration (the message names the key)."""


def sequence_parallel_error(cfg: TrainConfig, world_size: int) -> str | None:
    """Why ``train.sequence_parallel`` cannot run with ``world_size`` trainer processes (None: it can)."""
    sp = cfg.sequence_parallel
    if sp == 1:
        return None
    if cfg.backend != "deepspeed":
        return (f"train.sequence_parallel={sp} needs train.backend=deepspeed with a multiple of {sp} trainer "
                f"processes (train.backend={cfg.backend!r} trains in one process); use 1 for the torch backend")
    if world_size % sp:
        return (f"train.sequence_parallel={sp} does not divide the {world_size} trainer processes (WORLD_SIZE): "
                "the world is data-parallel x sequence-parallel ranks")
    return None


def check_sequence_parallel(cfg: TrainConfig, world_size: int = 1) -> None:
    """Raise ``SequenceParallelUnavailable`` (naming ``train.sequence_parallel``) when the degree cannot run."""
    msg = sequence_parallel_error(cfg, world_size)
    if msg:
        raise SequenceParallelUnavailable(msg)


def check_sp_loss_agg(loss_agg: str, sp: int) -> None:
    if sp > 1 and loss_agg != "token_mean":
        raise SequenceParallelUnavailable(
            f"train.sequence_parallel={sp} splits a row's loss over ranks, which only algo.loss_agg: token_mean "
            f"(Eq. 10) allows; got algo.loss_agg={loss_agg!r}")


# ----------------------------------------------------------------------------- sharding (pure)


@dataclass(frozen=True)
class RowShard:
    """SP rank's part of one row: positions ``[lo, lo + c)`` of the row padded to ``c x sp``."""

    input_ids: Tensor     # Long[1, c]
    position_ids: Tensor  # Long[1, c], global positions lo .. lo + c - 1
    labels: Tensor        # Long[1, c], response target of each position, IGNORE elsewhere
    lo: int               # first global target position of the shard
    n_targets: int        # how many of the c positions are real target positions (< L - 1)


def shard_row(batch: TrainBatch, sp_rank: int, sp: int) -> RowShard:
    """Shard ``sp_rank`` of the one row of ``batch`` (target-aligned: position t predicts token t + 1)."""
    if batch.input_ids.shape[0] != 1:
        raise ValueError(f"sequence parallelism shards one row at a time, got {batch.input_ids.shape[0]} rows")
    if not 0 <= sp_rank < sp:
        raise ValueError(f"sp_rank {sp_rank} outside [0, {sp})")
    length = int(batch.input_ids.shape[1])
    c = -(-length // sp)
    ids = torch.zeros(c * sp, dtype=torch.long)
    ids[:length] = batch.input_ids[0].long()
    labels = torch.full((c * sp,), IGNORE, dtype=torch.long)
    labels[: length - 1] = response_labels(batch)[0].long()
    lo = sp_rank * c
    return RowShard(
        input_ids=ids[lo: lo + c].unsqueeze(0),
        position_ids=torch.arange(lo, lo + c, dtype=torch.long).unsqueeze(0),
        labels=labels[lo: lo + c].unsqueeze(0),
        lo=lo,
        n_targets=max(0, min(lo + c, length - 1) - lo),
    )


# ----------------------------------------------------------------------------- Ulysses attention hook

_INSTALLED: dict[str, Any] = {}  # attention implementation -> UlyssesSPAttentionHF


def install_ulysses_attention(model: torch.nn.Module, sp_group: Any) -> Any:
    """Route the model's attention through DeepSpeed's ``UlyssesSPAttentionHF`` on ``sp_group`` for
    forwards that carry ``SP_KWARG`` (idempotent per process and implementation). Returns the module."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    config: Any = getattr(model, "module", model).config  # a DeepSpeed engine wraps the HF model
    impl = getattr(config, "_attn_implementation", None)
    if impl not in SP_ATTENTION:
        raise SequenceParallelUnavailable(
            f"train.sequence_parallel needs model.attn_implementation in {SP_ATTENTION}, the model runs {impl!r}")
    if impl in _INSTALLED:
        uattn = _INSTALLED[impl]
        if uattn.process_group is not sp_group:
            raise RuntimeError("Ulysses attention is already installed on another sequence-parallel group")
        return uattn
    arch = config.get_text_config()
    core: Callable[..., Any] = ALL_ATTENTION_FUNCTIONS[impl]
    uattn = UlyssesSPAttentionHF(
        attn=core,
        batch_size=1,
        attn_head_count=arch.num_attention_heads,
        attn_head_size=getattr(arch, "head_dim", None) or arch.hidden_size // arch.num_attention_heads,
        kv_head_count=arch.num_key_value_heads,
        num_hidden_layers=arch.num_hidden_layers,
        process_group=sp_group,
        seq_length_is_variable=True,
    )
    uattn.core_attn_implementation = impl

    def dispatch(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                 attention_mask: Tensor | None, *args: Any, **kwargs: Any) -> tuple[Tensor, Any]:
        if kwargs.pop(SP_KWARG, False):
            # the shard's own mask is meaningless after the all-to-all; the row is causal, unpadded
            return uattn(module, query, key, value, None, *args, **kwargs)
        return core(module, query, key, value, attention_mask, *args, **kwargs)

    ALL_ATTENTION_FUNCTIONS[impl] = dispatch
    _INSTALLED[impl] = uattn
    return uattn


# ----------------------------------------------------------------------------- the sharded forward


def sharded_token_stats(
    model: torch.nn.Module,
    batch: TrainBatch,
    temperature: float,
    device: torch.device,
    sp_group: Any,
    sp_rank: int,
    sp: int,
    chunk_tokens: int | None = None,
    with_entropy: bool = True,
) -> tuple[Tensor, Tensor, int]:
    """(log-probs, entropy, lo) of this rank's shard of the one row of ``batch``.

    log-probs / entropy: Float[1, n] for the global target positions ``lo .. lo + n - 1``
    (``batch.targets[:, lo: lo + n]``), 0 at non-response positions; differentiable when grad is on.
    Every rank of ``sp_group`` must call this on the same row at the same time.
    """
    install_ulysses_attention(model, sp_group)
    shard = shard_row(batch, sp_rank, sp)
    ids = shard.input_ids.to(device)
    pos = shard.position_ids.to(device)
    labels = shard.labels.to(device)
    # through the engine's forward (root hooks); under ZeRO-3 the head is gathered once per pass
    lp, ent = chunked_stats_from_ids(model, {"input_ids": ids, "position_ids": pos, SP_KWARG: True}, labels,
                                     temperature, chunk_tokens, with_entropy)
    n = shard.n_targets
    return lp[:, :n], ent[:, :n], shard.lo
