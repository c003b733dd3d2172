"""policy_loss: values, gradients (clip, masks, padding), micro-batch additivity, metrics."""

import math

import pytest
import torch

from ulorl.algo import LOSS_AGG, policy_loss

T, F = True, False
RESP = torch.tensor([[F, T, T, T], [T, T, F, F]])  # 5 response tokens
LOSS_MASK = torch.tensor([[F, T, F, F], [F, F, F, F]])  # token (0, 1) excluded (e.g. an MPT)
ADV = torch.tensor([1.5, -0.5])


def _lp(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def test_ratio_one_loss_and_gradient_by_hand():
    # ratio 1 everywhere -> per-token term = -A. Unmasked response tokens: (0,2),(0,3) with A=1.5,
    # (1,0),(1,1) with A=-0.5. loss = -(1.5 + 1.5 - 0.5 - 0.5) / 5 = -0.4 (denominator counts
    # the masked token too, Eq. 10). d loss / d logprob = -A * r / 5: -0.3 at sample 0, +0.1 at
    # sample 1; exactly 0 at the masked token, the prompt token and the padding.
    lp = _lp([[-1.0, -0.5, -0.2, -0.1], [-0.3, -0.4, -2.0, -3.0]])
    loss, m = policy_loss(lp, lp.detach().clone(), ADV, RESP, LOSS_MASK)
    assert loss.item() == pytest.approx(-0.4, abs=1e-12)
    loss.backward()
    expected = torch.tensor([[0.0, 0.0, -0.3, -0.3], [0.1, 0.1, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(lp.grad, expected, rtol=0, atol=1e-12)
    assert lp.grad[0, 1].item() == 0.0 and lp.grad[0, 0].item() == 0.0 and lp.grad[1, 2:].eq(0).all()
    assert m["ratio_mean"].item() == 1.0 and m["ratio_max"].item() == 1.0 and m["ratio_min"].item() == 1.0
    assert m["clip_frac"].item() == 0.0
    assert m["masked_frac"].item() == pytest.approx(1 / 5)
    assert m["num_tokens"].item() == 5 and m["denominator"].item() == 5
    assert m["pg_loss"].item() == pytest.approx(-0.4) and not m["pg_loss"].requires_grad


def test_advantages_per_token_equal_broadcast():
    lp = _lp([[-1.0, -0.5, -0.2, -0.1], [-0.3, -0.4, -2.0, -3.0]])
    old = lp.detach() + 0.05
    a, _ = policy_loss(lp, old, ADV, RESP, LOSS_MASK)
    b, _ = policy_loss(lp, old, ADV[:, None].expand(2, 4).clone(), RESP, LOSS_MASK)
    assert a.item() == b.item()


def _one_token(log_ratio, adv, eps_low=0.2, eps_high=0.2):
    lp = _lp([[log_ratio]])
    loss, m = policy_loss(
        lp,
        torch.zeros(1, 1, dtype=torch.float64),
        torch.tensor([adv]),
        torch.tensor([[T]]),
        eps_low=eps_low,
        eps_high=eps_high,
    )
    loss.backward()
    return loss.item(), lp.grad.item(), m


def test_positive_advantage_above_clip_high_has_zero_gradient():
    # r = 1.5 > 1.2, A = 1: loss = -min(1.5, 1.2) = -1.2, constant in r -> gradient 0
    loss, grad, m = _one_token(math.log(1.5), 1.0)
    assert loss == pytest.approx(-1.2) and grad == 0.0 and m["clip_frac"].item() == 1.0
    # r = 1.1 inside the range: loss = -1.1, d/dlogp (-r A) = -r A = -1.1
    loss, grad, m = _one_token(math.log(1.1), 1.0)
    assert loss == pytest.approx(-1.1) and grad == pytest.approx(-1.1) and m["clip_frac"].item() == 0.0
    # clip-higher eps_high 0.28: r = 1.25 is no longer clipped (grad -1.25); with 0.2 it is (grad 0)
    assert _one_token(math.log(1.25), 1.0, eps_high=0.28)[1] == pytest.approx(-1.25)
    assert _one_token(math.log(1.25), 1.0, eps_high=0.2)[1] == 0.0


def test_negative_advantage_below_clip_low_has_zero_gradient():
    # r = 0.5 < 0.8, A = -1: loss = -min(-0.5, -0.8) = 0.8, constant -> gradient 0
    loss, grad, m = _one_token(math.log(0.5), -1.0)
    assert loss == pytest.approx(0.8) and grad == 0.0 and m["clip_frac"].item() == 1.0
    # the pessimistic side is never clipped: A = -1, r = 1.5 -> loss 1.5, grad -r A = +1.5
    loss, grad, m = _one_token(math.log(1.5), -1.0)
    assert loss == pytest.approx(1.5) and grad == pytest.approx(1.5) and m["clip_frac"].item() == 0.0
    # A = +1, r = 0.5 -> loss -0.5, grad -0.5 (not clipped)
    loss, grad, _ = _one_token(math.log(0.5), 1.0)
    assert loss == pytest.approx(-0.5) and grad == pytest.approx(-0.5)


def test_clip_metrics_over_a_batch():
    # tokens (r, A): (1.5, +1) clipped, (0.5, -1) clipped, (0.5, +1) not, (1.5, -1) not -> clip_frac 0.5
    lp = _lp([[math.log(1.5), math.log(0.5)], [math.log(0.5), math.log(1.5)]])
    adv = torch.tensor([[1.0, -1.0], [1.0, -1.0]])
    loss, m = policy_loss(lp, torch.zeros(2, 2, dtype=torch.float64), adv, torch.ones(2, 2, dtype=torch.bool))
    # per-token terms: -1.2, 0.8, -0.5, 1.5 -> sum 0.6 / 4 = 0.15
    assert loss.item() == pytest.approx(0.15)
    assert m["clip_frac"].item() == 0.5
    assert m["ratio_mean"].item() == pytest.approx(1.0)
    assert m["ratio_max"].item() == pytest.approx(1.5) and m["ratio_min"].item() == pytest.approx(0.5)


def test_masked_and_padding_tokens_zero_gradient_even_with_garbage_values():
    # padding holds -inf log-probs and the masked token an overflowing ratio (exp(1000) = inf):
    # loss and gradient stay finite, and both positions get exactly 0 gradient
    lp = _lp([[-0.1, 1000.0, -0.2, -math.inf]])
    old = torch.tensor([[-0.1, 0.0, -0.2, -math.inf]], dtype=torch.float64)
    resp = torch.tensor([[T, T, T, F]])
    mask = torch.tensor([[F, T, F, F]])
    loss, _ = policy_loss(lp, old, torch.tensor([-1.0]), resp, mask)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    assert lp.grad[0, 1].item() == 0.0 and lp.grad[0, 3].item() == 0.0
    assert loss.item() == pytest.approx(2 / 3)  # two kept tokens, ratio 1, A = -1 -> 2 / 3 response tokens


def test_masking_keeps_denominator():
    lp = _lp([[-0.1, -0.2, -0.3, -0.4]])
    resp = torch.ones(1, 4, dtype=torch.bool)
    none, _ = policy_loss(lp, lp.detach(), torch.tensor([1.0]), resp)
    half, _ = policy_loss(lp, lp.detach(), torch.tensor([1.0]), resp, torch.tensor([[T, T, F, F]]))
    assert none.item() == pytest.approx(-1.0) and half.item() == pytest.approx(-0.5)  # -2/4, not -2/2


def test_micro_batches_with_global_num_tokens_sum_to_whole():
    g = torch.Generator().manual_seed(0)
    b, t = 6, 8
    base = -torch.rand(b, t, generator=g, dtype=torch.float64)
    old = base + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64)
    resp = torch.rand(b, t, generator=g) < 0.7
    resp[:, 0] = True
    mask = (torch.rand(b, t, generator=g) < 0.2) & resp
    adv = torch.randn(b, generator=g, dtype=torch.float64)

    whole_lp = base.clone().requires_grad_(True)
    whole, _ = policy_loss(whole_lp, old, adv, resp, mask, 0.2, 0.28)
    whole.backward()

    parts_lp = base.clone().requires_grad_(True)
    n = int(resp.sum())
    total = 0.0
    for s, e in ((0, 2), (2, 3), (3, 6)):
        part, m = policy_loss(parts_lp[s:e], old[s:e], adv[s:e], resp[s:e], mask[s:e], 0.2, 0.28, num_tokens=n)
        part.backward()
        total += part.item()
        assert m["denominator"].item() == n and m["num_tokens"].item() == int(resp[s:e].sum())
    assert total == pytest.approx(whole.item(), abs=1e-12)
    torch.testing.assert_close(parts_lp.grad, whole_lp.grad, rtol=0, atol=1e-12)

    # seq_mean with a global num_seqs is additive too
    w2 = base.clone().requires_grad_(True)
    whole_s, _ = policy_loss(w2, old, adv, resp, mask, loss_agg="seq_mean")
    p2 = base.clone().requires_grad_(True)
    tot = sum(
        policy_loss(p2[s:e], old[s:e], adv[s:e], resp[s:e], mask[s:e], loss_agg="seq_mean", num_seqs=b)[0]
        for s, e in ((0, 4), (4, 6))
    )
    assert tot.item() == pytest.approx(whole_s.item(), abs=1e-12)


def test_seq_mean_by_hand():
    # ratio 1: sample 0 kept sum -(1.5+1.5) = -3 over 3 response tokens -> -1;
    # sample 1: -(-0.5-0.5) = 1 over 2 -> 0.5; mean over 2 sequences = -0.25
    lp = _lp([[-1.0, -0.5, -0.2, -0.1], [-0.3, -0.4, -2.0, -3.0]])
    loss, m = policy_loss(lp, lp.detach(), ADV, RESP, LOSS_MASK, loss_agg="seq_mean")
    assert loss.item() == pytest.approx(-0.25) and m["denominator"].item() == 2
    assert set(LOSS_AGG) == {"token_mean", "seq_mean"}


def test_advantages_are_data_and_old_logprobs_detached():
    lp = _lp([[-0.5, -0.6]])
    old = lp.detach().clone().requires_grad_(True)
    adv = torch.tensor([2.0], requires_grad=True)
    loss, _ = policy_loss(lp, old, adv, torch.ones(1, 2, dtype=torch.bool))
    loss.backward()
    assert old.grad is None and adv.grad is None
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.0, -1.0]], dtype=torch.float64))  # -A r / 2


def test_no_response_tokens_gives_zero_loss_and_nan_ratio_stats():
    lp = _lp([[-0.5, -0.6]])
    loss, m = policy_loss(lp, lp.detach(), torch.tensor([1.0]), torch.zeros(1, 2, dtype=torch.bool))
    loss.backward()
    assert loss.item() == 0.0 and lp.grad.eq(0).all()
    assert math.isnan(m["ratio_mean"].item()) and m["clip_frac"].item() == 0.0


def test_policy_loss_input_errors():
    lp = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(lp, lp, torch.zeros(3), RESP)
    with pytest.raises(ValueError, match="old_logprobs"):
        policy_loss(lp, lp[:, :3], ADV, RESP)
    with pytest.raises(ValueError, match="loss_mask"):
        policy_loss(lp, lp, ADV, RESP, LOSS_MASK.float())
    with pytest.raises(ValueError, match="num_tokens"):
        policy_loss(lp, lp, ADV, RESP, num_tokens=0)
    with pytest.raises(ValueError, match="loss_agg"):
        policy_loss(lp, lp, ADV, RESP, loss_agg="sum")
    with pytest.raises(ValueError, match="eps_low"):
        policy_loss(lp, lp, ADV, RESP, eps_low=1.0)
