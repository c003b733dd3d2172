"""SegmentScheduler over the deterministic ScriptedEngine (tests/fakes.py)."""

from __future__ import annotations

import json

import pytest
from fakes import ScriptedEngine
from hypothesis import given, settings
from hypothesis import strategies as st

from ulorl.rollout.scheduler import PromptRequest, SegmentScheduler, request_seed
from ulorl.rollout.types import GenerationResult, Sample, SampleStatus, SamplingParams

SP = SamplingParams()


def _prompts(n: int, start: int = 0) -> list[PromptRequest]:
    return [PromptRequest(prompt_ids=[100 + start + i, 7, 8], answer=str(start + i), meta={"i": start + i})
            for i in range(n)]


def _sched(engine, **kw) -> SegmentScheduler:
    args = dict(segments=1, max_response_len=16, group_size=2, prompts_per_step=2, sampling=SP)
    args.update(kw)
    return SegmentScheduler(engine, **args)


def _run(sched: SegmentScheduler, prompt_steps: int, *, version_per_step: bool = False, max_steps: int = 200,
         score_fn=None):
    """Feed new prompts for ``prompt_steps`` steps, then drain. Returns (released samples, results)."""
    released: list[Sample] = []
    results = []
    k = 0
    while k < max_steps:
        new = _prompts(sched.prompts_wanted(), start=10 * k) if k < prompt_steps else []
        r = sched.step(new, policy_version=k if version_per_step else 0, score_fn=score_fn)
        results.append(r)
        for g in r.groups:
            released += g
        k += 1
        if k >= prompt_steps and sched.unfinished == 0 and r.ready_groups_waiting == 0:
            break
    return released, results


@pytest.mark.parametrize("segments,max_len", [(2, 16), (4, 16), (8, 16), (3, 10), (16, 16)])
def test_segments_stitched_equal_one_shot(segments, max_len):
    """Tokens and log-probs of S segments, concatenated, equal one-shot (S=1) decoding exactly."""
    one, _ = _run(_sched(ScriptedEngine(max_len=max_len + 4), max_response_len=max_len), prompt_steps=3)
    seg, _ = _run(_sched(ScriptedEngine(max_len=max_len + 4), max_response_len=max_len, segments=segments),
                  prompt_steps=3)
    a = {s.sample_id: s for s in one}
    b = {s.sample_id: s for s in seg}
    assert sorted(a) == sorted(b) == list(range(12))
    for sid in a:
        assert b[sid].response_ids == a[sid].response_ids
        assert b[sid].sampling_logprobs == a[sid].sampling_logprobs
        assert b[sid].status is a[sid].status
        assert len(b[sid].segments) <= segments
        assert b[sid].response_len <= max_len
    assert any(len(s.segments) > 1 for s in seg)                 # the test exercised continuation
    assert any(s.status is SampleStatus.TRUNCATED for s in seg)
    assert any(s.status is SampleStatus.FINISHED for s in seg)


def test_each_termination_rule_routes():
    # G=1; sample ids 0..3 get natural lengths: EOS in segment 1, EOS in segment 3, EOS exactly at
    # the global max, past the global max (truncated).
    eng = ScriptedEngine(lengths={0: 3, 1: 10, 2: 12, 3: 40})
    sched = _sched(eng, segments=3, max_response_len=12, group_size=1, prompts_per_step=4)
    scored: list[int] = []

    def score(samples):
        scored.extend(s.sample_id for s in samples)
        return [1.0] * len(samples)

    r0 = sched.step(_prompts(4), policy_version=5, score_fn=score)
    assert [q.max_new_tokens for q in eng.calls[0]] == [4, 4, 4, 4]
    assert (r0.finished, r0.truncated, r0.continued) == (1, 0, 3)
    assert [g[0].sample_id for g in r0.groups] == [0]
    assert r0.groups[0][0].status is SampleStatus.FINISHED and r0.groups[0][0].reward == 1.0
    assert sched.unfinished == 3 and r0.carried_rows == 0 and r0.batch_rows == 4

    r1 = sched.step([], policy_version=6, score_fn=score)        # all three continue
    assert [q.prefix_ids.__len__() for q in eng.calls[1]] == [4, 4, 4]
    assert (r1.finished, r1.truncated, r1.continued, r1.carried_rows) == (0, 0, 3, 3)

    r2 = sched.step([], policy_version=7, score_fn=score)
    assert (r2.finished, r2.truncated, r2.continued) == (2, 1, 0)
    out = {g[0].sample_id: g[0] for g in r2.groups}
    assert out[1].status is SampleStatus.FINISHED and out[1].response_len == 10
    assert out[1].response_ids[-1] == eng.eos_token_id
    assert out[2].status is SampleStatus.FINISHED and out[2].response_len == 12   # EOS at the max
    assert out[3].status is SampleStatus.TRUNCATED and out[3].response_len == 12
    assert out[3].reward == 0.0 and 3 not in scored                              # never scored
    assert sorted(scored) == [0, 1, 2]
    assert [(sp.start, sp.end, sp.version) for sp in out[3].segments] == [(0, 4, 5), (4, 8, 6), (8, 12, 7)]
    assert out[3].token_versions() == [5] * 4 + [6] * 4 + [7] * 4
    assert out[3].staleness == 2 and r2.staleness_max == 2
    assert out[1].finished_step == 2 and out[1].created_step == 0
    assert sched.unfinished == 0 and sched.experience == 0


