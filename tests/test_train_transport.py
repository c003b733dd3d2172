"""Samples packed into tensors for the trainer ranks come back with every field the update reads."""

from __future__ import annotations

import math

import torch

from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan
from ulorl.train.batch import build_train_batch
from ulorl.train.transport import empty_packed, pack_samples, unpack_samples


def _samples() -> list[Sample]:
    return [
        Sample(sample_id=3, group_id=1, prompt_ids=[5, 6, 7], response_ids=[8, 9], old_logprobs=[-0.5, -0.25],
               sampling_logprobs=[-1.0, -1.0], segments=[SegmentSpan(0, 1, 0), SegmentSpan(1, 2, 1)],
               status=SampleStatus.FINISHED, reward=1.0, prompt_text="long text not needed by ranks"),
        Sample(sample_id=4, group_id=1, prompt_ids=[5, 6, 7], response_ids=[10, 11, 12, 13],
               segments=[SegmentSpan(0, 4, 1)], status=SampleStatus.TRUNCATED, reward=None),
    ]


def test_round_trip_keeps_what_the_update_reads():
    src = _samples()
    packed = pack_samples(src)
    assert packed.tokens.tolist() == [5, 6, 7, 8, 9, 5, 6, 7, 10, 11, 12, 13]
    assert packed.meta.tolist() == [[3, 1, 3, 2, 2, 2, 1], [4, 1, 3, 4, 0, 1, 0]]
    # int32 tokens + int64 meta + f64 rewards + f32 old log-probs and engine log-probs (one per response
    # token, NaN for the sample without them) + int64 segments
    assert packed.nbytes == 12 * 4 + 14 * 8 + 2 * 8 + (2 + 6) * 4 + 3 * 3 * 8
    buf = empty_packed(packed.sizes())
    for a, b in zip(buf.tensors(), packed.tensors()):
        a.copy_(b)
    back = unpack_samples(buf)
    assert [s.reward for s in back] == [1.0, None]
    # the engine's log-probs reach every rank (the rollout correction's weights); none stays none
    assert [s.sampling_logprobs for s in back] == [[-1.0, -1.0], []]
    assert [s.old_logprobs for s in back] == [[-0.5, -0.25], []]
    nan = unpack_samples(pack_samples([Sample(0, 0, [1], response_ids=[2], reward=math.nan)]))
    assert math.isnan(nan[0].reward)  # a NaN reward is refused on every rank alike, not turned into 0
    assert [s.token_versions() for s in back] == [[0, 1], [1, 1, 1, 1]]
    x, y = build_train_batch(src, 0), build_train_batch(back, 0)
    for name in ("input_ids", "response_mask", "sais_logprobs", "token_versions", "rewards", "group_ids"):
        assert torch.equal(getattr(x, name), getattr(y, name)), name


def test_empty_samples_pack():
    p = pack_samples([])
    assert p.sizes().tolist() == [0, 0, 0, 0] and unpack_samples(p) == []
