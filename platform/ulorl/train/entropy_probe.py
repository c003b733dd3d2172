"""The exact first-order entropy decomposition of an update, every ``train.entropy_probe_every`` steps.

For the update the step is about to apply (its kept batch, advantages, old log-probs, loss mask),
the probe computes, before the optimizer step (``ulorl.algo.entropy_decomp`` has the math):

* ``grad H``: the gradient of the probe batch's mean token entropy (``train.entropy_probe_batch``:
  the step's own batch or the first probed step's, kept);
* every response token's influence ``s_t = <d, grad lp_t>`` for d = grad H (SGD geometry) and
  d = P grad H (AdamW geometry, P = 1 / (sqrt(v_hat) + eps) with this step's second moment): one
  double backward through the policy (``token_influence``), no per-class backward;
* per-token terms ``scale * w_t * s_t`` (w_t = -dL / d lp_t), summed per token class and mask part.

SGD: ``scale = lr``, the change a plain gradient step at ``train.lr`` would make. AdamW: the
update ``-lr (beta1 m + (1 - beta1) c g) / (1 - beta1^k) / (sqrt(v_hat) + eps) - lr wd theta`` (c the
grad-clip factor) splits into the fresh gradient's part, ``scale = lr (1 - beta1) c / (1 - beta1^k)``
along P, which the classes share exactly with P and c frozen at this step's values, and the
``carry`` (momentum and weight decay: earlier steps' tokens). After the step the probe measures the
change the update really made (``entropy/exact/realized``) against the predicted
``adam/total + carry``.

Costs two forward passes over full logits ([B, L, V]; the chunked LM head is not twice
differentiable) and about four backward passes: meant for the tiny embedded models. Attention runs
through SDPA's math kernel inside the probe (the fused CPU kernel has no double backward). The
probe reads the optimizer state and changes nothing: a probed run trains exactly as an unprobed one
(tests/test_entropy_probe.py).

    update = probed_update(samples, ctx, step)   # the trainer's call: policy_update + the probe when due
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor

from ulorl.algo.entropy_decomp import (
    Decomposition,
    decompose,
    first_order_terms,
    loss_token_weights,
    token_classes,
)
from ulorl.rollout.types import Sample
from ulorl.tracking.schema import (
    ENTROPY_CARRY_METRIC,
    ENTROPY_EXACT_PREFIXES,
    ENTROPY_PROBE_ENTROPY_METRIC,
    ENTROPY_REALIZED_METRIC,
)
from ulorl.train.backend import TorchBackend
from ulorl.train.batch import TrainBatch
from ulorl.train.forward import forward_logits
from ulorl.train.update import (
    PreparedUpdate,
    UpdateContext,
    UpdateResult,
    apply_update,
    policy_update,
    prepare_update,
)

__all__ = ["AdamStep", "EntropyProbe", "ProbeRecord", "adam_step", "plain_token_stats", "probe_of", "probed_update",
           "token_influence"]


def plain_token_stats(model: torch.nn.Module, batch: TrainBatch, temperature: float,
                      device: torch.device) -> tuple[Tensor, Tensor]:
    """(log-probs, entropy) of every response target, each Float[B, L-1] (float32, or float64 for a
    float64 model), 0 elsewhere, from the model's full logits with plain torch ops: twice
    differentiable (``token_influence``)."""
    logits = forward_logits(model, batch, device)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    logp = torch.log_softmax(logits, dim=-1)
    mask = batch.response_mask.to(device)
    lp = logp.gather(-1, batch.targets.to(device).long().unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
    return torch.where(mask, lp, zero), torch.where(mask, ent, zero)


def token_influence(logprobs: Tensor, params: Sequence[Tensor], directions: Sequence[Sequence[Tensor]]) -> list[Tensor]:
    """``s_t = <d, grad_params lp_t>`` for every entry t of ``logprobs`` and each direction d.

    One Jacobian-vector product per direction through double backward: ``g(u) = J^T u`` with
    ``create_graph``, then ``d/du <d, g(u)> = J d``. No per-token or per-class backward pass.

    Args:
        logprobs: Float[B, T] with a graph to ``params`` that is twice differentiable.
        params: the parameters; directions: one tensor per parameter each (same shapes).
    Returns:
        one Float[B, T] per direction (detached).
    """
    u = torch.zeros_like(logprobs, requires_grad=True)
    grads = torch.autograd.grad(logprobs, list(params), grad_outputs=u, create_graph=True, allow_unused=True)
    used = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
    out: list[Tensor] = []
    for k, d in enumerate(directions):
        if not used:
            out.append(torch.zeros_like(logprobs).detach())
            continue
        (s,) = torch.autograd.grad([grads[i] for i in used], u, grad_outputs=[d[i] for i in used],
                                   retain_graph=k < len(directions) - 1, allow_unused=True)
        out.append((s if s is not None else torch.zeros_like(logprobs)).detach())
    return out


@dataclass(frozen=True)
class AdamStep:
    """One AdamW step of ``torch.optim.AdamW`` linearised in the fresh gradient.

    ``precond[i]`` = 1 / (sqrt(v_hat) + eps) per parameter with this step's second moment;
    ``fresh_scale`` = lr (1 - beta1) c / (1 - beta1^k) (c: grad-clip factor, k: the step number);
    ``carry[i]``: the parameter change from the old momentum and weight decay (no fresh gradient).
    The step is ``carry + fresh_scale * precond * (-grad L)``.
    """

    precond: list[Tensor]
    fresh_scale: float
    carry: list[Tensor]


def adam_step(optimizer: torch.optim.Optimizer, opt_params: Sequence[Tensor], grads: Sequence[Tensor],
              grad_clip: float) -> AdamStep:
    """The :class:`AdamStep` that ``optimizer.step()`` would take after ``grads`` (the loss gradient,
    before clipping) were clipped to norm ``grad_clip`` (``TorchBackend.step``).

    ``opt_params``: the tensors the optimizer holds (the parameters, or their float32 masters),
    index-aligned with ``grads``; its state is read, never written.
    """
    norm = math.sqrt(math.fsum(float(g.double().pow(2).sum()) for g in grads))
    clip = min(1.0, grad_clip / (norm + 1e-6))
    group = optimizer.param_groups[0]
    lr, (b1, b2), eps, wd = float(group["lr"]), group["betas"], float(group["eps"]), float(group["weight_decay"])
    precond, carry = [], []
    step = 0
    for op, g in zip(opt_params, grads):
        st = optimizer.state.get(op, {})
        step = int(st["step"]) if "step" in st else 0
        m = st.get("exp_avg", torch.zeros_like(op)).to(torch.float64)
        v = st.get("exp_avg_sq", torch.zeros_like(op)).to(torch.float64)
        k = step + 1
        v_new = b2 * v + (1 - b2) * (clip * g.detach().to(torch.float64)) ** 2
        denom = v_new.sqrt() / math.sqrt(1 - b2 ** k) + eps
        precond.append(1.0 / denom)
        carry.append(-(lr / (1 - b1 ** k)) * b1 * m / denom - lr * wd * op.detach().to(torch.float64))
    k = step + 1
    return AdamStep(precond=precond, fresh_scale=lr * (1 - b1) * clip / (1 - b1 ** k), carry=carry)


@dataclass
class ProbeRecord:
    """One probed step, response tokens flattened (kept for maps, ``EntropyProbe(keep_records=True)``).

    ``p``, ``advantage``: Float[n] of the sampled tokens; ``masked``: Bool[n]; ``terms``: Float[n] per
    geometry ("sgd", "adam"); ``summary``: the step's logged metrics."""

    step: int
    p: Tensor
    advantage: Tensor
    masked: Tensor
    terms: dict[str, Tensor]
    summary: dict[str, float]


