"""Entropy-control comparators (ulorl.algo.entropy_control): hand-derived values on tiny tensors, and
identity with the reference implementations (verl's Clip-Cov / KL-Cov losses, TRL's high-entropy mask)
transcribed below on random tensors.

The tiny batch used by the hand-derived tests (B = 2, T = 3, the last token of row 0 is padding):

    response   [[T, T, F], [T, T, T]]        n = 5 response tokens
    A          [1, -1]                        token-weighted mean = (1 + 1 - 1 - 1 - 1) / 5 = -0.2
    logp       [[-0.1, -2.0, 0], [-0.5, -0.1, -3.0]]   mean = -5.7 / 5 = -1.14
    cov = (A + 0.2)(logp + 1.14):
               [[1.2 * 1.04, 1.2 * -0.86, -inf], [-0.8 * 0.64, -0.8 * 1.04, -0.8 * -1.86]]
             = [[1.248, -1.032, -inf], [-0.512, -0.832, 1.488]]
"""

from __future__ import annotations

import math

import pytest
import torch

from ulorl.algo import loss as loss_mod
from ulorl.algo.entropy_control import (
    ENTROPY_CONTROLS,
    ControlInputs,
    clip_active,
    clip_cov_candidates,
    clip_cov_select,
    entropy_control,
    high_entropy_minority_mask,
    kl_cov_loss,
    kl_cov_select,
    linear_quantile,
    token_covariance,
)
from ulorl.algo.loss import policy_loss

RESP = torch.tensor([[True, True, False], [True, True, True]])
ADV = torch.tensor([1.0, -1.0])
LP = torch.tensor([[-0.1, -2.0, 0.0], [-0.5, -0.1, -3.0]])


def _cells(mask: torch.Tensor) -> set[tuple[int, int]]:
    return {tuple(x) for x in mask.nonzero().tolist()}


# ----------------------------------------------------------------------------- hand-derived


def test_token_covariance_by_hand():
    cov = token_covariance(LP, ADV, RESP)
    expected = torch.tensor([[1.248, -1.032, -math.inf], [-0.512, -0.832, 1.488]], dtype=torch.float64)
    assert torch.allclose(cov, expected, atol=1e-12)
    assert cov[0, 2] == -math.inf


def test_clip_cov_candidates_respect_bounds_and_the_active_clip():
    # on-policy (old = logp): candidates are the two tokens with cov in (1, 5)
    assert _cells(clip_cov_candidates(LP, LP, ADV, RESP, 1.0, 5.0, 0.2, 0.2)) == {(0, 0), (1, 2)}
    # ub 1.4 drops (1, 2) (cov 1.488); lb 1.3 drops (0, 0) (cov 1.248)
    assert _cells(clip_cov_candidates(LP, LP, ADV, RESP, 1.0, 1.4, 0.2, 0.2)) == {(0, 0)}
    assert _cells(clip_cov_candidates(LP, LP, ADV, RESP, 1.3, 5.0, 0.2, 0.2)) == {(1, 2)}
    # (0, 0): A = 1 > 0 and r = exp(-0.1 + 0.4) = 1.35 > 1.2: PPO already clips it, Clip-Cov skips it
    old = LP.clone()
    old[0, 0] = -0.4
    assert _cells(clip_active(LP, old, ADV, RESP, 0.2, 0.2)) == {(0, 0)}
    assert _cells(clip_cov_candidates(LP, old, ADV, RESP, 1.0, 5.0, 0.2, 0.2)) == {(1, 2)}


def test_clip_cov_picks_max_int_ratio_n_1_of_the_candidates_at_random():
    cand = clip_cov_candidates(LP, LP, ADV, RESP, 1.0, 5.0, 0.2, 0.2)
    # ratio 0.4: int(0.4 * 5) = 2 = every candidate
    assert _cells(clip_cov_select(cand, RESP, 0.4)) == {(0, 0), (1, 2)}
    # ratio 0.2 (int(1.0) = 1) and verl's 2e-4 (int(0.001) = 0 -> at least 1): one of the two, by seed
    picks = {frozenset(_cells(clip_cov_select(cand, RESP, ratio, seed))) for ratio in (0.2, 2e-4) for seed in range(20)}
    assert picks == {frozenset({(0, 0)}), frozenset({(1, 2)})}
    assert torch.equal(clip_cov_select(cand, RESP, 0.2, 7), clip_cov_select(cand, RESP, 0.2, 7))
    assert not clip_cov_select(torch.zeros_like(RESP), RESP, 0.5).any()
    with pytest.raises(ValueError, match="ratio must be > 0"):
        clip_cov_select(cand, RESP, 0.0)


