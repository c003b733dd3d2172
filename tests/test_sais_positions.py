"""SAIS old log-probs are stored by position: a segment with no stored values leaves no shift."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan
from ulorl.train.batch import build_train_batch
from ulorl.train.update import check_sais_logprobs, current_token_stats, segment_logprobs


def _model() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64)
    return Qwen3ForCausalLM(cfg).eval()


def _sample(resp: list[int]) -> Sample:
    s = Sample(sample_id=7, group_id=0, prompt_ids=[1, 2, 3], response_ids=resp,
               sampling_logprobs=[0.0] * len(resp), status=SampleStatus.FINISHED, reward=1.0)
    s.segments = [SegmentSpan(0, 4, 0), SegmentSpan(4, len(resp), 1)]
    return s


def test_gap_before_the_newest_segment_is_filled_by_position():
    model = _model()
    s = _sample([5, 6, 7, 8, 9, 10, 11])  # segment 0 (tokens 0-3) was never scored
    segment_logprobs(model, [s], 0.9, pad_token_id=0, token_budget=64, device=torch.device("cpu"))
    assert len(s.old_logprobs) == len(s.response_ids)
    batch = build_train_batch([s], 0)
    cur, _ = current_token_stats(model, batch, 0.9, 64, torch.device("cpu"))
    want = cur[0, 2:2 + 7]
    torch.testing.assert_close(torch.tensor(s.old_logprobs), want, atol=1e-6, rtol=1e-6)


def test_stored_values_are_kept_and_only_the_new_segment_appended():
    model = _model()
    s = _sample([5, 6, 7, 8, 9, 10, 11])
    s.old_logprobs = [-1.0, -2.0, -3.0, -4.0]
    segment_logprobs(model, [s], 0.9, pad_token_id=0, token_budget=64, device=torch.device("cpu"))
    assert s.old_logprobs[:4] == [-1.0, -2.0, -3.0, -4.0] and len(s.old_logprobs) == 7


def test_length_mismatch_is_refused_before_training():
    s = _sample([5, 6, 7, 8, 9])
    s.old_logprobs = [-1.0, -2.0]
    with pytest.raises(ValueError, match="sample 7 .* 2 stored old log-probs for 5 response tokens"):
        check_sais_logprobs([s])
    s.old_logprobs = [-1.0] * 5
    check_sais_logprobs([s])


def test_engine_segment_logprobs_store_the_engines_values_by_position():
    """SAIS from the engine (ZeRO-3 + vLLM): each new segment's old log-probs are the engine's
    sampled-token log-probs of exactly that segment's positions."""
    from ulorl.rollout.types import Sample, SegmentSpan
    from ulorl.train.update import engine_segment_logprobs

    s = Sample(0, 0, [1, 2], response_ids=[5, 6, 7, 8, 9], sampling_logprobs=[-0.1, -0.2, -0.3, -0.4, -0.5],
               segments=[SegmentSpan(0, 2, 0)])
    engine_segment_logprobs([s])
    assert s.old_logprobs == [-0.1, -0.2]
    s.segments.append(SegmentSpan(2, 5, 1))
    engine_segment_logprobs([s])
    assert s.old_logprobs == [-0.1, -0.2, -0.3, -0.4, -0.5]
    engine_segment_logprobs([s])                        # called again for the same segment: nothing added
    assert len(s.old_logprobs) == 5
    short = Sample(1, 0, [1], response_ids=[5, 6], sampling_logprobs=[-0.1], segments=[SegmentSpan(0, 2, 0)])
    with pytest.raises(ValueError, match="1 log-probs for 2 response tokens"):
        engine_segment_logprobs([short])
