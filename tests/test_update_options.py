"""policy_update options on a tiny random Qwen3: ``algo.adv_std`` and masks with several updates per step.

Samples are hand-made (two groups of two, rewards 1 / 0), so the advantages are known exactly:
|r - mean| = 0.5; population std of {1, 0} = 0.5 -> |A| = 1; unbiased std = sqrt(0.5) -> |A| = 1 / sqrt(2).
Positive samples are the model's greedy continuations (probabilities near 1, so MPTs exist).
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from ulorl.config import ExperimentConfig, TrainConfig, apply_overrides, config_from_dict
from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan
from ulorl.train.backend import TorchBackend
from ulorl.train.batch import build_train_batch
from ulorl.train.update import UpdateContext, current_token_stats, policy_update

VOCAB = 64
CPU = torch.device("cpu")


def tiny_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=16, intermediate_size=64,
                                   max_position_embeddings=128)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # peaked distributions: some tokens above tau, low entropy
        model.lm_head.weight.mul_(30.0)
    return model


MODEL = tiny_model()


def _ctx(backend: TorchBackend, cfg: ExperimentConfig) -> UpdateContext:
    """The update context of these tests: temperature 1, pad id 0, on the CPU."""
    return UpdateContext(backend, cfg.algo, cfg.train, 1.0, 0, CPU)


def greedy(prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(MODEL(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def samples() -> list[Sample]:
    out = []
    g = torch.Generator().manual_seed(1)
    for i in range(4):
        prompt = [3 + i, 4, 5]
        resp = greedy(prompt, 6) if i % 2 == 0 else torch.randint(2, VOCAB, (6,), generator=g).tolist()
        s = Sample(sample_id=i, group_id=i // 2, prompt_ids=prompt, response_ids=resp,
                   sampling_logprobs=[-0.1] * len(resp), status=SampleStatus.FINISHED, reward=float(i % 2 == 0))
        s.segments = [SegmentSpan(0, len(resp), 0)]
        out.append(s)
    return out


def _cfg(*overrides: str) -> ExperimentConfig:
    return config_from_dict(apply_overrides({}, list(overrides)))


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.mark.parametrize("adv_std, expected", [("population", 1.0), ("unbiased", 1 / math.sqrt(2.0))])
def test_adv_std_reaches_the_update(adv_std, expected):
    cfg = _cfg(f"algo.adv_std={adv_std}")
    model = tiny_model()
    res = policy_update(samples(), _ctx(TorchBackend(model, cfg.train), cfg))
    assert res.updated, res.reason
    assert res.metrics["train/adv_abs_mean"] == pytest.approx(expected, rel=1e-4)


def test_adv_std_rejects_unknown_value():
    with pytest.raises(ValueError, match="adv_std"):
        _cfg("algo.adv_std=sample")


def test_updates_per_step_masks_come_from_the_pre_update_model():
    """Documented behaviour (README, ``train.updates_per_step``): with 2 mini-batch updates, the DMMPT
    mask of the SECOND mini-batch is the one of the model before the first optimizer step."""
    cfg = _cfg("train.updates_per_step=2", "train.lr=0.05", "algo.mpt.mode=dynamic", "algo.mpt.tau=0.5",
               "algo.mpt.sigma=10")
    model = tiny_model()
    batch = build_train_batch(samples(), 0)
    lp_before, _ = current_token_stats(model, batch, 1.0, 4096, torch.device("cpu"))
    expected = (lp_before.exp() >= 0.5) & batch.response_mask & (batch.rewards == 1).reshape(-1, 1)
    assert expected.any()
    res = policy_update(samples(), _ctx(TorchBackend(model, cfg.train), cfg))
    assert res.updated and res.metrics["train/updates"] == 2.0
    lp_after, _ = current_token_stats(model, batch, 1.0, 4096, torch.device("cpu"))
    recomputed = (lp_after.exp() >= 0.5) & batch.response_mask & (batch.rewards == 1).reshape(-1, 1)
    assert not torch.equal(recomputed, expected)  # the model moved enough to change the mask...
    assert torch.equal(res.loss_mask, expected)   # ...yet every mini-batch used the pre-update mask


def test_updates_per_step_description_documents_the_mask_choice():
    text = TrainConfig.model_fields["updates_per_step"].description or ""
    assert "pre-update" in text and "MPT" in text


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean"])
def test_loss_agg_reaches_the_update(loss_agg):
    """Ratio 1 (POIS, first update), nothing masked: loss = -sum_i A_i w_i with w_i = len_i / all tokens
    (token_mean) or 1 / N (seq_mean). Advantages sum to 0 per group, so seq_mean gives exactly 0, and
    token_mean gives -2 * (1 * 6 - 1 * 3) / 18 = -1/3 (two groups; negative responses cut to 3 tokens)."""
    cfg = _cfg(f"algo.loss_agg={loss_agg}", "algo.mpt.mode=off")
    batch = samples()
    for s in batch[1::2]:
        s.response_ids, s.sampling_logprobs = s.response_ids[:3], s.sampling_logprobs[:3]
        s.segments = [SegmentSpan(0, 3, 0)]
    res = policy_update(batch, _ctx(TorchBackend(tiny_model(), cfg.train), cfg))
    expected = 0.0 if loss_agg == "seq_mean" else -1.0 / 3.0
    assert res.metrics["train/pg_loss"] == pytest.approx(expected, abs=1e-5)


def test_prepare_then_apply_is_the_update_and_prepare_does_not_train():
    from ulorl.train.parallel import LocalParallel
    from ulorl.train.update import PreparedUpdate, apply_update, prepare_update

    cfg = _cfg("algo.mpt.mode=static")
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    backend = TorchBackend(model, cfg.train)
    assert backend.data_parallel is None and backend.rollout_model is model  # the protocol's members
    prep = prepare_update(samples(), _ctx(backend, cfg))
    assert isinstance(prep, PreparedUpdate)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # no gradient step yet
    shape = prep.batch.targets.shape
    assert prep.old_logprobs.shape == shape and prep.loss_mask.shape == shape and prep.advantages.shape == (4,)
    assert prep.advantages.abs().tolist() == pytest.approx([1.0] * 4, rel=1e-4)
    res = apply_update(prep, _ctx(backend, cfg))
    assert res.updated and res.metrics["train/updates"] == 1.0

    ref_model = tiny_model()
    ref = policy_update(samples(), _ctx(TorchBackend(ref_model, cfg.train), cfg))
    assert res.metrics == pytest.approx(ref.metrics)
    assert all(torch.equal(ref_model.state_dict()[k], v) for k, v in model.state_dict().items())
    assert LocalParallel().micro_batches(prep.batch, 4096) == [([0, 1, 2, 3], 1.0)]


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_prepare_computes_the_mpt_mask_once_and_static_mode_trains_on_it(mode, monkeypatch):
    import ulorl.algo.masks as masks
    import ulorl.train.update as update
    from ulorl.train.update import PreparedUpdate, prepare_update

    calls = []
    real = masks.mpt_mask
    for module in (masks, update):   # every name the update could reach it by
        if hasattr(module, "mpt_mask"):
            monkeypatch.setattr(module, "mpt_mask", lambda *a, **k: calls.append(1) or real(*a, **k))
    cfg = _cfg(f"algo.mpt.mode={mode}", "algo.mpt.tau=0.5")   # tau 0.5: the greedy samples hold MPTs
    prep = prepare_update(samples(), _ctx(TorchBackend(tiny_model(), cfg.train), cfg))
    assert isinstance(prep, PreparedUpdate) and len(calls) == 1
    if mode == "static":   # the metric and the loss read one mask
        n = prep.batch.num_response_tokens
        assert prep.metrics["train/mpt_frac"] == prep.metrics["train/masked_frac"] == float(prep.loss_mask.sum()) / n
        assert prep.loss_mask.any()


def test_prepare_returns_the_reason_when_nothing_can_train():
    from ulorl.train.update import UpdateResult, prepare_update

    cfg = _cfg()
    same = [s for s in samples() if s.group_id == 0]
    for s in same:
        s.reward = 1.0                      # all-equal rewards: dynamic sampling drops the group
    out = prepare_update(same, _ctx(TorchBackend(tiny_model(), cfg.train), cfg))
    assert isinstance(out, UpdateResult) and not out.updated and "dynamic sampling" in out.reason