def test_last_segment_clipped_to_global_max():
    eng = ScriptedEngine(lengths={0: 99})
    sched = _sched(eng, segments=3, max_response_len=10, group_size=1, prompts_per_step=1)
    sched.step(_prompts(1), 0)
    sched.step([], 0)
    r = sched.step([], 0)
    assert [c[0].max_new_tokens for c in eng.calls] == [4, 4, 2]
    assert r.groups[0][0].response_len == 10 and r.truncated == 1


def test_group_gating_waits_for_the_whole_group():
    # group 0 = samples 0,1; group 1 = samples 2,3. Sample 1 needs 3 segments, the rest 1.
    eng = ScriptedEngine(lengths={0: 2, 1: 11, 2: 3, 3: 1})
    sched = _sched(eng, segments=4, max_response_len=16, group_size=2, prompts_per_step=2)
    r0 = sched.step(_prompts(2), 0)
    assert [[s.sample_id for s in g] for g in r0.groups] == [[2, 3]]
    assert r0.experience == 1 and r0.unfinished == 1           # sample 0 waits for sample 1
    r1 = sched.step([], 1)
    assert r1.groups == [] and r1.experience == 1
    r2 = sched.step([], 2)
    assert [[s.sample_id for s in g] for g in r2.groups] == [[0, 1]]
    assert r2.groups[0][0].staleness == 0 and r2.groups[0][1].staleness == 2


def test_min_ready_groups_holds_back_release():
    eng = ScriptedEngine(lengths={0: 1, 1: 1, 2: 6})
    sched = _sched(eng, segments=2, max_response_len=8, group_size=1, prompts_per_step=3, min_ready_groups=3)
    r0 = sched.step(_prompts(3), 0)
    assert r0.groups == [] and r0.ready_groups_waiting == 2
    r1 = sched.step([], 0)
    assert [g[0].sample_id for g in r1.groups] == [0, 1, 2]


def test_staleness_drop_takes_the_whole_group():
    # group 0 = samples 0 (done at once), 1 (needs 4 segments); group 1 = samples 2, 3 (short).
    eng = ScriptedEngine(lengths={0: 1, 1: 15, 2: 2, 3: 5})
    sched = _sched(eng, segments=4, max_response_len=16, group_size=2, prompts_per_step=2, max_staleness=1)
    r0 = sched.step(_prompts(2), 0)
    assert r0.unfinished == 2 and r0.experience == 2            # samples 1, 3 continue; 0, 2 wait
    r1 = sched.step([], 1)                                      # sample 1 gets version 1: staleness 1, ok
    assert r1.dropped == 0 and [[s.sample_id for s in g] for g in r1.groups] == [[2, 3]]
    assert r1.staleness_max == 1
    assert sched.prompts_wanted(policy_version=2) == 2
    r2 = sched.step([], 2)                                      # next segment would be 2 versions old
    assert (r2.dropped, r2.dropped_groups, r2.batch_rows) == (2, 1, 0)
    assert sched.unfinished == 0 and sched.experience == 0
    assert len(eng.calls) == 2                                  # no engine call for an empty batch
    assert r2.totals["dropped"] == 2 and r2.totals["released"] == 2 and r2.totals["admitted"] == 4


