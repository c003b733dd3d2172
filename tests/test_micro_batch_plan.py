"""``padding_plan``: the least padded-token split of length-sorted rows into micro-batches."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from ulorl.rollout.types import Sample, SegmentSpan
from ulorl.train.batch import build_train_batch, micro_batches, padding_plan


def _cost(lengths: list[int], runs: list[tuple[int, int]], overhead: int) -> int:
    return sum((b - a) * lengths[b - 1] + overhead for a, b in runs)


def _brute_force(lengths: list[int], budget: int, overhead: int) -> int:
    """Least cost over every split of the sorted rows into contiguous runs."""
    n = len(lengths)
    best = None
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        runs = list(zip(bounds, bounds[1:]))
        if any(b - a > 1 and (b - a) * lengths[b - 1] > budget for a, b in runs):
            continue
        c = _cost(lengths, runs, overhead)
        best = c if best is None else min(best, c)
    assert best is not None
    return best


def test_short_rows_are_not_padded_to_the_long_ones():
    # 6 short rows and 2 long ones, budget 1000: first fit put all 8 in one micro-batch padded to 100
    # (800 tokens); the plan keeps the short ones apart: 6 x 10 + 2 x 100 = 260, + 2 x 16 overhead
    lengths = [10] * 6 + [100] * 2
    assert padding_plan(lengths, 1000, 16) == [(0, 6), (6, 8)]
    # an overhead above the 540 padded tokens the cut saves merges them again: 800 + 600 < 260 + 2 x 600
    assert padding_plan(lengths, 1000, 600) == [(0, 8)]


def test_budget_splits_equal_rows_and_a_lone_long_row_may_exceed_it():
    assert padding_plan([5, 5, 5, 5], 10, 1) == [(0, 2), (2, 4)]
    assert padding_plan([3, 50], 20, 1) == [(0, 1), (1, 2)]
    assert padding_plan([], 10, 1) == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=8), st.integers(1, 120), st.integers(0, 30))
def test_plan_is_optimal_and_valid(lengths, budget, overhead):
    lengths = sorted(lengths)
    runs = padding_plan(lengths, budget, overhead)
    assert runs[0][0] == 0 and runs[-1][1] == len(lengths)
    assert all(a < b for a, b in runs) and all(r[1] == s[0] for r, s in zip(runs, runs[1:]))
    assert all(b - a == 1 or (b - a) * lengths[b - 1] <= budget for a, b in runs)
    assert _cost(lengths, runs, overhead) == _brute_force(lengths, budget, overhead)


def test_micro_batches_of_a_long_tailed_batch_pad_little():
    resp = [20] * 24 + [60] * 6 + [300, 400]
    samples = [Sample(sample_id=i, group_id=i // 4, prompt_ids=[1] * 10, response_ids=[2] * n, reward=0.0,
                      segments=[SegmentSpan(0, n, 0)]) for i, n in enumerate(resp)]
    batch = build_train_batch(samples, 0)
    mbs = micro_batches(batch, token_budget=16384)
    assert sorted(i for mb in mbs for i in mb) == list(range(len(resp)))
    padded = sum(len(mb) * max(10 + resp[i] for i in mb) for mb in mbs)
    # rows of 30, 70, 310, 410 tokens: 24 x 30 + 6 x 70 + 2 x 410 = 1960 padded tokens for 1860 real ones
    # (310 and 410 share a micro-batch: 100 padded tokens cost less than a 128-token overhead); first
    # fit put all 32 rows in one micro-batch of 32 x 410 = 13120
    assert [len(mb) for mb in mbs] == [24, 6, 2] and padded == 1960
