"""Where the entropy goes (``ulorl.algo.entropy_decomp``, ``ulorl.train.entropy_probe``) on a one-layer
softmax policy: logits = W x(previous token), float64.

Tabular case (one-hot x, every predicting position its own input id): position t's logits are the
column W[:, id_t], so only t's own terms couple and, for H = mean over the N response tokens of the
entropy H_t at temperature T and a sampled token a with p = softmax(W[:, id_t] / T),

    s_t = <grad_W H, grad_W log p_a> = -(1 / (N T^2)) [p_a (log p_a + H_t) - sum_k p_k^2 (log p_k + H_t)]

(d log p_a / dz = (e_a - p) / T, dH_t / dz_k = -p_k (log p_k + H_t) / T). A plain gradient step
W -= lr grad L with w_t = -dL/d log p_t changes H by lr sum_t w_t s_t to first order. The tests check
that closed form, that the class terms sum to the update's change (direct gradient product and an
autograd finite step at a tiny lr), that masking a class removes exactly its term, the same with
shared parameters (dense x: every position couples), AdamW's linearised step against torch's own
step, and the trainer's probe (realized vs predicted change; a probed update trains exactly as an
unprobed one).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from ulorl.algo import group_advantages, mpt_mask, policy_loss
from ulorl.algo.entropy_decomp import (
    CLASSES,
    MPT_CLASS,
    agreement,
    cov_proxy,
    decompose,
    first_order_terms,
    loss_token_weights,
    probability_bins,
    state_cov_proxy,
    token_classes,
)
from ulorl.config import AlgoConfig, MPTConfig, TrainConfig
from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan
from ulorl.tracking import schema
from ulorl.train.backend import TorchBackend
from ulorl.train.batch import build_train_batch
from ulorl.train.entropy_probe import EntropyProbe, adam_step, plain_token_stats, probed_update, token_influence
from ulorl.train.update import UpdateContext, apply_update, policy_update, prepare_update

T = 0.85
DEV = torch.device("cpu")


class OneLayerSoftmax(torch.nn.Module):
    """logits = x(input id) @ W^T: ``features`` [ids, D] fixed, ``head.weight`` W [V, D] trained."""

    def __init__(self, features: torch.Tensor, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("features", features.to(torch.float64))
        self.head = torch.nn.Linear(features.shape[1], weight.shape[0], bias=False, dtype=torch.float64)
        with torch.no_grad():
            self.head.weight.copy_(weight)

    @property
    def base_model(self) -> OneLayerSoftmax:
        return self

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.head

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        h = self.features[input_ids]
        return SimpleNamespace(logits=self.head(h), last_hidden_state=h)


# 4 samples of one group, rewards 1, 1, 0, 0 (A = +-1), prompt 1 token + 3 response tokens each:
# sample i is ids 4i .. 4i+3, so every predicting position has its own input id (16 ids, V = 16)
REWARDS = [1.0, 1.0, 0.0, 0.0]
V = 16


def _samples() -> list[Sample]:
    out = []
    for i, r in enumerate(REWARDS):
        s = Sample(sample_id=i, group_id=0, prompt_ids=[4 * i], response_ids=[4 * i + 1, 4 * i + 2, 4 * i + 3],
                   status=SampleStatus.FINISHED, reward=r)
        s.segments = [SegmentSpan(0, 3, 0)]
        out.append(s)
    return out


def _weight(seed: int = 0) -> torch.Tensor:
    """Random logits with the sampled token boosted at chosen positions, so the batch holds every
    class: p ~ 0.97-0.999 (high), ~0.6-0.8 (mid) and < 0.5 (low) on both advantage signs."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(V, V, generator=g, dtype=torch.float64) * 0.5
    boosts = {0: 7.0, 1: 4.5, 2: 0.0, 4: 9.0, 5: 2.5, 6: 5.0, 8: 6.5, 9: 0.0, 10: 3.0, 12: 3.5, 13: 8.0, 14: 0.5}
    for pos_id, b in boosts.items():  # column pos_id predicts token pos_id + 1
        w[pos_id + 1, pos_id] += b
    return w


def _tabular() -> OneLayerSoftmax:
    return OneLayerSoftmax(torch.eye(V, dtype=torch.float64), _weight())


def _dense(seed: int = 1) -> OneLayerSoftmax:
    g = torch.Generator().manual_seed(seed)
    return OneLayerSoftmax(torch.randn(V, 3, generator=g, dtype=torch.float64),
                           torch.randn(V, 3, generator=g, dtype=torch.float64) * 2.0)


