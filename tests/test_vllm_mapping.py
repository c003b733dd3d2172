"""Mapping of ``SamplingParams`` + ``GenerationRequest`` to vLLM sampling arguments (pure; no vLLM).

The engine's behaviour under vLLM is checked in tests/vllm (side venv)."""

from __future__ import annotations

import pytest

from ulorl.rollout.engines.vllm import request_seed_64, vllm_sampling_kwargs
from ulorl.rollout.types import GenerationRequest, SamplingParams

REQ = GenerationRequest(request_id=4, prompt_ids=[1, 2], prefix_ids=[3], max_new_tokens=17, seed=9)


def test_defaults_mean_no_truncation():
    kw = vllm_sampling_kwargs(SamplingParams(temperature=0.85), REQ, [7])
    assert kw["temperature"] == 0.85
    assert kw["top_k"] == 0            # vLLM: 0 = off (our -1)
    assert kw["top_p"] == 1.0
    assert kw["min_p"] == 0.0
    assert kw["max_tokens"] == 17
    assert kw["stop_token_ids"] == [7] and kw["ignore_eos"] is False
    assert kw["logprobs"] == 0 and kw["detokenize"] is False and kw["n"] == 1


def test_truncation_passed_through():
    kw = vllm_sampling_kwargs(SamplingParams(temperature=1.2, top_k=20, top_p=0.9), REQ, [7, 8])
    assert (kw["temperature"], kw["top_k"], kw["top_p"]) == (1.2, 20, 0.9)
    assert kw["stop_token_ids"] == [7, 8]


def test_greedy_is_top_k_one_at_the_given_temperature():
    # the log-prob of a greedy token is log_softmax(logits / T), as in the HF engine
    kw = vllm_sampling_kwargs(SamplingParams(temperature=0.6, top_k=50, top_p=0.5, greedy=True), REQ, [7])
    assert (kw["temperature"], kw["top_k"], kw["top_p"]) == (0.6, 1, 1.0)


def test_request_seed_mixes_both_seeds_deterministically():
    a = vllm_sampling_kwargs(SamplingParams(seed=1), REQ, [7])["seed"]
    assert a == request_seed_64(1, 9) == vllm_sampling_kwargs(SamplingParams(seed=1), REQ, [7])["seed"]
    assert 0 <= a < 2**63
    assert len({request_seed_64(s, r) for s in range(3) for r in range(50)}) == 150


@pytest.mark.parametrize("sp", [SamplingParams(temperature=0.0), SamplingParams(top_p=0.0), SamplingParams(top_k=-2)])
def test_invalid_settings_rejected(sp):
    with pytest.raises(ValueError):
        vllm_sampling_kwargs(sp, REQ, [7])


def test_logits_processors_make_processed_logits_the_untruncated_scaled_logprobs():
    """vLLM's order (sampler.py): NormalizeLogits -> / T -> NormalizeScaledLogits -> top-k mask.
    The kept values equal log_softmax(logits / T); the sampling distribution is unchanged."""
    import torch

    from ulorl.rollout.engines.vllm_ext import NormalizeLogits, NormalizeScaledLogits

    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(4, 50, generator=g)
    temp, k = 0.7, 5
    x = NormalizeLogits(None, "cpu", False).apply(logits.clone())
    y = NormalizeScaledLogits(None, "cpu", False).apply(x / temp)
    kth = torch.topk(y, k, dim=-1).values[:, -1:]
    masked = y.masked_fill(y < kth, float("-inf"))
    kept = masked > float("-inf")
    expect = torch.log_softmax(logits / temp, dim=-1)
    assert torch.allclose(masked[kept], expect[kept], atol=1e-5)
    # the draws: softmax of the processed row == top-k renormalised softmax(logits / T)
    ref = torch.softmax((logits / temp).masked_fill(~kept, float("-inf")), dim=-1)
    assert torch.allclose(torch.softmax(masked, dim=-1), ref, atol=1e-6)
    assert not NormalizeLogits(None, "cpu", False).is_argmax_invariant()
    assert NormalizeScaledLogits(None, "cpu", False).is_argmax_invariant()


def test_state_dict_blob_round_trip():
    import io

    import torch

    from ulorl.rollout.engines.vllm_ext import state_dict_to_bytes

    sd = {"a.weight": torch.arange(6.0).reshape(2, 3).t(), "b.bias": torch.ones(3, dtype=torch.bfloat16)}
    back = torch.load(io.BytesIO(state_dict_to_bytes(sd)), weights_only=True)
    assert list(back) == list(sd)
    for name, t in sd.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t) and back[name].is_contiguous()
