"""Rollout correction (ulorl.algo.rollout_correction) on tiny tensors with hand-derived expectations: every
allowed mode x is_mode pair, through select_old_logprobs and policy_loss (weights, rejected tokens, loss,
gradient); the mismatch statistics; the refusals of the pairs that are not allowed.

The batch (B = 2, T = 4; row 1's last position is padding). Row 0 has two segments: tokens 0-1 decoded at
version 0, tokens 2-3 at version 1; row 1 one segment at version 1. The update starts from version V = 1.
Every log-prob is chosen so that the ratios are round numbers:

    engine mu = cur - log(rho_pois)   with rho_pois = [[4, 1/4, 3/2, 1], [2/5, 6, 1, -]]
    SAIS stored (the trainer at each segment's version) = cur on version-1 tokens, cur - log(q) on
    row 0's version-0 tokens with q = [5/2, 2/5]: rho_sais = rho_pois / q = [[8/5, 5/8, 3/2, 1], [2/5, 6, 1, -]]
    PPO ratio at the first update: POIS / TOIS r = 1; SAIS r = cur / stored = [[5/2, 2/5, 1, 1], [1, 1, 1, -]]

C = 2, IcePop [0.5, 5], advantages A = [+1, -1], eps 0.2, token_mean over the N = 7 response tokens.
"""

from __future__ import annotations

import math

import pytest
import torch

from ulorl.algo import policy_loss, select_old_logprobs
from ulorl.algo.rollout_correction import (
    ROLLOUT_CORRECTIONS,
    CorrectionInputs,
    bucket_width,
    correction_stats,
    group_sum,
    mismatch_stats,
    position_buckets,
    rollout_correction,
    sequence_groups,
)
from ulorl.config import ConfigError, load_experiment