def test_no_staleness_limit_keeps_old_samples():
    eng = ScriptedEngine(lengths={0: 15})
    sched = _sched(eng, segments=4, max_response_len=16, group_size=1, prompts_per_step=1)
    res = [sched.step(_prompts(1) if k == 0 else [], 10 * k) for k in range(4)]
    assert res[-1].groups[0][0].staleness == 30 and res[-1].staleness_max == 30 and res[-1].dropped == 0


def test_max_unfinished_stops_admission_and_defers_prompts():
    eng = ScriptedEngine(lengths={i: 9 for i in range(20)})
    sched = _sched(eng, segments=4, max_response_len=16, group_size=2, prompts_per_step=2, max_unfinished=4)
    assert sched.prompts_wanted() == 2
    r0 = sched.step(_prompts(3), 0)                             # one more prompt than wanted
    assert r0.admitted_prompts == 2 and len(r0.deferred_prompts) == 1 and r0.unfinished == 4
    assert sched.prompts_wanted() == 0
    r1 = sched.step(_prompts(2, start=50), 0)
    assert r1.admitted == 0 and len(r1.deferred_prompts) == 2 and r1.batch_rows == 4


def test_on_segment_sees_each_decoded_sample_before_release():
    eng = ScriptedEngine(lengths={0: 2, 1: 6})
    sched = _sched(eng, segments=2, max_response_len=8, group_size=2, prompts_per_step=1)
    seen: list[list[tuple[int, int]]] = []

    def hook(batch):
        for s in batch:
            s.old_logprobs.extend([-1.0] * (s.segments[-1].end - s.segments[-1].start))
        seen.append([(s.sample_id, len(s.segments)) for s in batch])

    sched.step(_prompts(1), 0, on_segment=hook)
    r = sched.step([], 1, on_segment=hook)
    assert seen == [[(0, 1), (1, 1)], [(1, 2)]]
    assert all(len(s.old_logprobs) == s.response_len for s in r.groups[0])


def test_request_seeds_depend_on_sample_and_segment_only():
    eng = ScriptedEngine(lengths={0: 9, 1: 9})
    sched = _sched(eng, segments=4, max_response_len=16, group_size=2, prompts_per_step=1, seed=3)
    sched.step(_prompts(1), 0)
    sched.step([], 0)
    seeds = [[q.seed for q in c] for c in eng.calls]
    assert seeds == [[request_seed(3, 0, 0), request_seed(3, 1, 0)], [request_seed(3, 0, 1), request_seed(3, 1, 1)]]
    assert len({x for row in seeds for x in row}) == 4
    assert [q.request_id for q in eng.calls[1]] == [0, 1]


class _BadEngine(ScriptedEngine):
    def __init__(self, mode: str, **kw):
        super().__init__(**kw)
        self.mode = mode

    def generate(self, requests, sampling):
        out = super().generate(requests, sampling)
        if self.mode == "raise":
            raise RuntimeError("engine down")
        if self.mode == "order":
            return out[::-1]
        if self.mode == "too_many":
            return [GenerationResult(r.request_id, r.token_ids * 20, r.logprobs * 20, "length") for r in out]
        return out


@pytest.mark.parametrize("mode", ["raise", "order", "too_many"])
def test_engine_failure_leaves_state_unchanged(mode):
    eng = _BadEngine("ok", lengths={0: 9, 1: 9, 2: 9, 3: 9})
    sched = _sched(eng, segments=4, max_response_len=16, group_size=2, prompts_per_step=1)
    sched.step(_prompts(1), 0)
    before = json.dumps(sched.state_dict(), sort_keys=True)
    eng.mode = mode
    with pytest.raises(RuntimeError):
        sched.step(_prompts(1, start=5), 0)
    assert json.dumps(sched.state_dict(), sort_keys=True) == before


