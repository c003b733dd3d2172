"""The train / inference mismatch of one update: which token pairs share weights, the gap between them,
and the correction weights (the math is ``ulorl.algo.rollout_correction``; platform/ulorl/docs/algorithm.md
derives it).

    sources = token_sources(kept, batch)                 # engine log-probs, segment index, position [B, L-1]
    out = rollout_mismatch(sources, batch, cur_lp, old_lp, settings)
    out.metrics    # mismatch/* (the gap) and correction/* (what the mode did)
    out.weights    # Float[B, L-1] or None (mode off): multiplies each token's clipped surrogate
    out.rejected   # Bool[B, L-1]: response tokens the mode leaves out of the loss

Same weights. A response token decoded in segment k was sampled by the engine at policy version v_k;
its engine log-prob is ``Sample.sampling_logprobs``. The trainer's log-prob of it under the same
weights exists in two places only:

- SAIS with trainer log-probs (``algo.sais_logprobs`` trainer): ``Sample.old_logprobs`` were computed
  by the training model right after each segment was decoded, at v_k: every response token is a pair.
- The update's no-grad pass (``cur_lp``) runs the current weights, version V, which decoded exactly the
  tokens whose segment has version V (this step's segments; every token under TOIS / S = 1).

Older segments against ``cur_lp`` compare different weights (the policy moved since): that gap is
staleness, not mismatch, and is not counted. ``mismatch/coverage`` is the share of the batch's
response tokens measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ulorl.algo.rollout_correction import (
    MODE_RATIO,
    CorrectionInputs,
    correction_stats,
    mismatch_stats,
    rollout_correction,
    sequence_groups,
)
from ulorl.algo.routing import routes_differ, routing_mismatch
from ulorl.config import RolloutCorrectionConfig
from ulorl.rollout.types import Sample
from ulorl.tracking.schema import CORRECTION_PREFIX, MISMATCH_PREFIX
from ulorl.train.batch import TrainBatch
from ulorl.train.routing_replay import RouteTable, row_key


@dataclass(frozen=True)
class TokenSources:
    """Per-token facts of a batch the trainer's tensors do not hold, aligned with ``TrainBatch.targets``.

    engine_logprobs: Float[B, L-1], the engine's log-prob of each response token (NaN where the sample
        has none: an engine that returned no log-probs, or a sample whose list is not one per token).
    has_engine: Bool[B], rows with one engine log-prob per response token.
    segment_index: Long[B, L-1], the segment (0-based) of each response token; -1 elsewhere.
    positions: Long[B, L-1], the response position j of each response token; -1 elsewhere.
    """

    engine_logprobs: Tensor
    has_engine: Tensor
    segment_index: Tensor
    positions: Tensor


def engine_logprobs(sample: Sample) -> Optional[Tensor]:
    """Float[T]: the sample's engine log-probs when it has one finite value per response token, else None."""
    if len(sample.sampling_logprobs) != len(sample.response_ids):
        return None
    lps = torch.tensor(sample.sampling_logprobs, dtype=torch.float32)
    return lps if bool(torch.isfinite(lps).all()) else None


def token_sources(samples: list[Sample], batch: TrainBatch) -> TokenSources:
    """``TokenSources`` of ``batch`` (built from ``samples``, in its row order)."""
    shape = batch.targets.shape
    engine = torch.full(shape, math.nan, dtype=torch.float32)
    seg = torch.full(shape, -1, dtype=torch.long)
    pos = torch.full(shape, -1, dtype=torch.long)
    has = torch.zeros(len(samples), dtype=torch.bool)
    for b, s in enumerate(samples):
        p, t = len(s.prompt_ids), len(s.response_ids)
        if t == 0:
            continue
        pos[b, p - 1:p - 1 + t] = torch.arange(t)
        for k, span in enumerate(s.segments):
            seg[b, p - 1 + span.start:p - 1 + min(span.end, t)] = k
        lps = engine_logprobs(s)
        if lps is not None:
            engine[b, p - 1:p - 1 + t] = lps
            has[b] = True
    return TokenSources(engine, has, seg, pos)


@dataclass(frozen=True)
class MismatchSettings:
    """What the measurement and the correction need beyond the tensors.

    correction: ``algo.rollout_correction``; is_mode: ``algo.is_mode``.
    sais_from_trainer: SAIS old log-probs came from the trainer (same-weights pairs for every segment).
    policy_version: the version of the weights the update starts from (None: unknown; then only stored
        SAIS trainer log-probs are measured).
    max_response_len: sets the position buckets (None: the batch's longest response).
    """

    correction: RolloutCorrectionConfig
    is_mode: str
    sais_from_trainer: bool = True
    policy_version: Optional[int] = None
    max_response_len: Optional[int] = None


@dataclass(frozen=True)
class MismatchResult:
    metrics: dict[str, float]
    weights: Optional[Tensor]    # Float[B, L-1]; None with mode off
    rejected: Tensor             # Bool[B, L-1]


def same_weights_pairs(batch: TrainBatch, sources: TokenSources, cur_lp: Tensor,
                       settings: MismatchSettings) -> tuple[Tensor, Tensor]:
    """(trainer log-probs Float[B, L-1], measured Bool[B, L-1]): per response token with an engine
    log-prob, the trainer's log-prob under the weights that decoded it, where one exists (module doc)."""
    resp = batch.response_mask & sources.has_engine.reshape(-1, 1)
    if settings.is_mode == "sais" and settings.sais_from_trainer:
        return batch.sais_logprobs.to(cur_lp.dtype), resp
    if settings.policy_version is None:
        return cur_lp, torch.zeros_like(resp)
    return cur_lp, resp & (batch.token_versions == settings.policy_version)