def _batch_and_adv():
    batch = build_train_batch(_samples(), pad_token_id=0)
    return batch, group_advantages(batch.rewards, batch.group_ids)


def _mean_entropy(model: OneLayerSoftmax, batch) -> torch.Tensor:
    _, ent = plain_token_stats(model, batch, T, DEV)
    return ent.sum() / batch.response_mask.sum()


def _loss(model, batch, adv, loss_mask=None) -> torch.Tensor:
    lp, _ = plain_token_stats(model, batch, T, DEV)
    loss, _ = policy_loss(lp, lp.detach(), adv, batch.response_mask, loss_mask)
    return loss


def _terms(model, batch, adv, lr):
    """(per-token SGD terms, classes at tau 0.95, lp) through the decomposition's own path."""
    params = [model.head.weight]
    lp, ent = plain_token_stats(model, batch, T, DEV)
    resp = batch.response_mask
    h = ent.sum() / resp.sum()
    grad_h = list(torch.autograd.grad(h, params, retain_graph=True))
    (s,) = token_influence(lp, params, [grad_h])
    w = loss_token_weights(lp.detach(), lp.detach(), adv, resp)
    return first_order_terms(w, s, lr), token_classes(lp.detach(), adv, resp, 0.95), lp.detach(), s


def _step_change(model, batch, adv, lr, loss_mask=None) -> tuple[float, float]:
    """(<grad H, -lr grad L> by direct backward, H after a real step W -= lr grad L minus H before)."""
    w0 = model.head.weight.detach().clone()
    (g,) = torch.autograd.grad(_loss(model, batch, adv, loss_mask), [model.head.weight])
    (gh,) = torch.autograd.grad(_mean_entropy(model, batch), [model.head.weight])
    direct = float((gh * (-lr * g)).sum())
    h0 = float(_mean_entropy(model, batch).detach())
    with torch.no_grad():
        model.head.weight.sub_(lr * g)
        h1 = float(_mean_entropy(model, batch))
        model.head.weight.copy_(w0)
    return direct, h1 - h0


def test_influence_matches_the_tabular_closed_form():
    model = _tabular()
    batch, adv = _batch_and_adv()
    _, _, lp, s = _terms(model, batch, adv, lr=1.0)
    resp = batch.response_mask
    n = int(resp.sum())
    with torch.no_grad():
        logits = model(batch.input_ids).logits[:, :-1] / T
        logp = torch.log_softmax(logits, -1)
        p = logp.exp()
        ent = -(p * logp).sum(-1, keepdim=True)
        pa = lp.exp()
        second = (p * p * (logp + ent)).sum(-1)
        closed = -(pa * (lp + ent.squeeze(-1)) - second) / (n * T * T)
    assert torch.allclose(s[resp], closed[resp], rtol=1e-10, atol=1e-14)
    # a near-certain sampled token has a tiny influence: O(q^2 log(1/q)) against O(1) at p ~ 0.6
    assert s[resp][pa[resp] > 0.99].abs().max() < 0.05 * s[resp][(pa[resp] > 0.4) & (pa[resp] < 0.9)].abs().max()


@pytest.mark.parametrize("make", [_tabular, _dense], ids=["tabular", "shared"])
def test_class_terms_sum_to_the_update_and_a_finite_step(make):
    model = make()
    batch, adv = _batch_and_adv()
    lr = 1e-6
    terms, classes, _, _ = _terms(model, batch, adv, lr)
    dec = decompose(terms, classes)
    direct, finite = _step_change(model, batch, adv, lr)
    assert dec.masked == 0.0 and dec.unmasked == dec.total
    assert dec.total == pytest.approx(direct, rel=1e-9)
    assert dec.total == pytest.approx(finite, rel=1e-4)
    assert math.fsum(dec.classes.values()) == pytest.approx(float(terms.sum()), rel=1e-12)
    assert dec.mpt == dec.classes[MPT_CLASS]


def test_the_batch_holds_every_class():
    batch, adv = _batch_and_adv()
    _, classes, lp, _ = _terms(_tabular(), batch, adv, 1.0)
    assert all(int(m.sum()) > 0 for m in classes.values()), {c: int(m.sum()) for c, m in classes.items()}
    union = torch.zeros_like(batch.response_mask)
    for m in classes.values():
        assert not (union & m).any()  # disjoint
        union |= m
    assert torch.equal(union, batch.response_mask)
    # pos_high is the paper's MPT mask (binary rewards, mixed group)
    assert torch.equal(classes[MPT_CLASS], mpt_mask(lp, batch.rewards, batch.response_mask, 0.95))


