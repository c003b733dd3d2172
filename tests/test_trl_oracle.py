"""TRL's ``GRPOTrainer`` as the loss oracle: its loss code, run on the same tensors as ours.

Where the two must agree (token-level aggregation with clip-higher bounds and no KL, over one or
several micro-batches; GRPO's per-sequence mean; the 80/20 high-entropy mask) the loss and its
gradient are compared element for element, in float32 and float64. Where they differ by design
(the advantage's std; dynamic sampling's denominator; the token count of each mini-batch), the
tests pin the exact ratio, derived by hand, so a change on either side shows.

TRL runs for real: a ``GRPOTrainer`` built on the embedded model with its ``GRPOConfig``; only its
log-prob forward is replaced by the tensors under test (``_get_per_token_logps_and_entropies``),
and, for the advantages, its generation by fixed completions (``_generate_single_turn``).

``trl`` is imported at module level on purpose: where it is missing this file fails to collect,
an error and never a skip, because the oracle must run in CI (``pip install -e '.[dev]'`` pulls
the ``peer`` extra, trl==1.16.0).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from ulorl.algo import dynamic_sampling_filter, group_advantages, policy_loss
from ulorl.algo.entropy_control import high_entropy_minority_mask
from ulorl.bench.peer_settings import TRL_VERSION
from ulorl.models.loading import load_policy


def _import_trl():
    """``trl`` and its ``GRPOConfig`` / ``GRPOTrainer``, imported with this folder off ``sys.path``:
    pytest puts tests/ there, where tests/vllm looks like a namespace package named ``vllm``, and
    TRL's import-time ``is_vllm_available()`` would find it and fail to read its version."""
    here = Path(__file__).resolve().parent
    saved_path = list(sys.path)
    shadow = sys.modules.get("vllm")
    if shadow is not None and getattr(shadow, "__file__", None) is None:   # a namespace package, not vLLM
        del sys.modules["vllm"]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    try:
        import trl
        from trl import GRPOConfig, GRPOTrainer
    finally:
        sys.path[:] = saved_path
        if shadow is not None and "vllm" not in sys.modules:
            sys.modules["vllm"] = shadow
    return trl, GRPOConfig, GRPOTrainer


trl, GRPOConfig, GRPOTrainer = _import_trl()

EPS_LOW, EPS_HIGH = 0.2, 0.28
DTYPES = [torch.float32, torch.float64]


def test_the_oracle_is_the_trl_release_it_was_written_against():
    assert trl.__version__ == TRL_VERSION


def _zero_reward(prompts, completions, **_):
    return [0.0] * len(prompts)


@pytest.fixture(scope="module")
def make_trainer(tmp_path_factory):
    """``make_trainer(**GRPOConfig overrides)`` -> a GRPOTrainer in training mode (one per setting)."""
    built: dict[tuple, GRPOTrainer] = {}

    def make(**overrides) -> GRPOTrainer:
        key = tuple(sorted(overrides.items()))
        if key not in built:
            kw = {"per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 8,
                  "epsilon": EPS_LOW, "epsilon_high": EPS_HIGH, "beta": 0.0, "loss_type": "dapo",
                  **overrides}
            args = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("trl")), use_cpu=True, bf16=False,
                              report_to="none", save_strategy="no", disable_tqdm=True, **kw)
            model, tok = load_policy("embedded")
            rows = args.per_device_train_batch_size * args.steps_per_generation
            tr = GRPOTrainer(model=model, reward_funcs=_zero_reward, args=args, processing_class=tok,
                             train_dataset=Dataset.from_list([{"prompt": "Add: 1+2\n"}] * rows))
            tr.model.train()
            tr.current_gradient_accumulation_steps = args.gradient_accumulation_steps  # what train() sets
            built[key] = tr
        return built[key]

    return make