def test_state_dict_round_trip_mid_flight_continues_identically():
    kw = dict(segments=4, max_response_len=16, group_size=3, prompts_per_step=2, max_staleness=2, seed=11)
    a = _sched(ScriptedEngine(max_len=24), **kw)
    for k in range(3):
        a.step(_prompts(2, start=10 * k), k)
    assert a.unfinished > 0
    state = json.loads(json.dumps(a.state_dict()))
    b = _sched(ScriptedEngine(max_len=24), **kw)
    b.load_state_dict(state)
    assert b.state_dict() == a.state_dict()
    for k in range(3, 9):
        new = _prompts(2, start=10 * k) if k < 5 else []
        ra, rb = a.step(new, k), b.step(new, k)
        assert [[s.to_dict() for s in g] for g in ra.groups] == [[s.to_dict() for s in g] for g in rb.groups]
        assert (ra.unfinished, ra.experience, ra.dropped, ra.totals) == (rb.unfinished, rb.experience, rb.dropped,
                                                                         rb.totals)
    assert a.state_dict() == b.state_dict()


def test_invalid_arguments_are_named():
    with pytest.raises(ValueError, match="segments"):
        _sched(ScriptedEngine(), segments=0)
    with pytest.raises(ValueError, match="max_staleness"):
        _sched(ScriptedEngine(), max_staleness=-1)
    sched = _sched(ScriptedEngine())
    sched.step([], 3)
    with pytest.raises(ValueError, match="backwards"):
        sched.step([], 2)


@settings(max_examples=60, deadline=None)
@given(
    segments=st.integers(1, 5),
    max_len=st.integers(5, 20),
    group_size=st.integers(1, 4),
    prompts_per_step=st.integers(0, 3),
    prompt_steps=st.integers(1, 6),
    max_staleness=st.one_of(st.none(), st.integers(0, 3)),
    max_unfinished=st.one_of(st.none(), st.integers(1, 12)),
    min_ready=st.integers(1, 3),
    lengths=st.lists(st.integers(1, 30), min_size=80, max_size=80),
)
def test_invariants_under_random_lengths(segments, max_len, group_size, prompts_per_step, prompt_steps,
                                         max_staleness, max_unfinished, min_ready, lengths):
    if segments > max_len:
        segments = max_len
    eng = ScriptedEngine(lengths=dict(enumerate(lengths)), max_len=30)
    sched = _sched(eng, segments=segments, max_response_len=max_len, group_size=group_size,
                   prompts_per_step=prompts_per_step, max_staleness=max_staleness,
                   max_unfinished=max_unfinished, min_ready_groups=min_ready)
    released: list[Sample] = []
    dropped_total = 0
    k = 0
    while k < prompt_steps or sched.unfinished:
        assert k < prompt_steps + segments + 1, "a sample outlived its segment budget"
        if k < prompt_steps and sched.next_sample_id + group_size * prompts_per_step > len(lengths):
            new = []
        else:
            new = _prompts(sched.prompts_wanted(k), start=10 * k) if k < prompt_steps else []
        r = sched.step(new, policy_version=k)
        sched.pools.check()
        assert r.batch_rows == r.carried_rows + r.admitted
        assert r.finished + r.truncated + r.continued == r.batch_rows
        assert r.unfinished <= (max_unfinished or 10**9) + group_size * prompts_per_step
        for g in r.groups:
            assert len(g) == group_size and len({s.group_id for s in g}) == 1
            released += g
        dropped_total += r.dropped
        k += 1
    ids = [s.sample_id for s in released]
    waiting = sched.pools.experience.samples()
    assert len(ids) == len(set(ids))
    assert sched.pools.admitted == len(ids) + dropped_total + len(waiting)
    assert len(waiting) < group_size * min_ready
    for s in released:
        natural = lengths[s.sample_id]
        assert s.response_len == min(natural, max_len)
        assert s.status is (SampleStatus.FINISHED if natural <= max_len else SampleStatus.TRUNCATED)
        assert len(s.segments) <= segments
        assert s.segments[0].start == 0 and s.segments[-1].end == s.response_len
        assert all(x.end == y.start for x, y in zip(s.segments, s.segments[1:]))
        assert len(s.sampling_logprobs) == s.response_len
        if max_staleness is not None:
            assert s.staleness <= max_staleness