@pytest.mark.parametrize("make", [_tabular, _dense], ids=["tabular", "shared"])
@pytest.mark.parametrize("cls", CLASSES)
def test_masking_a_class_removes_exactly_its_term(make, cls):
    model = make()
    batch, adv = _batch_and_adv()
    lr = 1e-6
    terms, classes, _, _ = _terms(model, batch, adv, lr)
    full = decompose(terms, classes)
    masked = decompose(terms, classes, loss_mask=classes[cls])
    direct, finite = _step_change(model, batch, adv, lr, loss_mask=classes[cls])
    assert masked.classes[cls] == 0.0 and masked.masked == pytest.approx(full.classes[cls], rel=1e-12)
    assert masked.total == pytest.approx(full.total - full.classes[cls], rel=1e-9, abs=1e-18)
    assert masked.total == pytest.approx(direct, rel=1e-9, abs=1e-18)
    assert masked.total == pytest.approx(finite, rel=1e-4, abs=1e-15)
    assert masked.unmasked == pytest.approx(full.total, rel=1e-12) and masked.mpt == full.mpt


def test_shared_parameters_couple_positions():
    """Dense features: a token's influence is no longer its own position's closed form alone."""
    model = _dense()
    batch, adv = _batch_and_adv()
    _, _, _, s = _terms(model, batch, adv, 1.0)
    tab = _terms(OneLayerSoftmax(torch.eye(V, dtype=torch.float64), torch.randn(V, V, dtype=torch.float64)),
                 batch, adv, 1.0)[3]
    assert s[batch.response_mask].abs().min() > 0 and tab[batch.response_mask].abs().min() > 0
    lp, ent = plain_token_stats(model, batch, T, DEV)
    (g_one,) = torch.autograd.grad(lp[0, 0], [model.head.weight], retain_graph=True)
    (g_other,) = torch.autograd.grad(ent[1, 1], [model.head.weight])
    assert float((g_one * g_other).sum()) != 0.0


def test_loss_weights_are_advantage_over_n_and_zero_where_clipped():
    resp = torch.tensor([[True, True, False], [True, True, True]])
    lp = torch.log(torch.tensor([[0.5, 0.9, 1.0], [0.2, 0.6, 0.3]], dtype=torch.float64))
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    w = loss_token_weights(lp, lp, adv, resp)
    assert w.flatten().tolist() == pytest.approx([0.2, 0.2, 0.0, -0.1, -0.1, -0.1])
    old = lp.clone()
    old[0, 0] = lp[0, 0] - 0.5  # ratio e^0.5 > 1.2 with A > 0: clipped, no gradient
    w = loss_token_weights(lp, old, adv, resp)
    assert w[0, 0] == 0.0 and w[0, 1] == pytest.approx(0.2)
    assert loss_token_weights(lp, lp, adv, resp, loss_agg="seq_mean")[0].tolist() == pytest.approx([0.25, 0.25, 0.0])


def test_proxies_by_hand():
    resp = torch.tensor([[True, True], [True, True]])
    p = torch.tensor([[0.999, 0.5], [0.5, 0.2]], dtype=torch.float64)
    lp, adv = p.log(), torch.tensor([1.0, -1.0], dtype=torch.float64)
    ent = torch.tensor([[0.0079, 0.6931], [0.6931, 1.2]], dtype=torch.float64)
    mean_lp = float(lp.mean())
    cov = cov_proxy(lp, adv, resp)
    # means: A 0, lp over the 4 tokens; per token -(A - 0)(lp - mean_lp) / 4
    want = [-(math.log(0.999) - mean_lp) / 4, -(math.log(0.5) - mean_lp) / 4,
            (math.log(0.5) - mean_lp) / 4, (math.log(0.2) - mean_lp) / 4]
    assert cov.flatten().tolist() == pytest.approx(want)
    state = state_cov_proxy(lp, adv, resp, ent)
    assert state[0, 0] == pytest.approx(-(math.log(0.999) + 0.0079) / 4)
    # the batch-centred covariance gives the near-certain positive token a large entropy-lowering term,
    # the per-position one almost none
    assert cov[0, 0] < -0.1 and abs(float(state[0, 0])) < 0.01 * abs(float(cov[0, 0]))


