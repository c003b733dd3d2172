"""Admission-cohort reward bookkeeping (``ulorl.train.cohorts``), hand-derived."""

from __future__ import annotations

import pytest

from ulorl.train.cohorts import ClosedCohort, CohortRewards


def test_cohort_closes_only_when_every_sample_is_done():
    c = CohortRewards()
    c.admit(1, 3)
    c.complete(1, 1.0, 10)          # short response finishes first
    c.complete(1, 0.0, 30)
    assert c.pop_closed() == []     # one sample still decoding: no biased early value
    c.complete(1, 0.0, 90)          # the long one arrives later (truncated: reward 0)
    assert c.pop_closed() == [ClosedCohort(step=1, reward_mean=1 / 3, response_len_mean=130 / 3, samples=3)]
    assert c.open == {}


def test_cohorts_close_oldest_first_and_dropped_samples_are_excluded():
    c = CohortRewards()
    c.admit(1, 2)
    c.admit(2, 2)
    c.admit(3, 0)                   # nothing admitted: no cohort
    c.complete(2, 1.0, 5)
    c.complete(2, 1.0, 7)
    c.complete(1, 0.0, 4)
    c.complete(1, None, 0)          # dropped (max_staleness): done, not scored
    closed = c.pop_closed()
    assert [x.step for x in closed] == [1, 2]
    assert closed[0].reward_mean == 0.0 and closed[0].samples == 1
    assert closed[1].reward_mean == 1.0 and closed[1].response_len_mean == 6.0
    assert 3 not in c.open


def test_cohort_of_only_dropped_samples_is_not_reported():
    c = CohortRewards()
    c.admit(4, 1)
    c.complete(4, None, 0)
    assert c.pop_closed() == [] and c.open == {}


def test_state_round_trip_and_errors():
    c = CohortRewards()
    c.admit(5, 2)
    c.complete(5, 1.0, 3)
    d = CohortRewards()
    d.load_state_dict(c.state_dict())
    d.complete(5, 0.0, 5)
    assert d.pop_closed() == [ClosedCohort(5, 0.5, 4.0, 2)]
    with pytest.raises(KeyError):
        d.complete(9, 1.0, 1)
    d.admit(6, 1)
    with pytest.raises(ValueError, match="admitted twice"):
        d.admit(6, 1)
    d.complete(6, 1.0, 1)
    with pytest.raises(ValueError, match="2 samples done of 1"):
        d.complete(6, 1.0, 1)
