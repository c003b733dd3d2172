"""Unfinished / experience pools: termination rules, group gating, ledger invariants, state."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ulorl.rollout.pools import (
    ExperiencePool,
    PoolInvariantError,
    RolloutPools,
    UnfinishedPool,
    termination_status,
)
from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan


def _sample(sid: int, gid: int, status: SampleStatus = SampleStatus.DECODING, n: int = 0) -> Sample:
    s = Sample(sample_id=sid, group_id=gid, prompt_ids=[1, 2])
    s.response_ids = list(range(3, 3 + n))
    s.sampling_logprobs = [-0.5] * n
    if n:
        s.segments = [SegmentSpan(0, n, 0)]
    s.status = status
    return s


def test_termination_rules():
    assert termination_status("eos", 3, 10) is SampleStatus.FINISHED
    assert termination_status("eos", 10, 10) is SampleStatus.FINISHED        # EOS as last allowed token
    assert termination_status("length", 4, 10) is SampleStatus.DECODING      # segment budget, below max
    assert termination_status("length", 10, 10) is SampleStatus.TRUNCATED    # global max


def test_unfinished_pool_rejects_done_and_duplicates():
    pool = UnfinishedPool()
    pool.add(_sample(0, 0))
    with pytest.raises(PoolInvariantError):
        pool.add(_sample(0, 0))
    with pytest.raises(PoolInvariantError):
        pool.add(_sample(1, 0, SampleStatus.FINISHED))
    pool.add(_sample(1, 1))
    assert [s.sample_id for s in pool.remove_group(1)] == [1]
    assert [s.sample_id for s in pool.take_all()] == [0]
    assert len(pool) == 0


def test_experience_pool_group_gating_and_order():
    pool = ExperiencePool(group_size=2)
    pool.add(_sample(4, 2, SampleStatus.FINISHED, 3))       # group 2: 1 of 2
    pool.add(_sample(0, 0, SampleStatus.TRUNCATED, 5))      # group 0: 1 of 2
    assert pool.release() == []                             # nothing complete
    pool.add(_sample(5, 2, SampleStatus.FINISHED, 1))       # group 2 complete
    assert pool.num_ready == 1
    assert pool.release(min_groups=2) == []                 # fewer than min_groups ready: nothing
    assert pool.num_ready == 1                              # and nothing was removed
    pool.add(_sample(1, 0, SampleStatus.FINISHED, 2))       # group 0 complete
    groups = pool.release(min_groups=2)
    assert [[s.sample_id for s in g] for g in groups] == [[0, 1], [4, 5]]   # oldest group first
    assert pool.num_samples == 0


def test_experience_pool_max_groups_and_rejections():
    pool = ExperiencePool(group_size=1)
    for i in range(3):
        pool.add(_sample(i, i, SampleStatus.FINISHED, 1))
    assert [g[0].group_id for g in pool.release(max_groups=2)] == [0, 1]
    assert [g[0].group_id for g in pool.release()] == [2]
    with pytest.raises(PoolInvariantError):
        pool.add(_sample(9, 9, SampleStatus.DECODING))
    pool.add(_sample(9, 9, SampleStatus.FINISHED, 1))
    with pytest.raises(PoolInvariantError):
        pool.add(_sample(10, 9, SampleStatus.FINISHED, 1))   # group already full


def test_rollout_pools_route_drop_release_ledger():
    pools = RolloutPools(group_size=2)
    a, b, c, d = _sample(0, 0), _sample(1, 0), _sample(2, 1), _sample(3, 1)
    pools.admit([a, b, c, d])
    pools.check(in_flight=4)
    a.response_ids = [5, 0]
    pools.route(a, SampleStatus.FINISHED, step=0)
    b.response_ids = [5, 6]
    pools.route(b, SampleStatus.DECODING, step=0)
    c.reward = 1.0
    pools.route(c, SampleStatus.TRUNCATED, step=0)
    assert c.reward == 0.0 and c.finished_step == 0          # truncated -> reward 0
    pools.route(d, SampleStatus.FINISHED, step=0)
    pools.check()
    assert (len(pools.unfinished), pools.experience.num_samples) == (1, 3)
    released = pools.release()
    assert [[s.sample_id for s in g] for g in released] == [[2, 3]]
    dropped = pools.drop_group(0)                           # a in experience, b still decoding
    assert sorted(s.sample_id for s in dropped) == [0, 1]
    assert all(s.status is SampleStatus.DROPPED for s in dropped)
    pools.check()
    assert pools.counters() == {"admitted": 4, "finished": 2, "truncated": 1, "released": 2,
                                "released_groups": 1, "dropped": 2, "dropped_groups": 1}
    with pytest.raises(PoolInvariantError):
        pools.drop_group(0)


def test_rollout_pools_admit_rejects_partial_and_repeated_groups():
    pools = RolloutPools(group_size=2)
    with pytest.raises(PoolInvariantError):
        pools.admit([_sample(0, 0)])
    pools.admit([_sample(0, 0), _sample(1, 0)])
    with pytest.raises(PoolInvariantError):
        pools.admit([_sample(2, 0), _sample(3, 0)])


def test_state_dict_is_json_and_round_trips():
    pools = RolloutPools(group_size=2)
    s = [_sample(i, i // 2) for i in range(4)]
    pools.admit(s)
    s[0].response_ids, s[0].segments = [7, 0], [SegmentSpan(0, 2, 3)]
    s[0].reward = 1.0
    pools.route(s[0], SampleStatus.FINISHED, 1)
    for x in s[1:]:
        x.response_ids, x.segments = [7, 8], [SegmentSpan(0, 2, 3)]
        pools.route(x, SampleStatus.DECODING, 1)
    state = json.loads(json.dumps(pools.state_dict()))
    other = RolloutPools(group_size=2)
    other.load_state_dict(state)
    assert other.state_dict() == pools.state_dict()
    assert [x.sample_id for x in other.unfinished] == [1, 2, 3]
    assert other.experience.samples()[0].reward == 1.0
    assert other.experience.samples()[0].segments == [SegmentSpan(0, 2, 3)]


# One operation of a random pool history: (kind, pick) with kind in route/drop/release.
_ops = st.lists(st.tuples(st.sampled_from(["admit", "route", "route", "route", "drop", "release"]),
                          st.integers(0, 10_000), st.sampled_from(list(SampleStatus)[:3]),
                          st.integers(1, 3)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(group_size=st.integers(1, 4), ops=_ops)
def test_pools_ledger_under_random_histories(group_size, ops):
    """Whatever the history, every admitted sample is in exactly one place or has left exactly once."""
    pools = RolloutPools(group_size)
    in_flight: list[Sample] = []
    left: list[int] = []
    next_sid = next_gid = 0
    for kind, pick, status, min_groups in ops:
        if kind == "admit":
            new = [_sample(next_sid + i, next_gid) for i in range(group_size)]
            next_sid, next_gid = next_sid + group_size, next_gid + 1
            pools.admit(new)
            in_flight += new
        elif kind == "route":
            in_flight += pools.unfinished.take_all()
            if in_flight:
                s = in_flight.pop(pick % len(in_flight))
                pools.route(s, status, step=0)
        elif kind == "drop" and pools.live_groups:
            gid = sorted(pools.live_groups)[pick % len(pools.live_groups)]
            out = pools.drop_group(gid, in_flight=in_flight)
            in_flight = [s for s in in_flight if s.group_id != gid]
            left += [s.sample_id for s in out]
        elif kind == "release":
            for g in pools.release(min_groups):
                assert len(g) == group_size and len({s.group_id for s in g}) == 1
                assert all(s.status in (SampleStatus.FINISHED, SampleStatus.TRUNCATED) for s in g)
                left += [s.sample_id for s in g]
        pools.check(in_flight=len(in_flight))
    assert len(left) == len(set(left))                                 # nobody leaves twice
    held = [s.sample_id for s in in_flight] + [s.sample_id for s in pools.unfinished] + \
        [s.sample_id for s in pools.experience.samples()]
    assert sorted(left + held) == list(range(next_sid))                # nobody lost or duplicated
    assert pools.admitted == next_sid == len(left) + len(held)