def test_kl_cov_picks_the_largest_covariances():
    assert _cells(kl_cov_select(LP, ADV, RESP, 0.2)) == {(1, 2)}              # k = max(1, int(1.0)) = 1
    assert _cells(kl_cov_select(LP, ADV, RESP, 2e-4)) == {(1, 2)}             # k = max(1, 0) = 1
    assert _cells(kl_cov_select(LP, ADV, RESP, 0.4)) == {(1, 2), (0, 0)}      # k = 2
    assert _cells(kl_cov_select(LP, ADV, RESP, 1.0)) == _cells(RESP)           # k = n: every response token
    assert not kl_cov_select(LP, ADV, torch.zeros_like(RESP), 0.5).any()


def test_kl_cov_loss_by_hand_unclipped_with_the_penalty_on_selected_tokens():
    # r(0, 0) = exp(0.3) = 1.34986 with A = 1: the PPO clip would cap it at 1.2, KL-Cov does not;
    # r(1, 2) = exp(0.2) = 1.22140 with A = -1, penalised: coef * |log r| = 0.5 * 0.2
    old = LP.clone()
    old[0, 0], old[1, 2] = -0.4, -3.2
    lp = LP.clone().requires_grad_(True)
    sel = torch.zeros_like(RESP)
    sel[1, 2] = True
    loss, m = kl_cov_loss(lp, old, ADV, RESP, sel, 0.5)
    r00, r12 = math.exp(0.3), math.exp(0.2)
    expected = (-r00 - 1.0 + 1.0 + 1.0 + (r12 + 0.5 * 0.2)) / 5
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-6)
    loss.backward()
    assert lp.grad is not None
    g = lp.grad
    assert float(g[0, 0]) == pytest.approx(-r00 / 5, rel=1e-6)       # not zero: no clip
    assert float(g[1, 2]) == pytest.approx((r12 + 0.5) / 5, rel=1e-6)  # -A r + coef * sign(log r)
    assert float(g[0, 1]) == pytest.approx(-1 / 5) and float(g[1, 0]) == pytest.approx(1 / 5)
    assert float(g[0, 2]) == 0.0
    assert float(m["clip_frac"]) == 0.0 and float(m["kl_penalty"]) == pytest.approx(0.2, rel=1e-6)
    assert float(m["pg_loss"]) == pytest.approx(expected, rel=1e-6)
    # the clipped surrogate on the same tokens differs exactly at (0, 0): -1.2 instead of -1.34986
    ppo, _ = policy_loss(LP.clone(), old, ADV, RESP)
    assert float(ppo) == pytest.approx((-1.2 - 1.0 + 1.0 + 1.0 + r12) / 5, rel=1e-6)


def test_kl_cov_loss_on_policy_has_no_penalty_and_no_penalty_gradient():
    noisy_old = LP + 1e-6 * torch.tensor([[1.0, -1.0, 0.0], [1.0, -1.0, 1.0]])  # two passes differ by float noise
    lp = LP.clone().requires_grad_(True)
    loss, m = kl_cov_loss(lp, noisy_old, ADV, RESP, RESP.clone(), 1.0, on_policy=True)
    assert float(loss.detach()) == pytest.approx((-1 - 1 + 1 + 1 + 1) / 5)
    loss.backward()
    assert lp.grad is not None
    assert torch.allclose(lp.grad, torch.tensor([[-0.2, -0.2, 0.0], [0.2, 0.2, 0.2]]))
    assert float(m["kl_penalty"]) == 0.0
    # without the shortcut the same noise gives every selected token a +-coef gradient
    lp2 = LP.clone().requires_grad_(True)
    kl_cov_loss(lp2, noisy_old, ADV, RESP, RESP.clone(), 1.0)[0].backward()
    assert lp2.grad is not None
    assert float(lp2.grad[0, 0]) == pytest.approx((-1 - 1) / 5, rel=1e-4)


def test_kl_cov_loss_keeps_masked_tokens_in_the_denominator():
    mask = torch.zeros_like(RESP)
    mask[1, 2] = True
    loss, m = kl_cov_loss(LP.clone(), LP, ADV, RESP, torch.zeros_like(RESP), 0.1, loss_mask=mask)
    assert float(loss.detach()) == pytest.approx((-1 - 1 + 1 + 1) / 5)
    assert float(m["masked_frac"]) == pytest.approx(1 / 5)


