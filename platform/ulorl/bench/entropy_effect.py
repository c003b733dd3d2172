"""Which tokens move the policy's entropy? A first-order decomposition of one policy-gradient step.

Why MPT masking changes entropy (PAPER.md section 4): positive-advantage updates on tokens the
policy already samples with p >= tau sharpen the distribution. Whether that effect is large
enough to matter depends on the model and the sampling temperature, so this module measures it.

With POIS the first update has ratio 1 and the UloRL loss is linear in per-token terms,
``L = -(1/N) sum_{t unmasked} A_t log p_t`` (N = all response tokens, Eq. 10). Partition the
response tokens into classes c (``token_classes``: MPTs, the other tokens of reward-1 samples,
tokens of reward-0 samples); ``g_c`` = gradient of the class's part of L, so ``g = sum_c g_c``.
For a plain gradient step ``theta -= lr * g`` the batch's mean token entropy H changes, to first
order, by ``dH_c = -lr * <grad H, g_c>`` — additive over classes. Static masking removes the MPT
term: ``dH(static) = dH(all) - dH_mpt``. Adam's first step is ``-lr * sign(g)`` (not additive);
``entropy_effect`` reports its first-order dH with and without the MPT term too.

``entropy_effect`` is pure tensor code on a model and a batch; ``main`` (``python -m
ulorl.bench.entropy_effect EXPERIMENT.yaml``) rolls out batches with the experiment's model and
sampling (S = 1: the diagnostic needs finished groups, not pools) and prints the decomposition.
Meant for small models: it keeps per-class flat gradient copies (log-probs and entropy go through
the chunked LM head, no [B, T, V] tensor).
"""

from __future__ import annotations

import argparse
import functools
import operator
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch import Tensor

from ulorl.algo import group_advantages, mpt_mask
from ulorl.jsonout import emit_json, json_command
from ulorl.train.batch import TrainBatch
from ulorl.train.forward import token_stats

__all__ = ["token_classes", "entropy_effect", "EntropyEffect", "main"]

CLASSES = ("mpt", "positive_other", "negative")


def token_classes(token_logprobs: Tensor, rewards: Tensor, response_mask: Tensor, tau: float) -> dict[str, Tensor]:
    """Partition of the response tokens, each Bool[B, T]: ``mpt`` (``ulorl.algo.mpt_mask``),
    ``positive_other`` (other tokens of reward-1 samples), ``negative`` (tokens of other samples)."""
    mpt = mpt_mask(token_logprobs, rewards, response_mask, tau)
    positive = (rewards == 1).reshape(-1, 1) & response_mask
    return {"mpt": mpt, "positive_other": positive & ~mpt, "negative": response_mask & ~positive}


@dataclass
class EntropyEffect:
    """Per-batch result. ``dH_*`` are first-order changes of the mean token entropy per unit lr."""

    tokens: dict[str, int]
    grad_norm: dict[str, float]
    cos_with_total: dict[str, float]
    dH_sgd: dict[str, float]             # per class; sums to dH_sgd_all
    dH_sgd_all: float
    dH_sgd_static: float                 # without the MPT term
    dH_adam_all: float                   # first Adam step = sign(g)
    dH_adam_static: float
    entropy_mean: float


def _flat_grad(loss: Tensor, params: Sequence[Tensor], retain: bool) -> Tensor:
    grads = torch.autograd.grad(loss, params, retain_graph=retain, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def entropy_effect(model: torch.nn.Module, batch: TrainBatch, temperature: float, tau: float) -> EntropyEffect:
    """Decompose one POIS update's first-order entropy change by token class.

    Args:
        model: causal LM (parameters with ``requires_grad``); ``batch``: a ``TrainBatch`` whose
            rewards are in {0, 1}, advantages are computed per group (``group_advantages``).
        temperature: the rollout temperature (log-probs and entropy of logits / T).
        tau: MPT probability threshold.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    device = next(model.parameters()).device
    # [B, T] each, differentiable, response positions only (0 elsewhere); no [B, T, V] tensor
    lp, ent = token_stats(model, batch, temperature, device, path="chunked")
    mask = batch.response_mask.to(device)
    n = mask.sum().clamp(min=1)
    adv = group_advantages(batch.rewards, batch.group_ids).reshape(-1, 1)  # [B, 1]
    classes = token_classes(lp.detach(), batch.rewards, mask, tau)
    h_mean = (ent * mask).sum() / n
    g_h = _flat_grad(h_mean, params, retain=True)
    g = {c: _flat_grad(-(adv * lp * m).sum() / n, params, retain=True) for c, m in classes.items()}
    total = functools.reduce(operator.add, g.values())   # sum(), without its int start
    static = total - g["mpt"]

    def dh(vec: Tensor) -> float:
        return float(-(g_h @ vec))

    def cos(a: Tensor, b: Tensor) -> float:
        d = a.norm() * b.norm()
        return float(a @ b / d) if d > 0 else 0.0

    return EntropyEffect(
        tokens={c: int(m.sum()) for c, m in classes.items()},
        grad_norm={c: float(v.norm()) for c, v in g.items()},
        cos_with_total={c: cos(v, total) for c, v in g.items()},
        dH_sgd={c: dh(v) for c, v in g.items()},
        dH_sgd_all=dh(total),
        dH_sgd_static=dh(static),
        dH_adam_all=dh(torch.sign(total)),
        dH_adam_static=dh(torch.sign(static)),
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

    def mean(f):
        return sum(f(r) for r in results) / len(results)

    summary = {
        "temperature": T, "tau": tau, "batches": len(results), "entropy_mean": mean(lambda r: r.entropy_mean),
        "token_share": {c: mean(lambda r, c=c: r.tokens[c] / max(1, sum(r.tokens.values()))) for c in CLASSES},
        "grad_norm": {c: mean(lambda r, c=c: r.grad_norm[c]) for c in CLASSES},
        "dH_sgd": {c: mean(lambda r, c=c: r.dH_sgd[c]) for c in CLASSES},
        "dH_sgd_all": mean(lambda r: r.dH_sgd_all), "dH_sgd_static": mean(lambda r: r.dH_sgd_static),
        "dH_adam_all": mean(lambda r: r.dH_adam_all), "dH_adam_static": mean(lambda r: r.dH_adam_static),
        "per_batch": [asdict(r) for r in results],
    }
    if args.json:
        emit_json(summary)
        return 0
    print(f"temperature {T}, tau {tau}, {len(results)} batches, mean token entropy {summary['entropy_mean']:.4f} nats")
    print(f"{'class':<16}{'token share':>12}{'|g_c|':>12}{'dH_c (SGD, per unit lr)':>26}")
    for c in CLASSES:
        print(f"{c:<16}{summary['token_share'][c]:>12.3f}{summary['grad_norm'][c]:>12.4g}{summary['dH_sgd'][c]:>26.4g}")
    print(f"dH per unit lr, all tokens vs MPTs masked (static): SGD {summary['dH_sgd_all']:.4g} vs "
          f"{summary['dH_sgd_static']:.4g}; first Adam step {summary['dH_adam_all']:.4g} vs "
          f"{summary['dH_adam_static']:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
