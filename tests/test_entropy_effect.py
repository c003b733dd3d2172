"""First-order entropy decomposition (``ulorl.bench.entropy_effect``) on a two-token toy policy.

Toy: logits (a, 0) at every position, q = sigmoid(a) = p(token 0). Binary entropy H(q) has
dH/da = q (1 - q) log((1 - q) / q). One group of two one-token responses: sample 0 (reward 1)
sampled token 0, sample 1 (reward 0) token 1, so A = +1 / -1 and N = 2 response tokens.
  MPT part:      L = -(1/2) log q       -> dL/da = -(1 - q)/2 -> dH per unit lr = (1 - q)/2 * dH/da
  negative part: L = +(1/2) log(1 - q)  -> dL/da = -q/2       -> dH per unit lr = q/2 * dH/da
Both are negative for q > 1/2: sharpening the likely token, and pushing down the unlikely one,
both lower the entropy; the MPT term is smaller by (1 - q) / q.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from ulorl.bench.entropy_effect import entropy_effect, token_classes
from ulorl.train.batch import TrainBatch


class Toy(torch.nn.Module):
    """Hidden state 1 at every position, LM head weight [[a], [0]]: logits (a, 0)."""

    def __init__(self, a: float) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(a, dtype=torch.float64))

    @property
    def base_model(self) -> "Toy":
        return self

    def get_output_embeddings(self) -> SimpleNamespace:
        return SimpleNamespace(weight=torch.stack([self.a, torch.zeros((), dtype=torch.float64)])[:, None], bias=None)

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        return SimpleNamespace(last_hidden_state=torch.ones(*input_ids.shape, 1, dtype=torch.float64))


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
    assert eff.tokens == {"mpt": 1, "positive_other": 0, "negative": 1}
    assert eff.dH_sgd["mpt"] == pytest.approx((1 - q) / 2 * dh_da, rel=1e-4)
    assert eff.dH_sgd["negative"] == pytest.approx(q / 2 * dh_da, rel=1e-4)
    assert eff.dH_sgd["positive_other"] == 0.0
    assert eff.dH_sgd_all == pytest.approx(sum(eff.dH_sgd.values()), rel=1e-9)
    assert eff.dH_sgd_static == pytest.approx(eff.dH_sgd["negative"], rel=1e-9)
    assert eff.entropy_mean == pytest.approx(-q * math.log(q) - (1 - q) * math.log(1 - q), rel=1e-6)
    # one parameter: the first Adam step is sign(g) = +1 either way
    assert eff.dH_adam_all == pytest.approx(dh_da, rel=1e-4) and eff.dH_adam_static == pytest.approx(dh_da, rel=1e-4)


def test_below_tau_the_positive_token_is_not_an_mpt():
    q = 0.9
    eff = entropy_effect(Toy(math.log(q / (1 - q))), _batch(), temperature=1.0, tau=0.99)
    assert eff.tokens == {"mpt": 0, "positive_other": 1, "negative": 1}
    assert eff.dH_sgd_static == pytest.approx(eff.dH_sgd_all, rel=1e-9)


def test_token_classes_partition_the_response():
    lp = torch.log(torch.tensor([[0.999, 0.5, 0.0], [0.999, 0.2, 0.0]]))
    resp = torch.tensor([[True, True, False], [True, True, False]])
    c = token_classes(lp, torch.tensor([1.0, 0.0]), resp, tau=0.99)
    assert c["mpt"].tolist() == [[True, False, False], [False, False, False]]
    assert c["positive_other"].tolist() == [[False, True, False], [False, False, False]]
    assert c["negative"].tolist() == [[False, False, False], [True, True, False]]
    assert torch.equal(c["mpt"] | c["positive_other"] | c["negative"], resp)