def test_linear_quantile_matches_torch_quantile():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(37, generator=g)
    for q in (0.0, 0.1, 0.5, 0.8, 0.95, 1.0):
        assert float(linear_quantile(x, q)) == pytest.approx(float(torch.quantile(x.double(), q)), abs=1e-12)
    assert float(linear_quantile(torch.tensor([0.1, 0.5, 0.3, 0.9, 0.2]), 0.8)) == pytest.approx(0.58)
    with pytest.raises(ValueError):
        linear_quantile(torch.tensor([]), 0.5)


def test_high_entropy_minority_by_hand():
    # response entropies 0.1, 0.5 | 0.3, 0.9, 0.2 (the padding's 9.0 never counts); sorted 0.1 0.2 0.3 0.5 0.9
    ent = torch.tensor([[0.1, 0.5, 9.0], [0.3, 0.9, 0.2]])
    # rho 0.2: q = 0.8, position 3.2 -> 0.5 + 0.2 * (0.9 - 0.5) = 0.58: only 0.9 is trained
    assert _cells(high_entropy_minority_mask(ent, RESP, 0.2)) == {(0, 0), (0, 1), (1, 0), (1, 2)}
    # rho 0.4: q = 0.6, position 2.4 -> 0.3 + 0.4 * 0.2 = 0.38: 0.5 and 0.9 are trained
    assert _cells(high_entropy_minority_mask(ent, RESP, 0.4)) == {(0, 0), (1, 0), (1, 2)}
    assert not high_entropy_minority_mask(ent, RESP, 1.0).any()                 # threshold = the minimum
    assert _cells(high_entropy_minority_mask(ent, RESP, 0.0)) == {(0, 0), (0, 1), (1, 0), (1, 2)}
    assert not high_entropy_minority_mask(ent, torch.zeros_like(RESP), 0.2).any()


def test_registry_actions_and_errors():
    assert set(ENTROPY_CONTROLS) == {"off", "clip_cov", "kl_cov", "high_entropy_minority"}
    assert {k: v.action for k, v in ENTROPY_CONTROLS.items()} == {
        "off": "none", "clip_cov": "mask", "kl_cov": "kl", "high_entropy_minority": "mask"}
    x = ControlInputs(LP, LP, ADV, RESP, torch.tensor([[0.1, 0.5, 9.0], [0.3, 0.9, 0.2]]), clip_cov_ratio=0.4,
                      kl_cov_ratio=0.2, top_entropy_quantile=0.2)
    assert not entropy_control("off").select(x).any()
    assert _cells(entropy_control("clip_cov").select(x)) == {(0, 0), (1, 2)}
    assert _cells(entropy_control("kl_cov").select(x)) == {(1, 2)}
    assert len(_cells(entropy_control("high_entropy_minority").select(x))) == 4
    with pytest.raises(ValueError, match="entropy_control mode must be one of"):
        entropy_control("kl")
    with pytest.raises(ValueError, match="token_entropy shape"):
        ControlInputs(LP, LP, ADV, RESP, torch.zeros(2, 2))


# ----------------------------------------------------------------------------- identity with the references
# Transcribed from verl (volcengine/verl, verl/trainer/ppo/core_algos.py at b178a3cd,
# compute_policy_loss_clip_cov / compute_policy_loss_kl_cov, loss_agg_mode "token-mean") and TRL
# (huggingface/trl, trl/trainer/grpo_trainer.py at f2cd5771, GRPOTrainer.get_high_entropy_mask, one process).


def _masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def verl_clip_cov(old_log_prob, log_prob, advantages, response_mask, clip_cov_ratio, lb, ub, clip_low, clip_high):
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses1 = -advantages * ratio
    corr = torch.ones_like(advantages)
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_by_origin = (pg_losses2 > pg_losses1) & (response_mask > 0)
    cov_all = (advantages - _masked_mean(advantages, response_mask)) * (
        log_prob - _masked_mean(log_prob.detach(), response_mask))
    cov_all[response_mask == 0] = -torch.inf
    cov_all[clip_by_origin] = -torch.inf
    clip_num = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
    top_k_idx = torch.nonzero((cov_all < ub) & (cov_all > lb) & (response_mask > 0))
    assert len(top_k_idx) <= clip_num, "the identity test keeps verl's random choice out: every candidate is taken"
    corr[top_k_idx[:, 0], top_k_idx[:, 1]] = 0
    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
    return _masked_mean(pg_losses, response_mask)


