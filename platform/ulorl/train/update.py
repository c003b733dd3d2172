"""One policy update on released groups: the algorithm half of a training step.

Order (DESIGN.md data flow): dynamic sampling -> advantages -> no-grad pass (current log-probs,
entropy) -> old log-probs by IS mode -> train / inference mismatch (measured; corrected by
``algo.rollout_correction``: weights and rejected tokens) -> MPT / DMMPT mask -> clipped token-level
loss per mini-batch -> backward per micro-batch -> optimizer step. Log-probs, entropies and MPT
probabilities all use logits / rollout temperature, the distribution the rollout sampled from.
"""

from __future__ import annotations

import logging
import math
import weakref
from dataclasses import dataclass, field
from typing import Optional

import torch

from ulorl.algo import (
    MaskInputs,
    dynamic_sampling_filter,
    group_advantages,
    mask_mode,
    policy_loss,
    select_old_logprobs,
)
from ulorl.algo.entropy_control import ControlInputs, draw_seed, entropy_control, kl_cov_loss
from ulorl.config import AlgoConfig, ExperimentConfig, TrainConfig, sais_logprobs_source
from ulorl.rollout.types import Sample
from ulorl.tracking.schema import NONFINITE_GRAD_METRIC
from ulorl.train.backend import TrainBackend
from ulorl.train.batch import TrainBatch, build_train_batch, rows_over_cap
from ulorl.train.entropy_proxy import proxy_metrics
from ulorl.train.forward import autocast_ctx, current_token_stats, forward_logits, token_stats
from ulorl.train.mismatch import MismatchSettings, rollout_mismatch, routing_mismatch_metrics, token_sources
from ulorl.train.parallel import LocalParallel, ParallelOps
from ulorl.train.routing_replay import RouteTable, active_routes
from ulorl.train.sequence_parallel import check_sp_loss_agg

log = logging.getLogger(__name__)
#: backends (one per run) that already warned about rows over the micro-batch token cap
_WARNED_OVER_CAP: weakref.WeakSet[object] = weakref.WeakSet()

__all__ = ["PreparedUpdate", "UpdateContext", "UpdateResult", "apply_update", "autocast_ctx", "current_token_stats",
           "forward_logits", "engine_segment_logprobs", "policy_update", "prepare_update", "segment_logprobs",
           "split_minibatches"]


@dataclass(frozen=True)
class UpdateContext:
    """What every update of a run is given besides its samples: the model, the settings, the sampling
    temperature and where the tensors live. One per run (the trainer, each worker rank, a bench).

    The samples become a [B, L] token batch (``pad_token_id`` pads it) whose [B, L-1] per-token
    tensors are computed on ``device``.
    """

    backend: TrainBackend   # the model under training: forward, backward, optimizer step, data parallelism
    algo: AlgoConfig        # loss, IS mode, mask, advantages, entropy control
    train: TrainConfig      # micro-batch token cap, mini-batches per step, log-prob path, bf16, seed
    temperature: float      # the rollout's sampling temperature: log-probs are of logits / temperature
    pad_token_id: int       # pads the [B, L] token batch (padded positions are outside the response mask)
    device: torch.device    # where the [B, L] batch, the [B, L-1] log-probs and the loss are computed
    max_response_len: Optional[int] = None   # the run's; sets the mismatch position buckets (None: the batch's)
    sais_from_trainer: bool = True           # SAIS old log-probs are the trainer's (algo.sais_logprobs resolved)

    @classmethod
    def of_run(cls, backend: TrainBackend, cfg: ExperimentConfig, pad_token_id: int,
               device: torch.device) -> UpdateContext:
        """A run's context: its algo and train settings, and the temperature its rollout samples at."""
        return cls(backend, cfg.algo, cfg.train, cfg.rollout.temperature, pad_token_id, device,
                   cfg.rollout.max_response_len, sais_logprobs_source(cfg) == "trainer")


@dataclass
class UpdateResult:
    updated: bool
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    kept_samples: list[Sample] = field(default_factory=list)
    loss_mask: Optional[torch.Tensor] = None     # [B, L-1] of the kept batch
    batch: Optional[TrainBatch] = None