T, F = True, False
RESP = torch.tensor([[T, T, T, T], [T, T, T, F]])
CUR = torch.tensor([[-0.7, -1.1, -0.3, -2.0], [-0.9, -0.4, -1.6, 0.0]])
RHO_POIS = torch.tensor([[4.0, 0.25, 1.5, 1.0], [0.4, 6.0, 1.0, 1.0]], dtype=torch.float64)
Q = torch.tensor([[2.5, 0.4, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
ENGINE = (CUR.double() - RHO_POIS.log()).float()
STORED = (CUR.double() - Q.log()).float()
SEGMENTS = torch.tensor([[0, 0, 1, 1], [0, 0, 0, -1]])          # S = 4 rollout
ONE_SEGMENT = torch.tensor([[0, 0, 0, 0], [0, 0, 0, -1]])       # TOIS: S = 1
ADV = torch.tensor([1.0, -1.0])
N = 7.0

# Expected weights (rejected tokens: weight 0 and in ``rejected``). POIS: rho = RHO_POIS; SAIS: rho = RHO_POIS / Q.
# token_tis min(rho, 2); token_mis rho, rejected rho > 2; seq_tis min(prod, 2); seq_mis prod, rejected prod > 2;
# icepop rho, rejected rho < 0.5 or rho > 5. Products (scope response): POIS row 0 = 4 * 1/4 * 3/2 * 1 = 3/2,
# row 1 = 2/5 * 6 * 1 = 12/5 > 2; SAIS row 0 = 8/5 * 5/8 * 3/2 * 1 = 3/2, row 1 = 12/5. Scope segment: row 0's
# segments 4 * 1/4 = 1 and 3/2 * 1 = 3/2 (POIS), 8/5 * 5/8 = 1 and 3/2 (SAIS); row 1 one segment = 12/5.
# TOIS (S = 1) uses POIS's numbers with one segment per row, so scope segment == scope response.
# geo_tis / geo_mis: the products' geometric means, every one inside [1/2, 2] (nothing truncated or rejected):
# row 0 (4 tokens) (3/2)^(1/4), row 1 (3 tokens) (12/5)^(1/3); scope segment: row 0's 2-token segments
# 1^(1/2) = 1 and (3/2)^(1/2).
G0, G1, GS = 1.5 ** 0.25, 2.4 ** (1 / 3), 1.5 ** 0.5
X = None   # rejected
EXPECTED: dict[tuple[str, str, str], list[list[float | None]]] = {
    ("pois", "off", "response"): [[1, 1, 1, 1], [1, 1, 1]],
    ("pois", "token_tis", "response"): [[2, 0.25, 1.5, 1], [0.4, 2, 1]],
    ("pois", "token_mis", "response"): [[X, 0.25, 1.5, 1], [0.4, X, 1]],
    ("pois", "seq_tis", "response"): [[1.5, 1.5, 1.5, 1.5], [2, 2, 2]],
    ("pois", "seq_mis", "response"): [[1.5, 1.5, 1.5, 1.5], [X, X, X]],
    ("pois", "seq_tis", "segment"): [[1, 1, 1.5, 1.5], [2, 2, 2]],
    ("pois", "seq_mis", "segment"): [[1, 1, 1.5, 1.5], [X, X, X]],
    ("pois", "icepop", "response"): [[4, X, 1.5, 1], [X, X, 1]],
    ("pois", "geo_tis", "response"): [[G0, G0, G0, G0], [G1, G1, G1]],
    ("pois", "geo_mis", "response"): [[G0, G0, G0, G0], [G1, G1, G1]],
    ("pois", "geo_tis", "segment"): [[1, 1, GS, GS], [G1, G1, G1]],
    ("pois", "geo_mis", "segment"): [[1, 1, GS, GS], [G1, G1, G1]],
    ("sais", "geo_tis", "response"): [[G0, G0, G0, G0], [G1, G1, G1]],
    ("sais", "geo_mis", "response"): [[G0, G0, G0, G0], [G1, G1, G1]],
    ("sais", "geo_tis", "segment"): [[1, 1, GS, GS], [G1, G1, G1]],
    ("sais", "geo_mis", "segment"): [[1, 1, GS, GS], [G1, G1, G1]],
    ("tois", "geo_tis", "response"): [[G0, G0, G0, G0], [G1, G1, G1]],
    ("tois", "geo_mis", "response"): [[G0, G0, G0, G0], [G1, G1, G1]],
    ("tois", "geo_tis", "segment"): [[G0, G0, G0, G0], [G1, G1, G1]],
    ("tois", "geo_mis", "segment"): [[G0, G0, G0, G0], [G1, G1, G1]],
    ("sais", "off", "response"): [[1, 1, 1, 1], [1, 1, 1]],
    ("sais", "token_tis", "response"): [[1.6, 0.625, 1.5, 1], [0.4, 2, 1]],
    ("sais", "token_mis", "response"): [[1.6, 0.625, 1.5, 1], [0.4, X, 1]],
    ("sais", "seq_tis", "response"): [[1.5, 1.5, 1.5, 1.5], [2, 2, 2]],
    ("sais", "seq_mis", "response"): [[1.5, 1.5, 1.5, 1.5], [X, X, X]],
    ("sais", "seq_tis", "segment"): [[1, 1, 1.5, 1.5], [2, 2, 2]],
    ("sais", "seq_mis", "segment"): [[1, 1, 1.5, 1.5], [X, X, X]],
    ("sais", "icepop", "response"): [[1.6, 0.625, 1.5, 1], [X, X, 1]],
    ("tois", "off", "response"): [[1, 1, 1, 1], [1, 1, 1]],
    ("tois", "token_tis", "response"): [[2, 0.25, 1.5, 1], [0.4, 2, 1]],
    ("tois", "token_mis", "response"): [[X, 0.25, 1.5, 1], [0.4, X, 1]],
    ("tois", "seq_tis", "response"): [[1.5, 1.5, 1.5, 1.5], [2, 2, 2]],
    ("tois", "seq_mis", "response"): [[1.5, 1.5, 1.5, 1.5], [X, X, X]],
    ("tois", "seq_tis", "segment"): [[1.5, 1.5, 1.5, 1.5], [2, 2, 2]],
    ("tois", "seq_mis", "segment"): [[1.5, 1.5, 1.5, 1.5], [X, X, X]],
    ("tois", "icepop", "response"): [[4, X, 1.5, 1], [X, X, 1]],
}
# SAIS's PPO ratio r = [[5/2, 2/5, 1, 1], [1, 1, 1]]: on row 0 (A = +1) token 0 is clipped at 1 + eps = 1.2 (no
# gradient), token 1 keeps r = 2/5 (min(2/5, 0.8)); every other token has r = 1. Per kept token the loss term is
# -w * min(r A, clip(r) A) / N and its gradient d/dcur = -w * A * r / N where the clip is not active.
SAIS_SURR = [[1.2, 0.4, 1.0, 1.0], [-1.0, -1.0, -1.0]]      # min(r A, clip(r) A)
SAIS_GRAD_R = [[0.0, 0.4, 1.0, 1.0], [1.0, 1.0, 1.0]]       # r where the clip is inactive, 0 where active


def _weights(rows: list[list[float | None]]) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.zeros(2, 4)
    rej = torch.zeros(2, 4, dtype=torch.bool)
    for b, row in enumerate(rows):
        for t, v in enumerate(row):
            if v is None:
                rej[b, t] = True
            else:
                w[b, t] = v
    return w, rej


def _inputs(is_mode: str, scope: str, mode: str) -> tuple[torch.Tensor, CorrectionInputs]:
    cur = CUR.clone().requires_grad_(True)
    old = select_old_logprobs(is_mode, cur, STORED if is_mode == "sais" else None)
    segments = ONE_SEGMENT if is_mode == "tois" else SEGMENTS
    x = CorrectionInputs(old, ENGINE, RESP, sequence_groups(segments, RESP, scope), threshold=2.0, low=0.5, high=5.0)
    return cur, x


@pytest.mark.parametrize("is_mode,mode,scope", sorted(EXPECTED))
def test_every_allowed_mode_x_is_mode_pair_by_hand(is_mode, mode, scope):
    cur, x = _inputs(is_mode, scope, mode)
    corr = rollout_correction(mode)(x)
    want_w, want_rej = _weights(EXPECTED[(is_mode, mode, scope)])
    torch.testing.assert_close(corr.weights, want_w, rtol=1e-5, atol=1e-6)
    assert torch.equal(corr.rejected, want_rej)
    assert not corr.weights.requires_grad
    # through the loss: rejected tokens join loss_mask, the weights scale the kept terms
    loss, m = policy_loss(cur, x.old_logprobs, ADV, RESP, loss_mask=corr.rejected, is_weights=corr.weights)
    loss.backward()
    keep = RESP & ~want_rej
    if is_mode == "sais":
        surr = torch.tensor([row + [0.0] * (4 - len(row)) for row in SAIS_SURR])
        grad_r = torch.tensor([row + [0.0] * (4 - len(row)) for row in SAIS_GRAD_R])
    else:   # POIS / TOIS at the first update: r = 1, nothing clipped, min(r A, clip(r) A) = A
        surr = ADV.reshape(-1, 1).expand(2, 4)
        grad_r = torch.ones(2, 4)
    want_loss = -float((want_w * surr * keep).sum()) / N
    want_grad = -(want_w * ADV.reshape(-1, 1) * grad_r * keep) / N
    assert loss.item() == pytest.approx(want_loss, rel=1e-5, abs=1e-7)
    torch.testing.assert_close(cur.grad, want_grad, rtol=1e-5, atol=1e-7)
    assert m["num_tokens"].item() == N          # rejected tokens stay in the Eq. 10 denominator


def test_every_registered_mode_is_covered_for_every_is_mode():
    for is_mode in ("pois", "sais", "tois"):
        assert {m for (i, m, _) in EXPECTED if i == is_mode} == set(ROLLOUT_CORRECTIONS)


def test_off_leaves_the_loss_unchanged():
    cur, x = _inputs("sais", "response", "off")
    corr = rollout_correction("off")(x)
    plain, _ = policy_loss(cur, x.old_logprobs, ADV, RESP)
    weighted, _ = policy_loss(cur, x.old_logprobs, ADV, RESP, loss_mask=corr.rejected, is_weights=corr.weights)
    assert weighted.item() == plain.item()


def test_correction_stats_by_hand():
    # POIS token_tis: weights [[2, 1/4, 3/2, 1], [2/5, 2, 1]]: mean 8.15 / 7; tokens 0 (rho 4) and row 1's
    # token 1 (rho 6) truncated at C: 2 of 7
    _, x = _inputs("pois", "response", "token_tis")
    s = correction_stats(rollout_correction("token_tis")(x), x)
    assert s["rejected_frac"] == 0.0 and s["truncated_frac"] == pytest.approx(2 / 7)
    assert s["weight_mean"] == pytest.approx(8.15 / 7) and s["weight_min"] == pytest.approx(0.25)
    assert s["weight_max"] == pytest.approx(2.0)
    # POIS seq_mis: row 1 (3 tokens) rejected; seq_tis truncates row 1's product 12/5 at 2 (3 tokens)
    _, x = _inputs("pois", "response", "seq_mis")
    stats = correction_stats(rollout_correction("seq_mis")(x), x, sequence=True)
    assert stats["rejected_frac"] == pytest.approx(3 / 7)
    _, x = _inputs("pois", "response", "seq_tis")
    stats = correction_stats(rollout_correction("seq_tis")(x), x, sequence=True)
    assert stats["truncated_frac"] == pytest.approx(3 / 7)


def test_safety_bound_keeps_a_long_sequence_finite():
    # 100 tokens each with log-ratio -0.5: the sum -50 is bounded at -20 (verl's bound), the product never underflows
    resp = torch.ones(1, 100, dtype=torch.bool)
    groups = sequence_groups(torch.zeros(1, 100), resp)
    x = CorrectionInputs(torch.zeros(1, 100), torch.full((1, 100), 0.5), resp, groups)
    w = rollout_correction("seq_tis")(x).weights
    assert torch.allclose(w, torch.full((1, 100), math.exp(-20.0)))
    # a token log-ratio of +30 is bounded at +20 before truncation / masking
    x = CorrectionInputs(torch.tensor([[0.0]]), torch.tensor([[-30.0]]), torch.ones(1, 1, dtype=torch.bool),
                         torch.zeros(1, 1, dtype=torch.long))
    assert x.token_ratio().item() == pytest.approx(math.exp(20.0))


@pytest.mark.parametrize("mode,want", [("seq_tis", math.exp(-3.0)), ("seq_mis", math.exp(-3.0))])
def test_sequence_ratio_bounds_the_sum_not_each_token(mode, want):
    # one token at -25 among two at +11 (sum +22): the true product is e^(-25 + 22) = e^-3 = 0.0498. Clamping each
    # token to -20 first gave e^(-20 + 22) = e^2, truncated to C = 2 (seq_tis) or rejected (seq_mis).
    resp = torch.ones(1, 3, dtype=torch.bool)
    x = CorrectionInputs(torch.tensor([[-25.0, 11.0, 11.0]]), torch.zeros(1, 3), resp,
                         sequence_groups(torch.zeros(1, 3), resp))
    corr = rollout_correction(mode)(x)
    torch.testing.assert_close(corr.weights, torch.full((1, 3), want, dtype=torch.float32))
    assert not bool(corr.rejected.any())
    assert correction_stats(corr, x, sequence=True)["truncated_frac"] == 0.0


def test_sequence_sum_is_bounded_after_summing():
    # 3 tokens at +15 each: the sum +45 is bounded at +20 (not each token at 15 < 20 and the sum left alone)
    resp = torch.ones(1, 3, dtype=torch.bool)
    x = CorrectionInputs(torch.full((1, 3), 15.0), torch.zeros(1, 3), resp, torch.zeros(1, 3, dtype=torch.long))
    assert torch.allclose(x.sequence_ratio(), torch.full((1, 3), math.exp(20.0), dtype=torch.float64))
    # an infinite token log-ratio (trainer log-prob -inf) collapses its sequence to the lower bound, finite
    x = CorrectionInputs(torch.tensor([[-math.inf, 0.0, 0.0]]), torch.full((1, 3), -1.0), resp,
                         torch.zeros(1, 3, dtype=torch.long))
    assert torch.allclose(x.sequence_ratio(), torch.full((1, 3), math.exp(-20.0), dtype=torch.float64))


def test_geometric_ratio_survives_a_long_sequence():
    # 128k tokens, each log-ratio -0.001: the product e^-131.072 saturates at the bound e^-20 (a weight of 2e-9 that
    # says nothing about the policy), the geometric mean is e^-0.001 per token
    n = 131_072
    resp = torch.ones(1, n, dtype=torch.bool)
    groups = sequence_groups(torch.zeros(1, n), resp)
    x = CorrectionInputs(torch.full((1, n), -0.001), torch.zeros(1, n), resp, groups)
    assert rollout_correction("seq_tis")(x).weights[0, 0].item() == pytest.approx(math.exp(-20.0))
    w = rollout_correction("geo_tis")(x).weights
    assert torch.allclose(w, torch.full((1, n), math.exp(-0.001)), rtol=1e-6)
    assert not bool(rollout_correction("geo_mis")(x).rejected.any())


def test_geometric_modes_truncate_and_reject_by_hand():
    # row 0: log-ratios [ln 9, ln 1, 0 pad] over 2 tokens -> rho_g = 9^(1/2) = 3 > C = 2: geo_tis w = 2 (truncated),
    # geo_mis rejects row 0. Row 1: [ln(1/16), ln 1] -> rho_g = 1/4 < 1/C = 1/2: geo_tis keeps 1/4, geo_mis rejects.
    # Row 2: [ln 2, ln(1/2)] -> 1: kept by both. Padding (row 0's last position) stays 0 / not rejected.
    resp = torch.tensor([[T, T, F], [T, T, F], [T, T, F]])
    old = torch.tensor([[math.log(9.0), 0.0, 5.0], [math.log(1 / 16), 0.0, 0.0], [math.log(2.0), math.log(0.5), 0.0]])
    x = CorrectionInputs(old, torch.zeros(3, 3), resp, sequence_groups(torch.zeros(3, 3), resp), threshold=2.0)
    tis = rollout_correction("geo_tis")(x)
    torch.testing.assert_close(tis.weights, torch.tensor([[2.0, 2.0, 0.0], [0.25, 0.25, 0.0], [1.0, 1.0, 0.0]]))
    assert not bool(tis.rejected.any())
    assert correction_stats(tis, x, ratio_kind="geometric")["truncated_frac"] == pytest.approx(2 / 6)
    mis = rollout_correction("geo_mis")(x)
    assert mis.rejected.tolist() == [[T, T, F], [T, T, F], [F, F, F]]
    torch.testing.assert_close(mis.weights, torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    assert correction_stats(mis, x, ratio_kind="geometric")["rejected_frac"] == pytest.approx(4 / 6)


def test_group_sum_and_sequence_groups():
    vals = torch.tensor([[1.0, 2.0, 4.0, 8.0], [16.0, 32.0, 64.0, 128.0]])
    assert group_sum(vals, torch.tensor([[0, 0, 1, 1], [2, 2, 2, 0]]), RESP).tolist() == \
        [[3.0, 3.0, 12.0, 12.0], [112.0, 112.0, 112.0, 0.0]]
    assert sequence_groups(SEGMENTS, RESP, "response").tolist() == [[0, 0, 0, 0], [1, 1, 1, -1]]
    assert sequence_groups(SEGMENTS, RESP, "segment").tolist() == [[0, 0, 1, 1], [2, 2, 2, -1]]
    with pytest.raises(ValueError, match="scope"):
        sequence_groups(SEGMENTS, RESP, "document")
    with pytest.raises(ValueError, match="must be one of"):
        rollout_correction("gspo")
    with pytest.raises(ValueError, match="low < high"):
        CorrectionInputs(CUR, ENGINE, RESP, SEGMENTS, low=3.0, high=2.0)


def test_position_buckets_paper_and_tiny_scale():
    pos = torch.tensor([0, 16383, 16384, 65536, 131071])
    assert position_buckets(pos, 131072).tolist() == [0, 0, 1, 4, 7]
    assert bucket_width(131072) == 16384 and bucket_width(192) == 24 and bucket_width(5) == 1
    assert position_buckets(torch.tensor([0, 23, 24, 191]), 192).tolist() == [0, 0, 1, 7]


def test_mismatch_stats_by_hand():
    # measured deltas (trainer - engine): row 0 = [ln 4, 0 | -ln 1.5, 0] (segments 0 | 1), row 1 = [0.1] (its
    # other tokens are not measured); max_response_len 16 -> buckets of 2 positions
    ln2, a = math.log(2.0), math.log(1.5)
    delta = torch.tensor([[2 * ln2, 0.0, -a, 0.0], [0.1, 5.0, 5.0, 0.0]], dtype=torch.float64)
    engine = torch.full((2, 4), -1.0, dtype=torch.float64)
    measured = torch.tensor([[T, T, T, T], [T, F, F, F]])
    seg = torch.tensor([[0, 0, 1, 1], [0, 0, 0, -1]])
    pos = torch.tensor([[0, 1, 2, 3], [0, 1, 2, -1]])
    s = mismatch_stats(engine + delta, engine, measured, seg, pos, max_response_len=16)
    assert s["tokens"] == 5
    assert s["abs_mean"] == pytest.approx((2 * ln2 + a + 0.1) / 5)
    assert s["abs_max"] == pytest.approx(2 * ln2)
    assert s["delta_mean"] == pytest.approx((2 * ln2 - a + 0.1) / 5)
    # k3 = r - 1 - delta per token: (3 - 2 ln 2) + 0 + (2/3 - 1 + ln 1.5) + 0 + (e^0.1 - 1.1)
    assert s["k3_kl"] == pytest.approx((2 / 3 + 0.9 - 2 * ln2 + a + math.exp(0.1)) / 5)
    assert s["ratio_out_frac"] == pytest.approx(1 / 5)     # r = 4 only
    assert s["seq_logratio_mean"] == pytest.approx((2 * ln2 - a + 0.1) / 2)
    assert s["seq_logratio_min"] == pytest.approx(0.1)
    assert s["seg0/tokens"] == 3 and s["seg0/abs_mean"] == pytest.approx((2 * ln2 + 0.1) / 3)
    assert s["seg1/tokens"] == 2 and s["seg1/abs_max"] == pytest.approx(a)
    assert s["pos0/tokens"] == 3 and s["pos0/ratio_out_frac"] == pytest.approx(1 / 3)
    assert s["pos1/tokens"] == 2 and s["pos1/delta_mean"] == pytest.approx(-a / 2)
    assert not any(k.startswith("pos2") for k in s)
    assert mismatch_stats(engine, engine, torch.zeros(2, 4, dtype=torch.bool), seg, pos, 16) == {}


QUICK = "experiments/quickstart.yaml"


@pytest.mark.parametrize("overrides,names", [
    (["algo.rollout_correction.mode=token_tis", "algo.is_mode=sais", "algo.sais_logprobs=engine"],
     ("algo.rollout_correction.mode=token_tis", "algo.is_mode=sais", "algo.sais_logprobs=engine")),
    # auto resolves to the engine's log-probs under ZeRO-3 with vllm engines
    (["algo.rollout_correction.mode=icepop", "algo.is_mode=sais", "rollout.engine=vllm", "train.backend=deepspeed",
      "train.deepspeed.zero_stage=3"], ("algo.rollout_correction.mode=icepop", "algo.is_mode=sais",
                                         "algo.sais_logprobs=auto")),
    (["algo.rollout_correction.mode=seq_mis", "algo.entropy_control.mode=kl_cov"],
     ("algo.rollout_correction.mode=seq_mis", "algo.entropy_control.mode=kl_cov")),
])
def test_disallowed_pairs_are_refused_at_load_naming_both_keys(overrides, names):
    with pytest.raises(ConfigError) as err:
        load_experiment(QUICK, overrides)
    for name in names:
        assert name in str(err.value)


@pytest.mark.parametrize("is_mode,extra", [("pois", []), ("tois", ["rollout.segments=1"]),
                                           ("sais", ["algo.sais_logprobs=trainer"]), ("sais", [])])
def test_allowed_pairs_load(is_mode, extra):
    for mode in ROLLOUT_CORRECTIONS:
        cfg = load_experiment(QUICK, [f"algo.is_mode={is_mode}", f"algo.rollout_correction.mode={mode}", *extra])
        assert cfg.algo.rollout_correction.mode == mode


def test_bad_correction_values_name_the_key():
    for override, key in (("algo.rollout_correction.mode=tis", "algo.rollout_correction.mode"),
                          ("algo.rollout_correction.threshold=0.5", "algo.rollout_correction.threshold"),
                          ("algo.rollout_correction.seq_scope=document", "algo.rollout_correction.seq_scope")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_experiment(QUICK, [override])


def test_config_and_worker_agree_on_the_sais_source():
    from ulorl.config import sais_logprobs_source
    from ulorl.train.worker import sais_from_engine

    for choice in ("auto", "trainer", "engine"):
        for engine in ("hf", "vllm"):
            for backend, stage in (("torch", 2), ("deepspeed", 2), ("deepspeed", 3)):
                cfg = load_experiment(QUICK, [f"algo.sais_logprobs={choice}", f"rollout.engine={engine}",
                                              f"train.backend={backend}", f"train.deepspeed.zero_stage={stage}"])
                want = sais_from_engine(cfg)
                assert (sais_logprobs_source(cfg) == "engine") == want, (choice, engine, backend, stage)
