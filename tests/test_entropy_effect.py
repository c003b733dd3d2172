"""First-order entropy decomposition of one update (``ulorl.bench.entropy_effect``) on a two-token toy policy.

Toy: logits (a, 0) at every position, q = sigmoid(a) = p(token 0). Binary entropy H(q) has
dH/da = q (1 - q) log((1 - q) / q). One group of two one-token responses: sample 0 (reward 1)
sampled token 0, sample 1 (reward 0) token 1, so A = +1 / -1 and N = 2 response tokens.
  MPT part (pos_high):  L = -(1/2) log q       -> dL/da = -(1 - q)/2 -> dH per unit lr = (1 - q)/2 * dH/da
  negative part (neg_low, p = 1 - q < 0.5): L = +(1/2) log(1 - q) -> dL/da = -q/2 -> dH = q/2 * dH/da
Both are negative for q > 1/2: sharpening the likely token, and pushing down the unlikely one,
both lower the entropy; the MPT term is smaller by (1 - q) / q. One parameter: a fresh Adam step
moves a by lr * sign(g) whatever the class split, and its frozen-preconditioner terms are the SGD
terms divided by |g| (P = 1 / (|g| + eps)).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from ulorl.bench.entropy_effect import entropy_effect, mpt_share_by_tau, summarize
from ulorl.train.batch import TrainBatch


class Toy(torch.nn.Module):
    """Hidden state 1 at every position, LM head weight [[a], [0]]: logits (a, 0)."""

    def __init__(self, a: float) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(a, dtype=torch.float64))

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        logits = torch.stack([self.a, torch.zeros((), dtype=torch.float64)]).expand(*input_ids.shape, 2)
        return SimpleNamespace(logits=logits)


def _batch() -> TrainBatch:
    ids = torch.tensor([[0, 0], [0, 1]])
    return TrainBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), targets=ids[:, 1:].clone(),
        response_mask=torch.tensor([[True], [True]]), sais_logprobs=torch.zeros(2, 1),
        token_versions=torch.zeros(2, 1, dtype=torch.long), rewards=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]), prompt_lens=[1, 1], response_lens=[1, 1])


def test_decomposition_matches_the_hand_derived_toy():
    q = 0.995
    eff = entropy_effect(Toy(math.log(q / (1 - q))), _batch(), temperature=1.0, tau=0.99)
    dh_da = q * (1 - q) * math.log((1 - q) / q)
    adv = 0.5 / (0.5 + 1e-6)     # |A| = (1 - 1/2) / (std 1/2 + adv_eps)
    assert eff.tokens == {"pos_high": 1, "pos_mid": 0, "pos_low": 0, "neg_high": 0, "neg_mid": 0, "neg_low": 1}
    sgd = eff.dH["sgd"]
    assert sgd["pos_high"] == pytest.approx(adv * (1 - q) / 2 * dh_da, rel=1e-6)  # A is float32
    assert sgd["neg_low"] == pytest.approx(adv * q / 2 * dh_da, rel=1e-6)  # A is float32
    assert sgd["pos_mid"] == sgd["neg_high"] == 0.0
    assert eff.dH_all["sgd"] == pytest.approx(sum(sgd.values()), rel=1e-12)
    assert eff.static("sgd") == pytest.approx(sgd["neg_low"], rel=1e-12)
    assert eff.mpt_share("sgd") == pytest.approx(1 - q, rel=1e-6)      # (1-q) / ((1-q) + q)
    assert eff.entropy_mean == pytest.approx(-q * math.log(q) - (1 - q) * math.log(1 - q), rel=1e-9)
    # one parameter, |g| = |A| / 2: the Adam terms are the SGD terms / |g| and sum to dH/da (a moves by +1)
    adam = eff.dH["adam"]
    assert eff.dH_all["adam"] == pytest.approx(dh_da, rel=1e-6)
    assert adam["pos_high"] == pytest.approx(sgd["pos_high"] / (adv / 2), rel=1e-6)


def test_below_tau_the_positive_token_is_mid():
    q = 0.92
    eff = entropy_effect(Toy(math.log(q / (1 - q))), _batch(), temperature=1.0, tau=0.99)
    assert eff.tokens["pos_high"] == 0 and eff.tokens["pos_mid"] == 1
    assert eff.static("sgd") == eff.dH_all["sgd"]
    # the bins put the positive token at 0.9-0.95: the MPT share at tau 0.9 is its term, 0 at 0.95
    shares = mpt_share_by_tau(eff.bins["sgd"], (0.9, 0.95))
    assert shares[0.9] == pytest.approx(eff.dH["sgd"]["pos_mid"] / eff.dH_all["sgd"]) and shares[0.95] == 0.0


def test_proxies_rank_the_mpt_differently():
    """The batch-centred covariance puts the MPT at half the change (both tokens are +-equally far
    from the batch mean of log p); the per-position form gives it its (1-q) / q smaller share."""
    q = 0.995
    eff = entropy_effect(Toy(math.log(q / (1 - q))), _batch(), temperature=1.0, tau=0.99)
    cov, state = eff.proxy["cov"], eff.proxy["state"]
    assert cov["pos_high"] == pytest.approx(cov["neg_low"], rel=1e-9)
    assert abs(state["pos_high"]) < 0.01 * abs(state["neg_low"])


def test_summary_sums_batches():
    toy = Toy(math.log(0.95 / 0.05))
    effects = [entropy_effect(toy, _batch(), temperature=1.0, tau=0.9) for _ in range(2)]
    s = summarize(effects)
    assert s["dH_all"]["sgd"] == pytest.approx(2 * effects[0].dH_all["sgd"])
    assert s["token_share"]["pos_high"] == 0.5
    assert s["mpt_share_by_tau"]["sgd"]["0.9"] == pytest.approx(effects[0].mpt_share("sgd"))