def _weighted(acc: dict[str, float], metrics: dict[str, torch.Tensor], weight: float) -> None:
    for key in ("clip_frac", "ratio_mean"):
        if key in metrics:
            acc[key] = acc.get(key, 0.0) + float(metrics[key]) * weight
    if "ratio_max" in metrics:
        acc["ratio_max"] = max(acc.get("ratio_max", -math.inf), float(metrics["ratio_max"]))
    if "ratio_min" in metrics:
        acc["ratio_min"] = min(acc.get("ratio_min", math.inf), float(metrics["ratio_min"]))


def split_minibatches(group_ids: list[int], n: int) -> list[list[int]]:
    """Split row indices into ``n`` mini-batches of whole groups (contiguous, near-equal)."""
    order: list[int] = []
    seen: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        seen.setdefault(g, []).append(i)
    groups = list(seen.values())
    n = max(1, min(n, len(groups)))
    out: list[list[int]] = [[] for _ in range(n)]
    for k, rows in enumerate(groups):
        out[k * n // len(groups)].extend(rows)
    del order
    return [m for m in out if m]


@dataclass
class PreparedUpdate:
    """Everything an update needs before its first gradient: the kept batch and its per-token tensors.

    Tensors are [B, L-1] over the kept batch (``batch.targets`` positions) unless noted.
    """

    kept: list[Sample]
    batch: TrainBatch
    advantages: torch.Tensor        # Float[B]: group-normalised advantage per row
    old_logprobs: torch.Tensor      # Float[B, L-1]: the IS denominator (TOIS / SAIS / POIS)
    loss_mask: torch.Tensor         # Bool[B, L-1]: tokens the loss keeps (MPT / DMMPT masking)
    metrics: dict[str, float]
    kl_tokens: Optional[torch.Tensor] = None  # Bool[B, L-1]: KL-Cov's penalised tokens (entropy_control kl_cov)
    is_weights: Optional[torch.Tensor] = None  # Float[B, L-1]: rollout-correction weights (None: mode off)
    routes: Optional[RouteTable] = None        # MoE: the engine's experts per kept row (None: no sample has routes)


def parallel_ops(backend: TrainBackend, train: TrainConfig) -> ParallelOps:
    """The backend's data parallelism, or the one-process form (``LocalParallel``)."""
    return backend.data_parallel or LocalParallel(train.logprob_path, train.logprob_chunk_tokens)


def prepare_update(samples: list[Sample], ctx: UpdateContext,
                   policy_version: Optional[int] = None) -> PreparedUpdate | UpdateResult:
    """Filter (dynamic sampling), batch, advantages, the no-grad pass (current log-probs, entropy),
    old log-probs by IS mode, the train / inference mismatch and its correction, the mask and the
    pre-update statistics. ``policy_version``: the version of the weights the update starts from (the
    segments it decoded are measured against the no-grad pass; None: only stored SAIS trainer log-probs
    are). An ``UpdateResult`` (not updated, with its reason) when there is nothing to train on."""
    backend, algo, train, temperature, device = ctx.backend, ctx.algo, ctx.train, ctx.temperature, ctx.device
    dp = parallel_ops(backend, train)
    dp.begin_update(samples)  # multi-process: rank 0 ships the samples; the other ranks run this on them
    rewards_all = torch.tensor([float(s.reward or 0.0) for s in samples])
    groups_all = torch.tensor([s.group_id for s in samples])
    metrics: dict[str, float] = {
        "train/reward_mean": float(rewards_all.mean()) if samples else 0.0,
    }
    if algo.dynamic_sampling:
        keep = dynamic_sampling_filter(rewards_all, groups_all)
        kept = [s for s, k in zip(samples, keep.tolist()) if k]
    else:
        kept = list(samples)
    metrics["train/ds_dropped_samples"] = float(len(samples) - len(kept))
    if not kept:
        return UpdateResult(False, metrics, reason="dynamic sampling kept no group (all-equal rewards)")

    check_sp_loss_agg(algo.loss_agg, dp.sp)
    if algo.is_mode == "sais":
        check_sais_logprobs(kept)
    batch = build_train_batch(kept, ctx.pad_token_id)
    resp = batch.response_mask
    n_tokens = batch.num_response_tokens
    if n_tokens == 0:
        return UpdateResult(False, metrics, reason="no response tokens")

    adv = group_advantages(batch.rewards, batch.group_ids, eps=algo.adv_eps, unbiased=algo.adv_std == "unbiased")
    over = rows_over_cap(batch, train.micro_batch_tokens)
    metrics["train/rows_over_cap"] = float(len(over))
    if over and dp.sp == 1 and backend not in _WARNED_OVER_CAP:  # with SP they are sharded
        _WARNED_OVER_CAP.add(backend)
        log.warning("a row of %d tokens exceeds train.micro_batch_tokens=%d: trained alone in one micro-batch "
                    "over the cap (counted in train/rows_over_cap; warned once per run)", max(over),
                    train.micro_batch_tokens)

    model = backend.model
    model.eval()
    routes = RouteTable.of(kept, replay=algo.routing_replay == "r3")   # MoE: the engine's experts, or None
    with active_routes(routes):
        cur_lp, ent = dp.token_stats(model, batch, temperature, train.micro_batch_tokens, device, train.bf16)
    old_lp = select_old_logprobs(algo.is_mode, cur_lp, batch.sais_logprobs) * resp
    mm = rollout_mismatch(token_sources(kept, batch), batch, cur_lp, old_lp, MismatchSettings(
        algo.rollout_correction, algo.is_mode, ctx.sais_from_trainer, policy_version, ctx.max_response_len))
    metrics.update(mm.metrics)
    metrics.update(routing_mismatch_metrics(routes, kept, batch, cur_lp, policy_version))

    sample_entropy = (ent * resp).sum(1) / resp.sum(1).clamp(min=1)
    mask_in = MaskInputs(cur_lp, batch.rewards, resp, ent, tau=algo.mpt.tau, sigma=algo.mpt.sigma,
                         scope=algo.mpt.entropy_scope)
    mpt = mask_in.mpt   # the static mask itself (mode "static"), inside the dynamic one: computed once
    mode = mask_mode(algo.mpt.mode)
    loss_mask, active = mode.mask(mask_in), mode.active(mask_in)
    ec, control = algo.entropy_control, entropy_control(algo.entropy_control.mode)
    acted = control.select(ControlInputs(
        cur_lp, old_lp, adv, resp, ent, eps_low=algo.eps_low, eps_high=algo.eps_high, clip_cov_ratio=ec.clip_cov_ratio,
        clip_cov_lb=ec.clip_cov_lb, clip_cov_ub=ec.clip_cov_ub, kl_cov_ratio=ec.kl_cov_ratio,
        top_entropy_quantile=ec.top_entropy_quantile, seed=draw_seed(train.seed, kept[0].sample_id)))
    metrics.update(
        {
            "train/entropy": float((ent * resp).sum() / n_tokens),
            "train/entropy_sample_min": float(sample_entropy.min()),
            "train/mpt_frac": float(mpt.sum()) / n_tokens,
            "train/masked_frac": float(loss_mask.sum()) / n_tokens,
            "train/mask_active_frac": float(active.float().mean()),
            "train/entropy_control_frac": float(acted.sum()) / n_tokens,
            "train/groups": float(len(set(batch.group_ids.tolist()))),
            "train/samples": float(len(kept)),
            "train/tokens": float(n_tokens),
            "train/adv_abs_mean": float(adv.abs().mean()),
        }
    )
    # where the entropy goes, per token class (platform/ulorl/docs/entropy.md): the two proxies, from this pass alone
    metrics.update(proxy_metrics(cur_lp, adv, resp, ent, loss_mask | acted if control.action == "mask" else loss_mask,
                                 algo.mpt.tau))
    kl_tokens = acted if control.action == "kl" else None
    kept_mask = loss_mask | acted if control.action == "mask" else loss_mask
    return PreparedUpdate(kept, batch, adv, old_lp, kept_mask | mm.rejected, metrics, kl_tokens, mm.weights,
                          routes)


def apply_update(prep: PreparedUpdate, ctx: UpdateContext) -> UpdateResult:
    """The optimizer loop: per mini-batch (``train.updates_per_step``), the clipped token-level loss
    per micro-batch, backward, one optimizer step. A non-finite loss or gradient norm refuses the
    rest of the update (the steps already taken stay)."""
    backend, algo, train, temperature, device = ctx.backend, ctx.algo, ctx.train, ctx.temperature, ctx.device
    dp = parallel_ops(backend, train)
    model, batch, metrics = backend.model, prep.batch, dict(prep.metrics)
    n_tokens = batch.num_response_tokens
    model.train()
    acc: dict[str, float] = {}
    pg_loss_total = 0.0
    grad_norms: list[float] = []
    routes = prep.routes
    skipped_steps = 0   # optimizer steps the backend skipped on a non-finite global grad norm
    refused = ""
    for mb_rows in split_minibatches(batch.group_ids.tolist(), train.updates_per_step):
        mb = batch.rows(mb_rows)
        mb_tokens = mb.num_response_tokens
        mb_idx = torch.tensor(mb_rows, dtype=torch.long)
        # multi-process: this rank's shard, padded with weight-0 passes to the same count on every rank
        for rows, weight in dp.micro_batches(mb, train.micro_batch_tokens):
            sub = mb.rows(rows)
            idx = mb_idx[torch.tensor(rows, dtype=torch.long)]
            lo, width = 0, sub.targets.shape[1]
            with autocast_ctx(train.bf16, device):
                if dp.sharded(sub, weight, train.micro_batch_tokens):
                    # a row over the cap, split along the sequence over the SP group: this rank's positions
                    lp, _, lo = dp.sharded_stats(model, sub, temperature, device, train.logprob_chunk_tokens,
                                                 with_entropy=False)
                    width = lp.shape[1]
                else:
                    with active_routes(routes):
                        lp, _ = token_stats(model, sub, temperature, device, train.logprob_path,
                                            train.logprob_chunk_tokens, with_entropy=False)
            part = slice(lo, lo + width)
            loss, m = _token_loss(prep, algo, train, lp, idx, part, sub.response_mask[:, part].to(device),
                                  mb_tokens, len(mb_rows), device)
            if not dp.all_finite(loss):
                backend.zero_grad()
                refused = f"non-finite loss ({float(loss.detach())}); update refused"
                break
            backend.backward(loss if weight == 1.0 else loss * weight)
            if weight:
                pg_loss_total += float(loss.detach())
                _weighted(acc, m, float(sub.response_mask[:, part].sum()) / n_tokens)
        if refused:
            break
        norm = backend.step()  # backends skip the optimizer step (on every rank) when the norm is not finite
        if not math.isfinite(norm):
            skipped_steps += 1
            refused = f"non-finite gradient norm ({norm}); optimizer step skipped, update refused"
            break
        grad_norms.append(norm)
    metrics[NONFINITE_GRAD_METRIC] = float(skipped_steps)
    if refused:
        metrics["train/nonfinite"] = 1.0
        if not grad_norms:  # nothing was applied: the step is refused whole
            model.eval()
            return UpdateResult(False, metrics, reason=refused)
        # earlier mini-batches already stepped: keep them (the weights changed), report the refusal
        metrics["train/refused_minibatches"] = 1.0
    pg_loss_total, acc = dp.reduce_loss_metrics(pg_loss_total, acc)
    model.eval()

    metrics.update(
        {
            "train/pg_loss": pg_loss_total / max(1, len(grad_norms)),
            "train/clip_frac": acc.get("clip_frac", 0.0),
            "train/ratio_mean": acc.get("ratio_mean", 1.0),
            "train/ratio_max": acc.get("ratio_max", 1.0),
            "train/ratio_min": acc.get("ratio_min", 1.0),
            "train/grad_norm": sum(grad_norms) / len(grad_norms),
            "train/updates": float(len(grad_norms)),
        }
    )
    return UpdateResult(True, metrics, kept_samples=prep.kept, loss_mask=prep.loss_mask, batch=batch)


def _token_loss(prep: PreparedUpdate, algo: AlgoConfig, train: TrainConfig, lp: torch.Tensor, idx: torch.Tensor,
                part: slice, resp: torch.Tensor, mb_tokens: int, mb_seqs: int,
                device: torch.device) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one micro-batch: rows ``idx``, positions ``part`` of the prepared [B, L-1] tensors.
    The clipped surrogate (``policy_loss``), or KL-Cov's (``kl_cov_loss``) under entropy_control kl_cov."""
    old, adv, mask = prep.old_logprobs[idx, part].to(device), prep.advantages[idx].to(device), \
        prep.loss_mask[idx, part].to(device)
    weights = None if prep.is_weights is None else prep.is_weights[idx, part].to(device)
    if prep.kl_tokens is not None:
        # one optimizer step on a POIS batch: old log-probs are this model's (verl's on_policy shortcut)
        on_policy = algo.is_mode == "pois" and train.updates_per_step == 1
        return kl_cov_loss(lp, old, adv, resp, prep.kl_tokens[idx, part].to(device), algo.entropy_control.kl_cov_coef,
                           mask, mb_tokens, loss_agg=algo.loss_agg, num_seqs=mb_seqs, on_policy=on_policy)
    return policy_loss(lp, old, adv, resp, loss_mask=mask, eps_low=algo.eps_low, eps_high=algo.eps_high,
                       num_tokens=mb_tokens, loss_agg=algo.loss_agg, num_seqs=mb_seqs, is_weights=weights)


def policy_update(samples: list[Sample], ctx: UpdateContext, policy_version: Optional[int] = None) -> UpdateResult:
    """Run the UloRL update on finished samples (whole groups): ``prepare_update`` then
    ``apply_update``. Returns metrics for tracking. ``policy_version``: see ``prepare_update``."""
    prep = prepare_update(samples, ctx, policy_version)
    if isinstance(prep, UpdateResult):
        return prep
    return apply_update(prep, ctx)


@torch.no_grad()
def segment_logprobs(
    model: torch.nn.Module,
    samples: list[Sample],
    temperature: float,
    pad_token_id: int,
    token_budget: int,
    device: torch.device,
    bf16: bool = False,
) -> None:
    """SAIS: append the training model's log-probs of each sample's newest segment to ``old_logprobs``.

    Called right after a segment is decoded, at the policy version that decoded it. Stored by
    position: entry j is the log-prob of response token j. When earlier tokens have no stored
    value (a segment that was not scored), the gap is filled with this version's log-probs, so a
    later segment's values never shift onto earlier positions.
    """
    if not samples:
        return
    batch = build_train_batch(samples, pad_token_id)
    lp, _ = current_token_stats(model, batch, temperature, token_budget, device, bf16)
    for b, s in enumerate(samples):
        seg = s.segments[-1]
        p = len(s.prompt_ids)
        have = len(s.old_logprobs)
        if have < seg.end:
            s.old_logprobs.extend(lp[b, p - 1 + have : p - 1 + seg.end].tolist())


def engine_segment_logprobs(samples: list[Sample]) -> None:
    """SAIS from the engine: append the rollout engine's sampled-token log-probs of each sample's newest
    segment to ``old_logprobs`` (``log_softmax(logits / T)`` at the version that decoded it, the same
    quantity ``segment_logprobs`` recomputes with the trainer's model; they differ by the engine's
    numerics only). Stored by position, as ``segment_logprobs`` stores them."""
    for s in samples:
        seg = s.segments[-1]
        have = len(s.old_logprobs)
        if have < seg.end:
            if len(s.sampling_logprobs) < seg.end:
                raise ValueError(f"sample {s.sample_id}: the engine returned {len(s.sampling_logprobs)} log-probs for "
                                 f"{seg.end} response tokens")
            s.old_logprobs.extend(s.sampling_logprobs[have:seg.end])


def check_sais_logprobs(samples: list[Sample]) -> None:
    """SAIS needs one stored old log-prob per response token; raise naming the first sample that has not."""
    for s in samples:
        if len(s.old_logprobs) != len(s.response_ids):
            raise ValueError(
                f"is_mode 'sais': sample {getattr(s, 'sample_id', '?')} (group {s.group_id}) has "
                f"{len(s.old_logprobs)} stored old log-probs for {len(s.response_ids)} response tokens"
            )
