"""Which tokens move the policy's entropy? The first-order decomposition of one update, by token class.

Why MPT masking changes entropy (PAPER.md section 4): positive-advantage updates on tokens the
policy already samples with p >= tau sharpen the distribution. Whether that effect is large
enough to matter depends on the model and the sampling temperature, so this module measures it.

With POIS the first update has ratio 1 and the UloRL loss is linear in per-token terms,
``L = -(1/N) sum_{t unmasked} A_t log p_t`` (N = all response tokens, Eq. 10). The mean token
entropy H of the batch changes, to first order, by a sum of per-token terms
``lr * w_t * <d, grad log p_t>`` (``ulorl.algo.entropy_decomp``; d = grad H for a plain gradient
step, P grad H for Adam with its preconditioner P frozen), so every token class gets its exact
share and a mask removes exactly the terms of the tokens it masks: ``dH(static) = dH(all) -
dH(pos_high)``. Classes: advantage sign x probability bucket of the sampled token (``pos_high`` =
the MPTs at tau; ``mid`` 0.5 <= p < tau; ``low`` p < 0.5); ``bins`` resolve the same terms by p, so
the MPT share at any tau on ``P_EDGES`` comes from one pass. Proxies from the no-grad pass alone
(Clip-Cov's batch-centred covariance and its per-position form) are printed beside them.

``entropy_effect`` is tensor code on a model and a batch (the trainer's probe,
``ulorl.train.entropy_probe``, runs the same math every ``train.entropy_probe_every`` steps of a
run); ``main`` (``python -m ulorl.bench.entropy_effect EXPERIMENT.yaml``) rolls out batches with
the experiment's model and sampling (S = 1: the diagnostic needs finished groups, not pools) and
prints the decomposition at the untrained policy. Adam here is a fresh optimizer's first step
(P = 1 / (|g| + eps): close to sign(g)), per unit lr. Meant for small models: full [B, L, V] logits,
two backward passes and one double backward per batch.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from ulorl.algo import group_advantages
from ulorl.algo.entropy_decomp import (
    CLASSES,
    MPT_CLASS,
    P_EDGES,
    cov_proxy,
    decompose,
    first_order_terms,
    loss_token_weights,
    probability_bins,
    state_cov_proxy,
    token_classes,
)
from ulorl.jsonout import emit_json, json_command
from ulorl.train.batch import TrainBatch
from ulorl.train.entropy_probe import adam_step, plain_token_stats, token_influence

__all__ = ["GEOMETRIES", "PROXIES", "EntropyEffect", "entropy_effect", "main", "mpt_share_by_tau"]

GEOMETRIES = ("sgd", "adam")
PROXIES = ("cov", "state")
TAUS = (0.8, 0.85, 0.9, 0.95, 0.99)


@dataclass
class EntropyEffect:
    """Per-batch result. ``dH[geometry][class]``: first-order change of the mean token entropy per
    unit lr from the class's tokens (sums to ``dH_all[geometry]``); ``bins[geometry]``: the same terms
    by advantage sign and p bin (``probability_bins``); ``proxy[name][class]``: the proxies' terms."""

    tau: float
    tokens: dict[str, int]
    dH: dict[str, dict[str, float]]
    dH_all: dict[str, float]
    bins: dict[str, dict[str, dict[str, float]]]
    proxy: dict[str, dict[str, float]]
    entropy_mean: float

    def mpt_share(self, geometry: str) -> float:
        """The MPT class's share of the batch's first-order entropy change (NaN when it is 0)."""
        total = self.dH_all[geometry]
        return self.dH[geometry][MPT_CLASS] / total if total else float("nan")

    def static(self, geometry: str) -> float:
        """dH with the MPTs masked (static masking at tau): the total without the MPT term."""
        return self.dH_all[geometry] - self.dH[geometry][MPT_CLASS]


def mpt_share_by_tau(bins: dict[str, dict[str, float]], taus: Sequence[float] = TAUS) -> dict[float, float]:
    """MPT share of the total at each tau on ``P_EDGES`` from one geometry's ``bins`` (NaN when 0)."""
    total = math.fsum(v for row in bins.values() for v in row.values())
    out: dict[float, float] = {}
    for tau in taus:
        if tau not in P_EDGES:
            raise ValueError(f"tau {tau} is not a bin edge {P_EDGES}")
        mpt = math.fsum(v for k, v in bins["pos"].items() if float(k.split("-")[0]) >= tau)
        out[tau] = mpt / total if total else float("nan")
    return out