def verl_kl_cov(old_log_prob, log_prob, advantages, response_mask, kl_cov_ratio, ppo_kl_coef):
    negative_approx_kl = log_prob - old_log_prob
    abs_kl = negative_approx_kl.abs()
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses_kl = -advantages * ratio + ppo_kl_coef * abs_kl
    pg_losses = pg_losses1
    all_valid = response_mask > 0
    all_valid_idx = torch.nonzero(all_valid.reshape(-1), as_tuple=True)[0]
    all_valid_adv = advantages[all_valid].detach().reshape(-1).cpu()
    all_valid_logp = log_prob[all_valid].detach().reshape(-1).cpu()
    cov_lst_all = (all_valid_adv - all_valid_adv.mean()) * (all_valid_logp - all_valid_logp.mean())
    k_percent_nums = max(1, int(len(cov_lst_all) * kl_cov_ratio))
    large_cov_idxs = all_valid_idx[torch.topk(cov_lst_all, k_percent_nums, largest=True).indices]
    w = advantages.shape[1]
    pg_losses[large_cov_idxs // w, large_cov_idxs % w] = pg_losses_kl[large_cov_idxs // w, large_cov_idxs % w]
    return _masked_mean(pg_losses, response_mask)


def trl_high_entropy_mask(entropies, mask, threshold):
    local = entropies[mask.bool()].float()
    entropy_threshold = torch.quantile(local, threshold)
    masked_entropies = entropies * mask.float()
    return (masked_entropies >= entropy_threshold) & mask.bool()


def _random_batch(seed: int, b: int = 6, t: int = 40):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, t + 1, (b,), generator=g)
    resp = torch.arange(t).reshape(1, -1) < lengths.reshape(-1, 1)
    lp = -torch.rand(b, t, generator=g).pow(3) * 6           # mostly near 0, a tail of unlikely tokens
    old = lp + 0.3 * torch.randn(b, t, generator=g)           # off-policy: some ratios clipped
    adv = torch.randn(b, generator=g)
    ent = torch.rand(b, t, generator=g) * 2
    return resp, lp, old, adv, ent


