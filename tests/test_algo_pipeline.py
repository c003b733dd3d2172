"""The algo functions chained as the trainer uses them, on a tiny linear "model"."""

import pytest
import torch

from ulorl.algo import (
    MaskInputs,
    dynamic_sampling_filter,
    group_advantages,
    logprobs_and_entropy,
    mask_mode,
    policy_loss,
    select_old_logprobs,
)


@pytest.mark.parametrize("mode", ["off", "static", "dynamic"])
def test_one_update_pipeline(mode):
    torch.manual_seed(0)
    vocab, hidden, t = 16, 8, 6
    head = torch.nn.Linear(hidden, vocab)
    # 3 groups x 2 responses; group 1 is all-correct -> dropped by dynamic sampling
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    group_ids = torch.tensor([0, 0, 1, 1, 2, 2])
    keep = dynamic_sampling_filter(rewards, group_ids)
    assert keep.tolist() == [True, True, False, False, True, True]
    adv = group_advantages(rewards[keep], group_ids[keep])
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5, rtol=0)

    b = int(keep.sum())
    hs = torch.randn(b, t, hidden)
    labels = torch.randint(0, vocab, (b, t))
    response_mask = torch.ones(b, t, dtype=torch.bool)
    response_mask[:, :2] = False  # prompt
    response_mask[1, 5] = False  # padding

    with torch.no_grad():
        cur, _ = logprobs_and_entropy(head(hs), labels, temperature=0.85)
    old = select_old_logprobs("pois", cur)
    logprobs, entropy = logprobs_and_entropy(head(hs), labels, temperature=0.85)
    # sigma above any possible entropy (log 16 = 2.77) so the dynamic gate is open; tau tiny so
    # every positive response token is an MPT: masking is visible in the metrics
    inputs = MaskInputs(logprobs, rewards[keep], response_mask, entropy, tau=1e-9, sigma=10.0, scope="sample")
    mask = mask_mode(mode).mask(inputs)
    loss, metrics = policy_loss(logprobs, old, adv, response_mask, mask)
    loss.backward()

    assert metrics["ratio_mean"].item() == pytest.approx(1.0, abs=1e-6)  # POIS, first update
    n_resp = int(response_mask.sum())
    n_pos_resp = int(response_mask[rewards[keep] == 1].sum())
    expected_masked = {"off": 0, "static": n_pos_resp, "dynamic": n_pos_resp}[mode]
    assert metrics["masked_frac"].item() == pytest.approx(expected_masked / n_resp)
    active = mask_mode(mode).active(inputs)
    assert active.float().mean().item() == (0.0 if mode == "off" else 1.0)
    # ratio 1: loss = -sum over unmasked response tokens of A / all response tokens
    per_tok_adv = adv[:, None].expand(b, t)
    expected = -(per_tok_adv * (response_mask & ~mask)).sum() / n_resp
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert torch.isfinite(head.weight.grad).all()
    if mode != "off":
        # every response token of a positive sample is masked; negative samples are never masked
        assert mask[rewards[keep] == 1][response_mask[rewards[keep] == 1]].all()
        assert not mask[rewards[keep] == 0].any()