def _dot(a: Sequence[Tensor], b: Sequence[Tensor]) -> float:
    return math.fsum(float((x.to(torch.float64) * y.to(torch.float64)).sum()) for x, y in zip(a, b))


@dataclass
class EntropyProbe:
    """A run's probe: its schedule, the fixed probe batch once taken, kept records (optional)."""

    every: int
    batch_mode: str = "step"
    keep_records: bool = False
    fixed_batch: Optional[TrainBatch] = None
    records: list[ProbeRecord] = field(default_factory=list)

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def probe_batch(self, prep: PreparedUpdate) -> TrainBatch:
        if self.batch_mode == "step":
            return prep.batch
        if self.fixed_batch is None:
            self.fixed_batch = prep.batch
        return self.fixed_batch

    def measure(self, prep: PreparedUpdate, ctx: UpdateContext, step: int) -> tuple[dict[str, float], float]:
        """The decomposition of the update ``prep`` describes (before it is applied): its metrics and
        the probe batch's mean token entropy."""
        backend, algo, device, temperature = ctx.backend, ctx.algo, ctx.device, ctx.temperature
        if not isinstance(backend, TorchBackend) or not backend.params:
            raise ValueError("train.entropy_probe_every: the probe needs the one-process torch backend "
                             "(train.backend torch)")
        optimizer = backend.optimizer
        params: list[Tensor] = list(backend.params)
        opt_params = backend.masters or params
        model = backend.model
        model.eval()
        batch = prep.batch
        resp = batch.response_mask.to(device)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
            lp, ent = plain_token_stats(model, batch, temperature, device)
            probe = self.probe_batch(prep)
            if probe is batch:
                probe_ent, probe_resp = ent, resp
            else:
                _, probe_ent = plain_token_stats(model, probe, temperature, device)
                probe_resp = probe.response_mask.to(device)
            h = (probe_ent * probe_resp).sum() / probe_resp.sum().clamp(min=1)
            grad_h = [g if g is not None else torch.zeros_like(p) for g, p in
                      zip(torch.autograd.grad(h, params, retain_graph=True, allow_unused=True), params)]
            weights = loss_token_weights(
                lp.detach(), prep.old_logprobs.to(device), prep.advantages.to(device), resp, eps_low=algo.eps_low,
                eps_high=algo.eps_high, loss_agg=algo.loss_agg, num_tokens=float(batch.num_response_tokens),
                num_seqs=float(len(prep.kept)))
            keep = resp & ~prep.loss_mask.to(device)
            applied = torch.where(keep, -weights, torch.zeros_like(weights)).to(lp.dtype)
            loss_grads = [g if g is not None else torch.zeros_like(p) for g, p in
                          zip(torch.autograd.grad(lp, params, grad_outputs=applied, retain_graph=True,
                                                  allow_unused=True), params)]
            adam = adam_step(optimizer, opt_params, loss_grads, ctx.train.grad_clip)
            adam_dir = [(pc * g.to(torch.float64)).to(g.dtype) for pc, g in zip(adam.precond, grad_h)]
            s_sgd, s_adam = token_influence(lp, params, [grad_h, adam_dir])
        classes = token_classes(lp.detach(), prep.advantages.to(device), resp, algo.mpt.tau)
        terms = {"sgd": first_order_terms(weights, s_sgd, ctx.train.lr),
                 "adam": first_order_terms(weights, s_adam, adam.fresh_scale)}
        mask = prep.loss_mask.to(device)
        parts: dict[str, Decomposition] = {g: decompose(t, classes, mask) for g, t in terms.items()}
        metrics: dict[str, float] = {}
        for prefix, geom in zip(ENTROPY_EXACT_PREFIXES, ("sgd", "adam")):
            metrics.update(parts[geom].metrics(prefix))
        metrics[ENTROPY_CARRY_METRIC] = _dot(grad_h, adam.carry)
        metrics[ENTROPY_PROBE_ENTROPY_METRIC] = float(h.detach())
        if self.keep_records:
            adv = torch.where(resp, prep.advantages.to(device).reshape(-1, 1).expand_as(resp).to(torch.float64),
                              torch.zeros((), dtype=torch.float64))
            self.records.append(ProbeRecord(
                step=step, p=lp.detach()[resp].exp().to(torch.float64).cpu(), advantage=adv[resp].cpu(),
                masked=prep.loss_mask.to(device)[resp].cpu(), terms={g: t[resp].cpu() for g, t in terms.items()},
                summary=metrics))
        return metrics, float(h.detach())

    @torch.no_grad()
    def realized(self, prep: PreparedUpdate, ctx: UpdateContext, before: float) -> float:
        """Mean token entropy change of the probe batch across the applied update."""
        probe = self.fixed_batch if self.batch_mode == "fixed" and self.fixed_batch is not None else prep.batch
        _, ent = plain_token_stats(ctx.backend.model, probe, ctx.temperature, ctx.device)
        resp = probe.response_mask.to(ctx.device)
        return float((ent * resp).sum() / resp.sum().clamp(min=1)) - before