@pytest.mark.parametrize("seed", range(5))
def test_clip_cov_equals_verl(seed):
    resp, lp, old, adv, _ = _random_batch(seed)
    lb, ub = 0.2, 3.0
    cand = clip_cov_candidates(lp, old, adv, resp, lb, ub, 0.2, 0.28)
    ratio = 1.0   # clip_num = n >= every candidate: verl's random choice takes them all
    sel = clip_cov_select(cand, resp, ratio)
    assert torch.equal(sel, cand) and sel.any()
    ours, _ = policy_loss(lp, old, adv, resp, loss_mask=sel, eps_low=0.2, eps_high=0.28)
    ref = verl_clip_cov(old, lp, adv.reshape(-1, 1).expand_as(lp), resp.float(), ratio, lb, ub, 0.2, 0.28)
    assert float(ours.detach()) == pytest.approx(float(ref.detach()), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("seed, ratio, coef", [(0, 2e-4, 0.1), (1, 0.1, 1.0), (2, 0.3, 0.5), (3, 0.02, 0.1)])
def test_kl_cov_equals_verl_in_value_and_gradient(seed, ratio, coef):
    resp, lp, old, adv, _ = _random_batch(seed)
    lp_ours = lp.clone().requires_grad_(True)
    lp_ref = lp.clone().requires_grad_(True)
    ours, _ = kl_cov_loss(lp_ours, old, adv, resp, kl_cov_select(lp, adv, resp, ratio), coef)
    ref = verl_kl_cov(old, lp_ref, adv.reshape(-1, 1).expand_as(lp).clone(), resp.float(), ratio, coef)
    assert float(ours.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    ours.backward()
    ref.backward()
    assert lp_ours.grad is not None and lp_ref.grad is not None
    assert torch.allclose(lp_ours.grad, lp_ref.grad * resp, atol=1e-7)


@pytest.mark.parametrize("seed, rho", [(0, 0.2), (1, 0.2), (2, 0.5), (3, 0.05), (4, 1.0)])
def test_high_entropy_minority_equals_trl(seed, rho):
    resp, _, _, _, ent = _random_batch(seed)
    trained = trl_high_entropy_mask(ent, resp, 1 - rho)
    assert torch.equal(high_entropy_minority_mask(ent, resp, rho), resp & ~trained)


def test_loss_aggregations_are_the_shared_ones():
    # KL-Cov aggregates through LOSS_AGG like policy_loss: seq_mean weighs each sequence equally
    loss, _ = kl_cov_loss(LP.clone(), LP, ADV, RESP, torch.zeros_like(RESP), 0.1, loss_agg="seq_mean")
    assert float(loss.detach()) == pytest.approx(((-1 - 1) / 2 + (1 + 1 + 1) / 3) / 2)
    assert "seq_mean" in loss_mod.LOSS_AGG


# ----------------------------------------------------------------------------- through the update


def _update_fixture():
    import transformers

    from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan

    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=16, intermediate_size=64,
                                   max_position_embeddings=128)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(4):   # two groups of two, rewards 1 / 0: every group trains
        resp = torch.randint(2, 64, (8,), generator=g).tolist()
        s = Sample(sample_id=i, group_id=i // 2, prompt_ids=[3 + i, 4, 5], response_ids=resp,
                   sampling_logprobs=[-0.1] * 8, status=SampleStatus.FINISHED, reward=float(i % 2 == 0))
        s.segments = [SegmentSpan(0, 8, 0)]
        out.append(s)
    return model, out


@pytest.mark.parametrize("mode, overrides, acted", [
    ("off", (), 0),
    ("kl_cov", ("algo.entropy_control.kl_cov_ratio=0.1",), 3),                  # max(1, int(0.1 * 32)) = 3
    ("high_entropy_minority", ("algo.entropy_control.top_entropy_quantile=0.25",), 24),  # all but the top 8 of 32
    ("clip_cov", ("algo.entropy_control.clip_cov_ratio=0.5", "algo.entropy_control.clip_cov_lb=-1000",
                  "algo.entropy_control.clip_cov_ub=1000"), 16),             # int(0.5 * 32) of 32 candidates
])
def test_modes_reach_the_update_with_their_acted_fraction(mode, overrides, acted):
    from ulorl.config import apply_overrides, config_from_dict
    from ulorl.train.backend import TorchBackend
    from ulorl.train.update import PreparedUpdate, UpdateContext, prepare_update

    cfg = config_from_dict(apply_overrides({}, ["algo.mpt.mode=off", f"algo.entropy_control.mode={mode}",
                                                *overrides]))
    model, samples = _update_fixture()
    ctx = UpdateContext(TorchBackend(model, cfg.train), cfg.algo, cfg.train, 1.0, 0, torch.device("cpu"))
    prep = prepare_update(samples, ctx)
    assert isinstance(prep, PreparedUpdate), prep
    assert prep.metrics["train/tokens"] == 32
    assert prep.metrics["train/entropy_control_frac"] == pytest.approx(acted / 32)
    assert prep.metrics["train/masked_frac"] == 0.0                     # the MPT mask alone (mode off)
    masked = int(prep.loss_mask.sum())
    assert masked == (acted if ENTROPY_CONTROLS[mode].action == "mask" else 0)
    assert (prep.kl_tokens is not None) == (mode == "kl_cov")
    if prep.kl_tokens is not None:
        assert int(prep.kl_tokens.sum()) == acted


def test_kl_cov_update_on_policy_equals_the_unmasked_update():
    from ulorl.config import apply_overrides, config_from_dict
    from ulorl.train.backend import TorchBackend
    from ulorl.train.update import UpdateContext, policy_update

    results = {}
    for mode in ("off", "kl_cov"):
        cfg = config_from_dict(apply_overrides({}, ["algo.mpt.mode=off", f"algo.entropy_control.mode={mode}",
                                                    "algo.entropy_control.kl_cov_ratio=0.5", "train.lr=1e-2"]))
        model, samples = _update_fixture()
        ctx = UpdateContext(TorchBackend(model, cfg.train), cfg.algo, cfg.train, 1.0, 0, torch.device("cpu"))
        res = policy_update(samples, ctx)
        assert res.updated, res.reason
        results[mode] = (res.metrics, {k: v.detach().clone() for k, v in model.state_dict().items()})
    # POIS, one update: r = 1, no clip acts and the |log r| penalty has no gradient: the same step
    assert results["kl_cov"][0]["train/pg_loss"] == pytest.approx(results["off"][0]["train/pg_loss"], abs=1e-6)
    for k, v in results["off"][1].items():
        assert torch.allclose(results["kl_cov"][1][k], v, atol=1e-6), k
