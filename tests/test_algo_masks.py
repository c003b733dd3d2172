"""MPT / DMMPT masks, the MASK_MODES registry behind its one lookup (mask_mode, one MaskInputs object) and the
mask-active samples."""

import math

import pytest
import torch

from ulorl.algo import (
    MASK_MODES,
    MaskInputs,
    dmmpt_mask,
    mask_mode,
    mean_response_entropy,
    mpt_mask,
)

T, F = True, False
# 3 samples x 4 tokens. Sample 0: token 0 is prompt; sample 2: last two tokens are padding.
RESP = torch.tensor([[F, T, T, T], [F, F, T, T], [T, T, F, F]])
REWARDS = torch.tensor([1.0, 0.0, 1.0])
# token probabilities (log-probs are their logs); values far from tau=0.99 on purpose
PROBS = torch.tensor(
    [
        [0.999, 0.995, 0.5, 0.999],  # reward 1: response tokens 1..3 -> MPT at 1 and 3 (token 0 is prompt)
        [0.999, 0.999, 0.999, 0.999],  # reward 0: never MPT
        [0.999, 0.2, 0.999, 0.999],  # reward 1: MPT at 0 only (2, 3 are padding)
    ]
)
LOGP = PROBS.log()
MPT = torch.tensor([[F, T, F, T], [F, F, F, F], [T, F, F, F]])
# per-token entropies, exact binary fractions; prompt/padding positions hold 9.0 and must be ignored
ENT = torch.tensor(
    [
        [9.0, 0.125, 0.125, 0.125],  # sample mean 0.125
        [9.0, 9.0, 0.25, 0.25],  # sample mean 0.25
        [0.5, 0.5, 9.0, 9.0],  # sample mean 0.5
    ]
)
# batch mean over the 7 response tokens = (3*0.125 + 2*0.25 + 2*0.5) / 7 = 1.875/7 = 0.267857...
BATCH_MEAN = 1.875 / 7


def test_mpt_mask_hand_case():
    m = mpt_mask(LOGP, REWARDS, RESP, tau=0.99)
    assert m.dtype == torch.bool and torch.equal(m, MPT)
    assert torch.equal(mask_mode("static").mask(MaskInputs(LOGP, REWARDS, RESP, tau=0.99)), MPT)


def test_mpt_only_in_reward_one_samples_and_response_tokens():
    # every token certain (log-prob 0): MPT == response tokens of reward-1 samples, nothing else
    m = mpt_mask(torch.zeros(3, 4), REWARDS, RESP, tau=0.99)
    assert torch.equal(m, RESP & (REWARDS == 1)[:, None])
    assert not m[1].any()  # reward 0
    assert not m[~RESP].any()  # prompt / padding
    # rewards that are not exactly 1 are not positive
    assert not mpt_mask(torch.zeros(3, 4), torch.tensor([0.5, 0.0, 2.0]), RESP, 0.99).any()


def test_mpt_threshold_is_inclusive_and_mask_has_no_grad():
    lp = torch.zeros(1, 2, requires_grad=True)  # exp(0) = 1 >= tau = 1.0
    m = mpt_mask(lp, torch.tensor([1.0]), torch.tensor([[T, T]]), tau=1.0)
    assert m.tolist() == [[T, T]] and not m.requires_grad
    lp2 = torch.tensor([[math.log(0.98)]])
    assert not mpt_mask(lp2, torch.tensor([1.0]), torch.tensor([[T]]), tau=0.99).any()


def test_mean_response_entropy_scopes():
    torch.testing.assert_close(mean_response_entropy(ENT, RESP, "sample"), torch.tensor([0.125, 0.25, 0.5]))
    torch.testing.assert_close(mean_response_entropy(ENT, RESP, "batch"), torch.full((3,), BATCH_MEAN))
    torch.testing.assert_close(mean_response_entropy(ENT, RESP, "batch", batch_entropy=0.1), torch.full((3,), 0.1))
    with pytest.raises(ValueError, match="scope"):
        mean_response_entropy(ENT, RESP, "token")


@pytest.mark.parametrize("scope", ["sample", "batch"])
def test_dmmpt_empty_at_or_above_sigma_and_equal_to_mpt_below(scope):
    high = torch.full((3, 4), 0.25)
    assert not dmmpt_mask(LOGP, REWARDS, RESP, high, 0.99, sigma=0.25, scope=scope).any()  # H == sigma: off
    assert not dmmpt_mask(LOGP, REWARDS, RESP, high, 0.99, sigma=0.2, scope=scope).any()  # H > sigma
    low = torch.full((3, 4), 0.125)
    assert torch.equal(dmmpt_mask(LOGP, REWARDS, RESP, low, 0.99, sigma=0.2, scope=scope), MPT)