#: one probe per training backend (one backend per run), so the trainer needs no state of its own
_PROBES: weakref.WeakKeyDictionary[Any, EntropyProbe] = weakref.WeakKeyDictionary()


def probe_of(ctx: UpdateContext, keep_records: bool = False) -> EntropyProbe:
    """The run's :class:`EntropyProbe` (created on first use from ``train.entropy_probe_*``)."""
    probe = _PROBES.get(ctx.backend)
    if probe is None:
        probe = _PROBES[ctx.backend] = EntropyProbe(ctx.train.entropy_probe_every, ctx.train.entropy_probe_batch,
                                                    keep_records=keep_records)
    return probe


def probed_update(samples: list[Sample], ctx: UpdateContext, step: int,
                  policy_version: Optional[int] = None) -> UpdateResult:
    """``policy_update``, with the exact entropy decomposition (``entropy/exact/*``) added to the
    update's metrics at steps that are a multiple of ``train.entropy_probe_every``. ``policy_version``:
    the version that decoded this step's segments (see ``prepare_update``)."""
    if not ctx.train.entropy_probe_every or step % ctx.train.entropy_probe_every:
        return policy_update(samples, ctx, policy_version)
    prep = prepare_update(samples, ctx, policy_version)
    if isinstance(prep, UpdateResult):
        return prep
    probe = probe_of(ctx)
    metrics, before = probe.measure(prep, ctx, step)
    result = apply_update(prep, ctx)
    if result.updated:
        metrics[ENTROPY_REALIZED_METRIC] = probe.realized(prep, ctx, before)
        if probe.records and probe.records[-1].step == step:
            probe.records[-1].summary[ENTROPY_REALIZED_METRIC] = metrics[ENTROPY_REALIZED_METRIC]
    result.metrics.update(metrics)
    return result