def trl_loss(tr: GRPOTrainer, logps, old, adv, completion_mask, *, entropies=None, num_items=None):
    """TRL's ``_compute_loss`` on exactly these tensors: its log-prob forward returns ``logps`` (and
    ``entropies``); ``num_items`` = the generation batch's completion tokens (default: this batch's)."""
    B, T = logps.shape
    ent = torch.zeros_like(logps) if entropies is None else entropies
    tr._get_per_token_logps_and_entropies = lambda *a, **k: (logps, ent, None)
    inputs = {"prompt_ids": torch.ones(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.ones(B, T, dtype=torch.long), "completion_mask": completion_mask.long(),
              "advantages": adv, "old_per_token_logps": old,
              "num_items_in_batch": completion_mask.sum() if num_items is None else torch.tensor(num_items)}
    try:
        return tr._compute_loss(tr.model, inputs)
    finally:
        del tr._get_per_token_logps_and_entropies


def _case(dtype, B=8, T=6, seed=0):
    """Right-padded responses of random lengths, old log-probs far enough off that both clips act,
    advantages of both signs and some zeros."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, T + 1, (B,), generator=g)
    resp = torch.arange(T)[None] < lens[:, None]
    lp = (-torch.rand(B, T, generator=g) * 3).to(dtype)
    old = lp + (torch.rand(B, T, generator=g) - 0.5).to(dtype)
    adv = torch.randn(B, generator=g).to(dtype)
    adv[::3] = 0.0
    return lp, old, adv, resp


def _leaf(x):
    return x.detach().clone().requires_grad_(True)


def _grad(loss, leaf):
    (g,) = torch.autograd.grad(loss, leaf)
    return g


def _exact(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0)


# ----------------------------------------------------------------------------- must agree


@pytest.mark.parametrize("dtype", DTYPES)
def test_token_level_clip_higher_no_kl_equals_trl_dapo(make_trainer, dtype):
    lp, old, adv, resp = _case(dtype)
    ratio = (lp - old).exp()[resp]
    assert (ratio > 1 + EPS_HIGH).any() and (ratio < 1 - EPS_LOW).any()      # both bounds are in play
    ours, theirs = _leaf(lp), _leaf(lp)
    loss, m = policy_loss(ours, old, adv, resp, eps_low=EPS_LOW, eps_high=EPS_HIGH)
    ref = trl_loss(make_trainer(), theirs, old, adv[:, None], resp)
    _exact(loss, ref)
    _exact(_grad(loss, ours), _grad(ref, theirs))
    assert m["clip_frac"] > 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_bnpo_is_token_level_over_the_local_batch(make_trainer, dtype):
    lp, old, adv, resp = _case(dtype, seed=1)
    ours, theirs = _leaf(lp), _leaf(lp)
    loss, _ = policy_loss(ours, old, adv, resp, eps_low=EPS_LOW, eps_high=EPS_HIGH)
    ref = trl_loss(make_trainer(loss_type="bnpo"), theirs, old, adv[:, None], resp)
    _exact(loss, ref)
    _exact(_grad(loss, ours), _grad(ref, theirs))


@pytest.mark.parametrize("dtype", DTYPES)
def test_grpo_is_our_seq_mean(make_trainer, dtype):
    lp, old, adv, resp = _case(dtype, seed=2)
    ours, theirs = _leaf(lp), _leaf(lp)
    loss, _ = policy_loss(ours, old, adv, resp, eps_low=EPS_LOW, eps_high=EPS_HIGH, loss_agg="seq_mean")
    ref = trl_loss(make_trainer(loss_type="grpo"), theirs, old, adv[:, None], resp)
    torch.testing.assert_close(loss, ref, rtol=1e-15 if dtype == torch.float64 else 1e-6, atol=0)
    torch.testing.assert_close(_grad(loss, ours), _grad(ref, theirs),
                               rtol=1e-15 if dtype == torch.float64 else 1e-6, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_four_micro_batches_of_one_step_equal_trl_gradient_accumulation(make_trainer, dtype):
    """One optimizer step over 4 micro-batches: TRL (gradient accumulation 4) divides each by the
    generation batch's token count, we by the step's global count (``num_tokens``): the same parts."""
    lp, old, adv, resp = _case(dtype, B=8, seed=3)
    n_all = int(resp.sum())
    tr = make_trainer(per_device_train_batch_size=2, gradient_accumulation_steps=4, steps_per_generation=4)
    ours, theirs = _leaf(lp), _leaf(lp)
    total_ours = total_theirs = torch.zeros((), dtype=dtype)
    for rows in (slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)):
        part, _ = policy_loss(ours[rows], old[rows], adv[rows], resp[rows], eps_low=EPS_LOW, eps_high=EPS_HIGH,
                              num_tokens=n_all)
        ref = trl_loss(tr, theirs[rows], old[rows], adv[rows, None], resp[rows], num_items=n_all)
        _exact(part, ref)
        total_ours, total_theirs = total_ours + part, total_theirs + ref
    _exact(_grad(total_ours, ours), _grad(total_theirs, theirs))
    whole, _ = policy_loss(lp, old, adv, resp, eps_low=EPS_LOW, eps_high=EPS_HIGH)
    torch.testing.assert_close(total_ours.detach(), whole, rtol=1e-6 if dtype == torch.float32 else 1e-14, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_80_20_mask_equals_trl_top_entropy_quantile(make_trainer, dtype):
    lp, old, adv, resp = _case(dtype, B=8, T=10, seed=4)
    g = torch.Generator().manual_seed(5)
    # entropies exact in float32 too: TRL takes its quantile in float32
    ent = (torch.rand(lp.shape, generator=g, dtype=torch.float32) * 2).to(dtype)
    masked = high_entropy_minority_mask(ent, resp, 0.2)
    assert 0 < int(masked.sum()) < int(resp.sum())
    ours, theirs = _leaf(lp), _leaf(lp)
    loss, m = policy_loss(ours, old, adv, resp, loss_mask=masked, eps_low=EPS_LOW, eps_high=EPS_HIGH)
    ref = trl_loss(make_trainer(top_entropy_quantile=0.2), theirs, old, adv[:, None], resp, entropies=ent)
    _exact(loss, ref)
    _exact(_grad(loss, ours), _grad(ref, theirs))
    assert m["masked_frac"].item() == pytest.approx(int(masked.sum()) / int(resp.sum()))


# ----------------------------------------------------------------------------- differ by design


def trl_advantages(tr: GRPOTrainer, rewards: list[float], prompts: list[str]) -> torch.Tensor:
    """The advantages TRL's ``_generate_and_score_completions`` computes for these rewards (its
    generation replaced by fixed 3-token completions, its reward function returning ``rewards``)."""
    G = tr.num_generations
    tr._generate_single_turn = lambda prompt_ids, *a, **k: ([[5, 6, 0] for _ in prompt_ids], None)

    def reward(prompts, completions, **_):
        return list(rewards)

    saved = tr.reward_funcs
    tr.reward_funcs = [reward]
    try:
        out = tr._generate_and_score_completions([{"prompt": p} for p in prompts for _ in range(G)])
    finally:
        tr.reward_funcs = saved
        del tr._generate_single_turn
    return out["advantages"]


def test_advantages_trl_divides_by_the_unbiased_std_plus_1e4(make_trainer):
    """Binary rewards, G = 4. Group accuracy p: population std sqrt(p (1 - p)); unbiased std that
    times sqrt(G / (G - 1)) = 1.1547005. p = 1/4: 0.4330127 / 0.5; p = 1/2: 0.5 / 0.5773503; p = 1: 0
    (both give advantage 0). TRL: (r - mean) / (unbiased + 1e-4); ulorl's default: / (population +
    1e-6), so ours / TRL's = (unbiased + 1e-4) / (population + 1e-6) per group: 1.154929 at p = 1/4,
    1.154898 at p = 1/2. With algo.adv_std=unbiased, adv_eps=1e-4 (the bench's setting) they agree."""
    tr = make_trainer(per_device_train_batch_size=12)
    r = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    groups = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    theirs = trl_advantages(tr, r, ["Add: 1+2\n", "Add: 3+4\n", "Add: 5+6\n"]).double()
    rewards = torch.tensor(r, dtype=torch.float64)
    same = group_advantages(rewards, groups, eps=1e-4, unbiased=True)
    torch.testing.assert_close(theirs, same, rtol=1e-6, atol=1e-7)             # TRL computes in float32
    ours = group_advantages(rewards, groups)                                     # population std + 1e-6
    pop = [math.sqrt(0.25 * 0.75), 0.5]
    unb = [0.5, math.sqrt(1 / 3)]
    for grp, (p_std, u_std, by_hand) in enumerate(zip(pop, unb, (1.154929, 1.154898))):
        rows = slice(4 * grp, 4 * grp + 4)
        expected = (u_std + 1e-4) / (p_std + 1e-6)
        assert expected == pytest.approx(by_hand, abs=1e-6)
        torch.testing.assert_close(ours[rows] / theirs[rows], torch.full((4,), expected, dtype=torch.float64),
                                   rtol=1e-6, atol=0)
    assert theirs[8:].eq(0).all() and ours[8:].eq(0).all()                      # all-equal group: 0 on both


@pytest.mark.parametrize("dtype", DTYPES)
def test_dynamic_sampling_denominator_ours_over_trl_is_all_tokens_over_kept(make_trainer, dtype):
    """TRL has no dynamic sampling: an all-equal group keeps advantage 0 and its tokens stay in the
    denominator. Ours drops the group first, so loss and gradient are larger by N_all / N_kept."""
    lp, old, _, resp = _case(dtype, B=8, seed=6)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0], dtype=dtype)   # group 1 all equal
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv = group_advantages(rewards, groups, eps=1e-4, unbiased=True)
    keep = dynamic_sampling_filter(rewards, groups)
    assert keep.tolist() == [True] * 4 + [False] * 4 and adv[4:].eq(0).all()
    n_all, n_kept = int(resp.sum()), int(resp[keep].sum())
    assert n_all > n_kept
    theirs = _leaf(lp)
    ref = trl_loss(make_trainer(), theirs, old, adv[:, None], resp)
    ours = _leaf(lp[keep])
    loss, _ = policy_loss(ours, old[keep], adv[keep], resp[keep], eps_low=EPS_LOW, eps_high=EPS_HIGH)
    tol = {"rtol": 1e-6 if dtype == torch.float32 else 1e-14, "atol": 0}
    torch.testing.assert_close(loss / ref, torch.tensor(n_all / n_kept, dtype=dtype), **tol)
    g_theirs = _grad(ref, theirs)
    torch.testing.assert_close(_grad(loss, ours), g_theirs[keep] * (n_all / n_kept), **tol)
    assert g_theirs[~keep].eq(0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_two_minibatches_trl_divides_by_the_mean_token_count_we_by_each_own(make_trainer, dtype):
    """Two optimizer steps per rollout (TRL: steps_per_generation 2; ours: train.updates_per_step 2,
    ``split_minibatches``). TRL divides each mini-batch by N_all / 2, we by its own count N_j (Eq. 10
    per step), so ours / TRL's = (N_all / 2) / N_j for the loss and gradient of mini-batch j."""
    lp, old, adv, resp = _case(dtype, B=8, seed=7)
    n_all = int(resp.sum())
    tr = make_trainer(per_device_train_batch_size=4, steps_per_generation=2)
    tol = {"rtol": 1e-6 if dtype == torch.float32 else 1e-14, "atol": 0}
    ratios = []
    for rows in (slice(0, 4), slice(4, 8)):
        n_j = int(resp[rows].sum())
        ours, theirs = _leaf(lp[rows]), _leaf(lp[rows])
        loss, _ = policy_loss(ours, old[rows], adv[rows], resp[rows], eps_low=EPS_LOW, eps_high=EPS_HIGH,
                              num_tokens=n_j)
        ref = trl_loss(tr, theirs, old[rows], adv[rows, None], resp[rows], num_items=n_all)
        expected = (n_all / 2) / n_j
        torch.testing.assert_close(loss / ref, torch.tensor(expected, dtype=dtype), **tol)
        torch.testing.assert_close(_grad(loss, ours), _grad(ref, theirs) * expected, **tol)
        ratios.append(expected)
    assert ratios[0] != 1.0 and ratios[1] != 1.0   # the case has mini-batches of unequal token counts