def test_dmmpt_sample_scope_gates_each_sample():
    # sigma 0.2: sample 0 (H 0.125) gated on, sample 2 (H 0.5) off -> only row 0 of MPT
    m = dmmpt_mask(LOGP, REWARDS, RESP, ENT, tau=0.99, sigma=0.2, scope="sample")
    assert torch.equal(m, torch.tensor([[F, T, F, T], [F, F, F, F], [F, F, F, F]]))
    # sigma 0.125: sample 0's mean equals sigma -> strict "<" -> empty
    assert not dmmpt_mask(LOGP, REWARDS, RESP, ENT, 0.99, 0.125, "sample").any()
    # sigma 0.6: all samples below -> all MPTs
    assert torch.equal(dmmpt_mask(LOGP, REWARDS, RESP, ENT, 0.99, 0.6, "sample"), MPT)


def test_dmmpt_batch_scope_uses_one_mean():
    # batch mean 0.2679: below 0.3 -> the full MPT mask, above 0.25 -> empty
    assert torch.equal(dmmpt_mask(LOGP, REWARDS, RESP, ENT, 0.99, 0.3, "batch"), MPT)
    assert not dmmpt_mask(LOGP, REWARDS, RESP, ENT, 0.99, 0.25, "batch").any()
    # a global mean passed in (micro-batches) overrides the local one
    assert torch.equal(dmmpt_mask(LOGP, REWARDS, RESP, ENT, 0.99, 0.25, "batch", batch_entropy=0.1), MPT)


def test_mask_registry_takes_one_input_object():
    x = MaskInputs(LOGP, REWARDS, RESP, ENT, tau=0.99, sigma=0.2, scope="sample")
    assert set(MASK_MODES) == {"off", "static", "dynamic"}
    assert not MASK_MODES["off"].mask(x).any()
    assert torch.equal(MASK_MODES["static"].mask(MaskInputs(LOGP, REWARDS, RESP, None, tau=0.99)), MPT)
    assert torch.equal(MASK_MODES["dynamic"].mask(x), dmmpt_mask(LOGP, REWARDS, RESP, ENT, 0.99, 0.2))
    assert all(mask_mode(name) is MASK_MODES[name] for name in MASK_MODES)   # one lookup, the registry's entries
    with pytest.raises(ValueError, match="token_entropy"):
        mask_mode("dynamic").mask(MaskInputs(LOGP, REWARDS, RESP, None))
    with pytest.raises(ValueError, match=r"mpt mode must be one of \('off', 'static', 'dynamic'\), got 'sometimes'"):
        mask_mode("sometimes")


def test_mpt_mask_is_computed_once_per_input_object(monkeypatch):
    import ulorl.algo.masks as masks

    calls = []
    real = masks.mpt_mask
    monkeypatch.setattr(masks, "mpt_mask", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = MaskInputs(LOGP, REWARDS, RESP, ENT, tau=0.99, sigma=0.3, scope="sample")
    static, dynamic = MASK_MODES["static"].mask(x), MASK_MODES["dynamic"].mask(x)
    assert static is x.mpt and torch.equal(static, MPT)
    # sigma 0.3: samples 0 (H 0.125) and 1 (H 0.25) gated open, sample 2 (H 0.5) closed -> sample 0's MPTs
    assert torch.equal(dynamic, torch.tensor([[F, T, F, T], [F, F, F, F], [F, F, F, F]]))
    assert len(calls) == 1


def test_mask_active_samples():
    def x(ent, sigma, scope="sample"):
        return MaskInputs(LOGP, REWARDS, RESP, ent, sigma=sigma, scope=scope)

    assert mask_mode("off").active(x(ENT, 0.2)).tolist() == [F, F, F]
    assert mask_mode("static").active(x(None, 0.2)).tolist() == [T, T, T]
    # sample means 0.125, 0.25, 0.5 vs sigma 0.3
    assert mask_mode("dynamic").active(x(ENT, 0.3)).tolist() == [T, T, F]
    assert mask_mode("dynamic").active(x(ENT, 0.3, "batch")).tolist() == [T, T, T]


def test_mask_shape_errors():
    with pytest.raises(ValueError, match="rewards"):
        mpt_mask(LOGP, torch.ones(2), RESP, 0.99)
    with pytest.raises(ValueError, match="token_logprobs"):
        mpt_mask(LOGP[:, :3], REWARDS, RESP, 0.99)
    with pytest.raises(TypeError, match="bool"):
        mpt_mask(LOGP, REWARDS, RESP.long(), 0.99)
    with pytest.raises(ValueError, match="token_entropy"):
        dmmpt_mask(LOGP, REWARDS, RESP, ENT[:, :2], 0.99, 0.2)
    with pytest.raises(ValueError, match="token_entropy"):
        MaskInputs(LOGP, REWARDS, RESP, ENT[:, :2])
    with pytest.raises(ValueError, match="scope"):
        MaskInputs(LOGP, REWARDS, RESP, ENT, scope="token")