def rollout_mismatch(sources: TokenSources, batch: TrainBatch, cur_lp: Tensor, old_lp: Tensor,
                     settings: MismatchSettings) -> MismatchResult:
    """The gap of this update's same-weights pairs (``mismatch/*``) and the correction of
    ``settings.correction.mode`` (its weights, rejected tokens and ``correction/*`` statistics).

    cur_lp: Float[B, L-1], the update's no-grad pass (current weights); old_lp: the PPO ratio's
    denominator. Raises ValueError naming a sample without engine log-probs when a correction is on."""
    cfg = settings.correction
    metrics: dict[str, float] = {}
    resp = batch.response_mask
    n_resp = int(resp.sum())
    if cfg.measure:
        trainer_lp, measured = same_weights_pairs(batch, sources, cur_lp, settings)
        max_len = settings.max_response_len or max(batch.response_lens, default=1)
        stats = mismatch_stats(trainer_lp, sources.engine_logprobs, measured, sources.segment_index,
                               sources.positions, max_len)
        metrics.update({MISMATCH_PREFIX + k: v for k, v in stats.items()})
        metrics[MISMATCH_PREFIX + "coverage"] = float(measured.sum()) / n_resp if n_resp else 0.0
    rejected = torch.zeros_like(resp)
    if cfg.mode == "off":
        return MismatchResult(metrics, None, rejected)
    missing = (~sources.has_engine).nonzero().flatten().tolist()
    if missing:
        raise ValueError(f"algo.rollout_correction.mode={cfg.mode} needs the engine's log-probs of every sampled "
                         f"token, but batch row {missing[0]} has none (rollout.engine must return them)")
    x = CorrectionInputs(old_lp.detach(), sources.engine_logprobs.to(old_lp.dtype), resp,
                         sequence_groups(sources.segment_index, resp, cfg.seq_scope),
                         threshold=cfg.threshold, low=cfg.icepop_low, high=cfg.icepop_high)
    corr = rollout_correction(cfg.mode)(x)
    stats = correction_stats(corr, x, ratio_kind=MODE_RATIO[cfg.mode])
    metrics.update({CORRECTION_PREFIX + k: v for k, v in stats.items()})
    return MismatchResult(metrics, corr.weights, corr.rejected)


ROUTING_PREFIX = MISMATCH_PREFIX + "routing/"


def routing_mismatch_metrics(table: Optional[RouteTable], samples: list[Sample], batch: TrainBatch, cur_lp: Tensor,
                             policy_version: Optional[int]) -> dict[str, float]:
    """The routing mismatch of an MoE update (``mismatch/routing/*``; empty without recorded routes).

    The trainer's own routes come from the update's no-grad pass (captured into ``table`` by
    ``ulorl.train.routing_replay``, whether replay was on or not), at the current weights V; they are
    compared with the engine's on the response tokens decoded at V (same weights; with
    ``policy_version`` None, every recorded token). Logged: ``tokens``, ``token_frac`` (tokens whose
    expert set differs in at least one layer), ``token_layer_frac``, and the mean |trainer - engine|
    log-prob gap on the tokens routed differently (``gap_differ``, with ``differ_tokens``) and on the
    rest (``gap_same``).
    """
    if table is None or not table.captured:
        return {}
    b, lm1 = batch.targets.shape
    sources = token_sources(samples, batch)
    trainer = engine = None
    measured = torch.zeros((b, lm1), dtype=torch.bool)
    for i in range(b):
        p, t = batch.prompt_lens[i], batch.response_lens[i]
        key = row_key(batch.input_ids[i, :p + t])
        own, rec = table.captured.get(key), table.routes.get(key)
        if own is None or rec is None or t == 0:
            continue
        if trainer is None or engine is None:
            trainer = torch.full((b, lm1) + tuple(own.shape[1:]), -1, dtype=torch.long)
            engine = torch.full_like(trainer, -1)
        trainer[i, :min(lm1, own.shape[0])] = own[:lm1]
        engine[i, :min(lm1, rec.shape[0])] = rec[:lm1].long()
        measured[i] = batch.response_mask[i] & (engine[i] >= 0).all(dim=-1).all(dim=-1)
    if trainer is None or engine is None:
        return {}
    if policy_version is not None:
        measured &= batch.token_versions == policy_version
    stats = routing_mismatch(trainer, engine, measured)
    if not stats:
        return {}
    differ = routes_differ(trainer, engine).any(dim=-1) & measured
    has_engine = measured & sources.has_engine.reshape(-1, 1)
    gap = (cur_lp.detach().double() - sources.engine_logprobs.double()).abs()
    stats["differ_tokens"] = float(differ.sum())
    for name, sel in (("gap_differ", differ & has_engine), ("gap_same", ~differ & has_engine)):
        if bool(sel.any()):
            stats[name] = float(gap[sel].mean())
    return {ROUTING_PREFIX + k: v for k, v in stats.items()}


__all__ = ["ROUTING_PREFIX", "MismatchResult", "MismatchSettings", "TokenSources",
           "engine_logprobs", "rollout_mismatch", "routing_mismatch_metrics", "same_weights_pairs", "token_sources"]
