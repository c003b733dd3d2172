"""Staleness of an update's samples (ulorl.train.staleness) on hand-made segments, and in a real run."""

from __future__ import annotations

import pytest

from ulorl.rollout.types import Sample, SegmentSpan
from ulorl.train.staleness import staleness_metrics


def _s(*spans: tuple[int, int, int]) -> Sample:
    s = Sample(sample_id=0, group_id=0, prompt_ids=[1], answer="")
    s.segments = [SegmentSpan(a, b, v) for a, b, v in spans]
    return s


def test_docstring_case_by_hand():
    m = staleness_metrics([_s((0, 3, 4), (3, 4, 5))], 5)
    assert m["staleness/versions_per_sample_mean"] == 2.0
    assert m["staleness/token_lag_mean"] == pytest.approx(0.75)       # (3 * 1 + 1 * 0) / 4
    assert m["staleness/stale_token_frac"] == pytest.approx(0.75)
    assert m["staleness/tokens_lag0"] == pytest.approx(0.25) and m["staleness/tokens_lag1"] == pytest.approx(0.75)


def test_histogram_buckets_and_spans():
    # a: 2 tokens at v0, 2 at v2 (train at 5: lags 5, 3); b: 4 tokens at v5 (lag 0); c: an empty span only
    a, b, c = _s((0, 2, 0), (2, 4, 2)), _s((0, 4, 5)), _s((0, 0, 1))
    m = staleness_metrics([a, b, c], 5)
    assert m["staleness/versions_per_sample_mean"] == pytest.approx(1.5)   # c has no token: left out
    assert m["staleness/versions_per_sample_max"] == 2.0
    assert m["staleness/token_lag_max"] == 5.0
    assert m["staleness/token_lag_mean"] == pytest.approx((2 * 5 + 2 * 3) / 8)
    assert m["staleness/tokens_lag0"] == pytest.approx(0.5) and m["staleness/tokens_lag3p"] == pytest.approx(0.5)
    assert m["staleness/tokens_lag1"] == 0.0 and m["staleness/tokens_lag2"] == 0.0
    assert m["staleness/stale_token_frac"] == pytest.approx(0.5)
    assert staleness_metrics([c], 3) == {}