def test_probability_bins_and_class_sums_agree():
    model = _tabular()
    batch, adv = _batch_and_adv()
    terms, classes, lp, _ = _terms(model, batch, adv, 1.0)
    bins = probability_bins(terms, lp, adv, batch.response_mask)
    assert math.fsum(bins["pos"].values()) + math.fsum(bins["neg"].values()) == pytest.approx(float(terms.sum()))
    high = sum(v for k, v in bins["pos"].items() if float(k.split("-")[0]) >= 0.95)
    assert high == pytest.approx(decompose(terms, classes).mpt, rel=1e-12)


def test_agreement_statistics():
    a = agreement([1.0, 2.0, -3.0, 4.0], [2.0, 4.0, -6.0, 8.0])
    assert a.n == 4 and a.pearson == pytest.approx(1.0) and a.spearman == pytest.approx(1.0)
    assert a.sign_agreement == 1.0
    b = agreement([1.0, -1.0, 1.0, 0.0], [1.0, 1.0, -1.0, 0.0])
    assert b.sign_agreement == 0.5
    assert math.isnan(agreement([1.0], [2.0]).pearson)


@pytest.mark.parametrize("clip", [10.0, 1e-3], ids=["no-clip", "clipped"])
def test_adam_step_is_torch_adamw_linearised(clip):
    """carry + fresh_scale * P * (-g) reproduces torch's AdamW step (after prior steps) exactly."""
    model = _dense()
    batch, adv = _batch_and_adv()
    w = model.head.weight
    opt = torch.optim.AdamW([w], lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01)
    for _ in range(3):
        opt.zero_grad()
        _loss(model, batch, adv).backward()
        opt.step()
    (g,) = torch.autograd.grad(_loss(model, batch, adv), [w])
    step = adam_step(opt, [w], [g], clip)
    predicted = step.carry[0] + step.fresh_scale * step.precond[0] * (-g)
    before = w.detach().clone()
    opt.zero_grad()
    w.grad = g.clone()
    torch.nn.utils.clip_grad_norm_([w], clip)
    opt.step()
    assert torch.allclose(w.detach() - before, predicted, rtol=1e-9, atol=1e-15)


def _ctx(model, lr, mode="static"):
    train = TrainConfig(lr=lr, logprob_path="full", micro_batch_tokens=4096, grad_clip=100.0)
    algo = AlgoConfig(mpt=MPTConfig(mode=mode, tau=0.95))
    return UpdateContext(TorchBackend(model, train), algo, train, T, 0, DEV)


def test_probe_predicts_the_realized_change_and_logs_every_name():
    model = _dense()
    ctx = _ctx(model, lr=1e-6)
    prep = prepare_update(_samples(), ctx)
    probe = EntropyProbe(every=1, keep_records=True)
    metrics, before = probe.measure(prep, ctx, step=1)
    apply_update(prep, ctx)
    realized = probe.realized(prep, ctx, before)
    predicted = metrics["entropy/exact/adam/total"] + metrics[schema.ENTROPY_CARRY_METRIC]
    assert realized == pytest.approx(predicted, rel=2e-3)
    assert set(schema.ENTROPY_PROBE_METRICS) - {schema.ENTROPY_REALIZED_METRIC} <= set(metrics)
    # static masking at tau 0.95: the masked terms are the MPT class's
    assert metrics["entropy/exact/sgd/pos_high"] == 0.0
    assert metrics["entropy/exact/sgd/masked"] == pytest.approx(metrics["entropy/exact/sgd/mpt"])
    rec = probe.records[0]
    assert float(rec.terms["sgd"][~rec.masked].sum()) == pytest.approx(metrics["entropy/exact/sgd/total"])


def test_a_probed_update_trains_exactly_as_an_unprobed_one():
    a, b = _dense(), _dense()
    ctx_a, ctx_b = _ctx(a, lr=1e-2), _ctx(b, lr=1e-2)
    ctx_b = UpdateContext(ctx_b.backend, ctx_b.algo, ctx_b.train.model_copy(update={"entropy_probe_every": 1}),
                          T, 0, DEV)
    for step in (1, 2):
        ra = policy_update(_samples(), ctx_a)
        rb = probed_update(_samples(), ctx_b, step)
        assert ra.updated and rb.updated
        assert schema.ENTROPY_REALIZED_METRIC in rb.metrics and schema.ENTROPY_REALIZED_METRIC not in ra.metrics
        assert set(schema.ENTROPY_PROXY_METRICS) <= set(ra.metrics)
    assert torch.equal(a.head.weight, b.head.weight)