def entropy_effect(model: torch.nn.Module, batch: TrainBatch, temperature: float, tau: float) -> EntropyEffect:
    """Decompose one on-policy update's first-order entropy change by token class.

    Args:
        model: causal LM (parameters with ``requires_grad``); ``batch``: a ``TrainBatch`` whose
            rewards are in {0, 1}, advantages are computed per group (``group_advantages``).
        temperature: the rollout temperature (log-probs and entropy of logits / T).
        tau: MPT probability threshold (the ``high`` bucket).
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    params = [p for p in model.parameters() if p.requires_grad]
    device = next(model.parameters()).device
    mask = batch.response_mask.to(device)
    adv = group_advantages(batch.rewards, batch.group_ids).to(device)
    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
        lp, ent = plain_token_stats(model, batch, temperature, device)
        h_mean = (ent * mask).sum() / mask.sum().clamp(min=1)
        grad_h = [g if g is not None else torch.zeros_like(p)
                  for g, p in zip(torch.autograd.grad(h_mean, params, retain_graph=True, allow_unused=True), params)]
        weights = loss_token_weights(lp.detach(), lp.detach(), adv, mask)
        grad_l = [g if g is not None else torch.zeros_like(p) for g, p in
                  zip(torch.autograd.grad(lp, params, grad_outputs=(-weights).to(lp.dtype), retain_graph=True,
                                          allow_unused=True), params)]
        # a fresh AdamW's first step (lr 1, no clipping): its preconditioner, frozen
        adam = adam_step(torch.optim.AdamW(params, lr=1.0, weight_decay=0.0), params, grad_l, math.inf)
        adam_dir = [(pc * g.to(torch.float64)).to(g.dtype) for pc, g in zip(adam.precond, grad_h)]
        s_sgd, s_adam = token_influence(lp, params, [grad_h, adam_dir])
    classes = token_classes(lp.detach(), adv, mask, tau)
    terms = {"sgd": first_order_terms(weights, s_sgd, 1.0),
             "adam": first_order_terms(weights, s_adam, adam.fresh_scale)}
    parts = {g: decompose(t, classes) for g, t in terms.items()}
    proxies = {"cov": cov_proxy(lp.detach(), adv, mask), "state": state_cov_proxy(lp.detach(), adv, mask, ent.detach())}
    return EntropyEffect(
        tau=tau,
        tokens=parts["sgd"].tokens,
        dH={g: dict(d.classes) for g, d in parts.items()},
        dH_all={g: d.total for g, d in parts.items()},
        bins={g: probability_bins(t, lp.detach(), adv, mask) for g, t in terms.items()},
        proxy={name: decompose(x, classes).classes for name, x in proxies.items()},
        entropy_mean=float(h_mean.detach()),
    )


# ----------------------------------------------------------------------------- command line


def _batches(cfg, model, tokenizer, n_batches: int, progress: bool):
    """Yield ``TrainBatch``es of finished groups with mixed rewards (S = 1 rollouts)."""
    from ulorl.algo import dynamic_sampling_filter
    from ulorl.reward import RewardScorer
    from ulorl.rollout.engines import make_engine
    from ulorl.rollout.scheduler import SegmentScheduler
    from ulorl.rollout.types import SamplingParams
    from ulorl.train.batch import build_train_batch
    from ulorl.train.prompts import PromptStream, load_items

    r = cfg.rollout
    engine = make_engine(r, model, tokenizer)
    scorer = RewardScorer.from_config(cfg.reward)
    stream = PromptStream(load_items(cfg.data.train, cfg.data, "train"), tokenizer, seed=cfg.data.seed,
                          shuffle=cfg.data.shuffle)
    sched = SegmentScheduler(
        engine, segments=1, max_response_len=r.max_response_len, group_size=r.group_size,
        prompts_per_step=r.prompts_per_step,
        sampling=SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, seed=r.seed), seed=r.seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    try:
        for i in range(n_batches):
            res = sched.step(stream.take(r.prompts_per_step), 0,
                             score_fn=lambda done: scorer.score_samples(done, tokenizer))
            samples = [s for grp in res.groups for s in grp]
            for s in samples:
                s.reward = float(s.reward or 0.0)
            batch = build_train_batch(samples, pad)
            keep = dynamic_sampling_filter(batch.rewards, batch.group_ids)
            if progress:
                print(f"[entropy-effect] batch {i + 1}/{n_batches}: {int(keep.sum())}/{len(samples)} samples "
                      "in mixed-reward groups", file=sys.stderr)
            if keep.any():
                yield batch.rows([int(j) for j in torch.nonzero(keep).flatten()])
    finally:
        scorer.close()


@json_command
def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ulorl.bench.entropy_effect",
        description="First-order entropy change of one POIS update, split by token class "
                    "(MPTs / other positive / negative), over freshly rolled-out batches.")
    p.add_argument("experiment", help="experiment YAML (model, data, rollout sampling, algo.mpt.tau)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.temperature=1.2")
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    from ulorl.config import ConfigError, load_experiment
    from ulorl.models.loading import load_policy

    try:
        cfg = load_experiment(args.experiment, args.overrides)
    except ConfigError as exc:
        print(f"entropy_effect: {exc}", file=sys.stderr)
        return 2
    torch.manual_seed(cfg.train.seed)
    model, tok = load_policy(cfg.model.name_or_path, dtype="float32", device="cpu")
    model.eval()  # no dropout; gradients still flow
    T, tau = cfg.rollout.temperature, cfg.algo.mpt.tau
    results = [entropy_effect(model, b, T, tau) for b in _batches(cfg, model, tok, args.batches, not args.json)]
    if not results:
        print("entropy_effect: no batch had a group with mixed rewards", file=sys.stderr)
        return 1
    summary = {**summarize(results), "temperature": T}
    if args.json:
        emit_json(summary)
        return 0
    print(f"temperature {T}, tau {tau}, {len(results)} batches, mean token entropy {summary['entropy_mean']:.4f} nats")
    print(f"{'class':<10}{'token share':>12}{'dH SGD':>12}{'dH Adam':>12}{'cov proxy':>12}{'state proxy':>13}"
          "   (first-order, per unit lr, summed over batches)")
    for c in CLASSES:
        print(f"{c:<10}{summary['token_share'][c]:>12.3f}{summary['dH']['sgd'][c]:>12.4g}"
              f"{summary['dH']['adam'][c]:>12.4g}{summary['proxy']['cov'][c]:>12.4g}{summary['proxy']['state'][c]:>13.4g}")
    print(f"all tokens: SGD {summary['dH_all']['sgd']:.4g}, Adam {summary['dH_all']['adam']:.4g}; "
          f"MPTs masked (static at tau {tau}): SGD {summary['dH_static']['sgd']:.4g}, "
          f"Adam {summary['dH_static']['adam']:.4g}")
    for g in GEOMETRIES:
        shares = ", ".join(f"tau {t}: {v:.3%}" for t, v in summary["mpt_share_by_tau"][g].items())
        print(f"MPT share of the entropy change ({g}): {shares}")
    return 0


def summarize(results: Sequence[EntropyEffect]) -> dict:
    """Sums over batches (the ratios of sums: a batch with little change weighs little) and the MPT
    share at each tau of ``TAUS``."""
    n = max(1, sum(sum(r.tokens.values()) for r in results))
    bins = {g: {s: {k: math.fsum(r.bins[g][s][k] for r in results) for k in results[0].bins[g][s]}
                for s in ("pos", "neg")} for g in GEOMETRIES}
    dh_all = {g: math.fsum(r.dH_all[g] for r in results) for g in GEOMETRIES}
    dh = {g: {c: math.fsum(r.dH[g][c] for r in results) for c in CLASSES} for g in GEOMETRIES}
    return {
        "tau": results[0].tau, "batches": len(results),
        "entropy_mean": math.fsum(r.entropy_mean for r in results) / len(results),
        "token_share": {c: sum(r.tokens[c] for r in results) / n for c in CLASSES},
        "dH": dh, "dH_all": dh_all,
        "dH_static": {g: dh_all[g] - dh[g][MPT_CLASS] for g in GEOMETRIES},
        "proxy": {p: {c: math.fsum(r.proxy[p][c] for r in results) for c in CLASSES} for p in PROXIES},
        "bins": bins,
        "mpt_share_by_tau": {g: {f"{t:g}": v for t, v in mpt_share_by_tau(bins[g]).items()} for g in GEOMETRIES},
        "per_batch": [asdict(r) for r in results],
    }


if __name__ == "__main__":
    raise SystemExit(main())
