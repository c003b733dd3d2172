"""Segment rollout scheduler (PAPER.md Algorithm 1; DESIGN.md decisions 1, 2, 4, 5).

One ``SegmentScheduler.step`` is one rollout step of the paper:

1. (``max_staleness`` set) drop every group that has a member whose next segment would make it
   more than ``max_staleness`` policy versions older than its first segment. A group is dropped
   *as a whole* — GRPO needs the rewards of all G responses, so survivors of a group with a
   dropped member could never be trained on; they are counted as dropped too.
2. Admit new prompts x G (none when the unfinished pool is at or above ``max_unfinished``).
3. Build the rollout batch from EVERY unfinished sample plus the new samples and decode at most
   one segment for each with ONE ``engine.generate`` call. Segment length is
   ``ceil(max_response_len / segments)``; the last segment is clipped so a response never exceeds
   ``max_response_len``, hence a sample takes at most ``segments`` steps.
4. Append tokens, sampling log-probs and a ``SegmentSpan(version=policy_version)``; call
   ``on_segment(batch)`` (SAIS old log-probs); route by the termination rules (``pools.py``);
   score the EOS-finished samples with ``score_fn`` (truncated ones get reward 0 unscored).
5. Release the complete groups from the experience pool if at least ``min_ready_groups`` wait
   (with ``release_counts``, e.g. ``has_mixed_rewards``: if that many of them pass it).

Request seeds are a pure function of ``(seed, sample_id, segment index)``, so a run is
reproducible and a checkpoint (``state_dict``) resumes mid-flight identically. The request id of
a sample's request is its ``sample_id`` at every segment.

Nothing here imports torch or a model: the engine is anything satisfying ``ulorl.rollout.types.Engine``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, runtime_checkable

from ulorl.rollout.pools import GroupPredicate, PoolInvariantError, RolloutPools, termination_status
from ulorl.rollout.types import (
    Engine,
    EngineStats,
    GenerationRequest,
    GenerationResult,
    Sample,
    SampleStatus,
    SamplingParams,
    SegmentSpan,
)
from ulorl.segments import segment_length

__all__ = [
    "PromptLike",
    "PromptRequest",
    "RolloutStepResult",
    "SegmentScheduler",
    "request_seed",
]

ScoreFn = Callable[[list[Sample]], Optional[Sequence[float]]]
SegmentHook = Callable[[list[Sample]], None]


@runtime_checkable
class PromptLike(Protocol):
    prompt_ids: list[int]
    answer: str
    prompt_text: str
    meta: dict[str, Any]


@dataclass
class PromptRequest:
    """A tokenised prompt to roll out G times (``ulorl.data`` items are converted to this)."""

    prompt_ids: list[int]
    answer: str = ""
    prompt_text: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


def request_seed(seed: int, sample_id: int, segment_index: int) -> int:
    """Deterministic 31-bit seed of one request (stable across processes and Python versions)."""
    digest = hashlib.blake2b(f"{seed}:{sample_id}:{segment_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


@dataclass
class RolloutStepResult:
    """What one rollout step produced. Counts are for this step unless said otherwise.

    ``groups``: released complete groups (each ``group_size`` samples), ready to train.
    ``completed``: samples that became FINISHED or TRUNCATED this step (also those already
    released or dropped), for length / reward logging. ``deferred_prompts``: prompts passed in but
    not admitted (``max_unfinished`` gate or more than ``prompts_per_step``); pass them again.
    """

    step: int
    policy_version: int
    groups: list[list[Sample]]
    completed: list[Sample]
    deferred_prompts: list[Any]
    admitted_prompts: int
    admitted: int
    finished: int
    truncated: int
    continued: int
    dropped: int
    dropped_groups: int
    decoded_tokens: int
    batch_rows: int
    carried_rows: int
    unfinished: int
    experience: int
    ready_groups_waiting: int
    staleness_max: int
    engine_stats: Optional[EngineStats] = None
    totals: dict[str, int] = field(default_factory=dict)
    dropped_samples: list[Sample] = field(default_factory=list)
    clipped: int = 0   # requests clipped at the engine's context limit (finished as truncated)
    clipped_ids: frozenset[int] = frozenset()   # their sample ids (the length audit's fate "clipped")

    @property
    def released_groups(self) -> int:
        return len(self.groups)

    def metrics(self) -> dict[str, float]:
        """Flat numbers for the tracker (``pool/*`` names match ``ulorl.tracking.schema``)."""
        lens = [s.response_len for s in self.completed]
        out: dict[str, float] = {
            "pool/unfinished": self.unfinished,
            "pool/experience": self.experience,
            "pool/staleness_max": self.staleness_max,
            "rollout/finished": self.finished,
            "rollout/truncated": self.truncated,
            "rollout/tokens": self.decoded_tokens,
            "rollout/batch_rows": self.batch_rows,
            "rollout/carried_rows": self.carried_rows,
            "rollout/admitted": self.admitted,
            "rollout/dropped": self.dropped,
            "rollout/released_groups": self.released_groups,
            "rollout/context_clipped": self.clipped,
        }
        if lens:
            out["rollout/response_len_mean"] = sum(lens) / len(lens)
            out["rollout/response_len_max"] = max(lens)
        return out


class SegmentScheduler:
    """Algorithm 1 over an ``Engine``; see the module docstring for one step's stages."""

    def __init__(
        self,
        engine: Engine,
        *,
        segments: int,
        max_response_len: int,
        group_size: int,
        prompts_per_step: int,
        sampling: SamplingParams,
        min_ready_groups: int = 1,
        max_staleness: Optional[int] = None,
        max_unfinished: Optional[int] = None,
        seed: int = 0,
        release_counts: Optional[GroupPredicate] = None,
    ) -> None:
        checks = {
            "segments": (segments, segments >= 1),
            "max_response_len": (max_response_len, max_response_len >= 1),
            "group_size": (group_size, group_size >= 1),
            "prompts_per_step": (prompts_per_step, prompts_per_step >= 0),
            "min_ready_groups": (min_ready_groups, min_ready_groups >= 1),
            "max_staleness": (max_staleness, max_staleness is None or max_staleness >= 0),
            "max_unfinished": (max_unfinished, max_unfinished is None or max_unfinished >= 1),
        }
        for name, (value, ok) in checks.items():
            if not ok:
                raise ValueError(f"SegmentScheduler: invalid {name}={value!r}")
        if segments > max_response_len:
            raise ValueError(f"SegmentScheduler: segments ({segments}) > max_response_len ({max_response_len})")
        self.engine = engine
        self.segments = segments
        self.max_response_len = max_response_len
        self.segment_len = segment_length(max_response_len, segments)
        self.group_size = group_size
        self.prompts_per_step = prompts_per_step
        self.sampling = sampling
        self.min_ready_groups = min_ready_groups
        self.max_staleness = max_staleness
        self.max_unfinished = max_unfinished
        self.seed = seed
        self.release_counts = release_counts  # which ready groups count toward min_ready_groups
        self.pools = RolloutPools(group_size)
        self.step_count = 0
        self.next_sample_id = 0
        self.next_group_id = 0
        self.last_policy_version: Optional[int] = None
        self.decoded_tokens_total = 0

    # ------------------------------------------------------------------------------ queries
    @property
    def unfinished(self) -> int:
        return len(self.pools.unfinished)

    @property
    def experience(self) -> int:
        return self.pools.experience.num_samples

    def _stale_group_ids(self, policy_version: int) -> list[int]:
        if self.max_staleness is None:
            return []
        return sorted({s.group_id for s in self.pools.unfinished
                       if s.segments and policy_version - s.segments[0].version > self.max_staleness})

    def prompts_wanted(self, policy_version: Optional[int] = None) -> int:
        """New prompts the next ``step`` will admit: 0 while the unfinished pool is at or above
        ``max_unfinished`` (counted after the staleness drops ``policy_version`` would cause),
        else ``prompts_per_step``."""
        if self.max_unfinished is None:
            return self.prompts_per_step
        pool = len(self.pools.unfinished)
        if policy_version is not None:
            stale = set(self._stale_group_ids(policy_version))
            pool = sum(1 for s in self.pools.unfinished if s.group_id not in stale)
        return 0 if pool >= self.max_unfinished else self.prompts_per_step

    def max_new_tokens(self, sample: Sample) -> int:
        """Budget of the sample's next segment (clipped at the global max)."""
        return min(self.segment_len, self.max_response_len - sample.response_len)

    def context_room(self, sample: Sample) -> Optional[int]:
        """Tokens the engine can still add to ``sample`` (its ``max_model_len`` minus the context),
        None when the engine states no limit."""
        limit = self.engine.max_model_len
        if limit is None:
            return None
        return limit - len(sample.prompt_ids) - sample.response_len

    # ------------------------------------------------------------------------------ one step
    def step(
        self,
        new_prompts: Sequence[PromptLike],
        policy_version: int,
        score_fn: Optional[ScoreFn] = None,
        on_segment: Optional[SegmentHook] = None,
    ) -> RolloutStepResult:
        """Run one rollout step (module docstring). ``score_fn(finished)`` sets ``.reward`` of each
        EOS-finished sample (or returns the rewards in order); ``on_segment(batch)`` sees every
        sample that just got a segment, before routing and release.

        If the engine raises, nothing changes (no sample admitted or taken out of the pool). An
        exception from ``score_fn`` / ``on_segment`` propagates after tokens were appended: the
        scheduler should then be restored from a checkpoint.
        """
        if self.last_policy_version is not None and policy_version < self.last_policy_version:
            raise ValueError(f"policy_version went backwards: {policy_version} < {self.last_policy_version}")
        pools = self.pools
        step = self.step_count

        # 1. staleness drops (whole groups), before spending compute on them
        dropped: list[Sample] = []
        dropped_groups = 0
        for gid in self._stale_group_ids(policy_version):
            dropped += pools.drop_group(gid)
            dropped_groups += 1

        # 2. new samples (ids committed only once the engine call succeeded)
        wanted = self.prompts_wanted()
        admit, deferred = list(new_prompts[:wanted]), list(new_prompts[wanted:])
        new_samples: list[Sample] = []
        sid, gid = self.next_sample_id, self.next_group_id
        for p in admit:
            for _ in range(self.group_size):
                new_samples.append(Sample(
                    sample_id=sid, group_id=gid, prompt_ids=list(p.prompt_ids), answer=p.answer,
                    prompt_text=p.prompt_text, meta=dict(p.meta), created_step=step))
                sid += 1
            gid += 1

        # 3. one engine call over every unfinished sample plus the new ones
        carried = list(pools.unfinished)
        batch = carried + new_samples
        # safety net: never ask the engine for more than its context limit; a clipped sample
        # finishes as truncated (reward 0) after this segment. Prompts too long for the engine are
        # dropped at load, so this only catches a mis-sized engine.
        budgets: list[int] = []
        clipped_ids: set[int] = set()
        for s in batch:
            budget = self.max_new_tokens(s)
            room = self.context_room(s)
            if room is not None and room < budget:
                budget = max(room, 0)
                clipped_ids.add(s.sample_id)
            budgets.append(budget)
        requests = [GenerationRequest(
            request_id=s.sample_id, prompt_ids=list(s.prompt_ids), prefix_ids=list(s.response_ids),
            max_new_tokens=b, seed=request_seed(self.seed, s.sample_id, len(s.segments)))
            for s, b in zip(batch, budgets) if b > 0]
        got = self.engine.generate(requests, self.sampling) if requests else []
        self._check_results(requests, got)
        by_id = {r.request_id: r for r in got}
        results = [by_id.get(s.sample_id) or GenerationResult(s.sample_id, [], [], "length") for s in batch]
        stats = self.engine.last_stats if requests else None

        pools.unfinished.take_all()
        pools.admit(new_samples)
        self.next_sample_id, self.next_group_id = sid, gid

        # 4. append, hook, route, score
        decoded = 0
        for s, r in zip(batch, results):
            start = s.response_len
            s.response_ids.extend(r.token_ids)
            s.sampling_logprobs.extend(float(x) for x in r.logprobs)
            s.segments.append(SegmentSpan(start=start, end=s.response_len, version=policy_version))
            if r.routed_experts is not None and len(s.routed_experts) == len(s.segments) - 1:
                s.routed_experts.append(r.routed_experts)   # MoE: this segment's experts, beside its version
            decoded += len(r.token_ids)
        if on_segment is not None and batch:
            on_segment(batch)
        statuses = [SampleStatus.TRUNCATED
                    if s.sample_id in clipped_ids and r.finish_reason != "eos"
                    else termination_status(r.finish_reason, s.response_len, self.max_response_len)
                    for s, r in zip(batch, results)]
        finished = [s for s, st in zip(batch, statuses) if st is SampleStatus.FINISHED]
        if score_fn is not None and finished:
            rewards = score_fn(finished)
            if rewards is not None:
                if len(rewards) != len(finished):
                    raise ValueError(f"score_fn returned {len(rewards)} rewards for {len(finished)} samples")
                for s, rw in zip(finished, rewards):
                    s.reward = float(rw)
        completed: list[Sample] = []
        for s, st in zip(batch, statuses):
            pools.route(s, st, step)
            if st is not SampleStatus.DECODING:
                completed.append(s)

        # 5. release complete groups
        groups = pools.release(self.min_ready_groups, counts=self.release_counts)
        pools.check()

        self.step_count += 1
        self.last_policy_version = policy_version
        self.decoded_tokens_total += decoded
        return RolloutStepResult(
            step=step,
            policy_version=policy_version,
            groups=groups,
            completed=completed,
            deferred_prompts=deferred,
            admitted_prompts=len(admit),
            admitted=len(new_samples),
            finished=len(finished),
            truncated=sum(st is SampleStatus.TRUNCATED for st in statuses),
            continued=sum(st is SampleStatus.DECODING for st in statuses),
            dropped=len(dropped),
            dropped_groups=dropped_groups,
            decoded_tokens=decoded,
            batch_rows=len(batch),
            carried_rows=len(carried),
            unfinished=len(pools.unfinished),
            experience=pools.experience.num_samples,
            ready_groups_waiting=pools.experience.num_ready,
            staleness_max=max((s.staleness for s in batch), default=0),
            engine_stats=stats if isinstance(stats, EngineStats) else None,
            totals=pools.counters(),
            dropped_samples=dropped,
            clipped=len(clipped_ids),
            clipped_ids=frozenset(clipped_ids),
        )

    def _check_results(self, requests: list[GenerationRequest], results: list[GenerationResult]) -> None:
        if len(results) != len(requests):
            raise RuntimeError(f"engine returned {len(results)} results for {len(requests)} requests")
        for q, r in zip(requests, results):
            if r.request_id != q.request_id:
                raise RuntimeError(f"engine returned request_id {r.request_id} where {q.request_id} was "
                                   "expected (results must be in request order)")
            n = len(r.token_ids)
            if n != len(r.logprobs):
                raise RuntimeError(f"request {q.request_id}: {n} tokens but {len(r.logprobs)} log-probs")
            if not 1 <= n <= q.max_new_tokens:
                raise RuntimeError(f"request {q.request_id}: engine returned {n} tokens, "
                                   f"allowed 1..{q.max_new_tokens}")
            if r.finish_reason not in ("eos", "length"):
                raise RuntimeError(f"request {q.request_id}: unknown finish_reason {r.finish_reason!r}")

    # ------------------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: both pools (in-flight samples), ledger, ids, step and version."""
        return {
            "config": {"segments": self.segments, "max_response_len": self.max_response_len,
                       "group_size": self.group_size, "seed": self.seed},
            "pools": self.pools.state_dict(),
            "step_count": self.step_count,
            "next_sample_id": self.next_sample_id,
            "next_group_id": self.next_group_id,
            "last_policy_version": self.last_policy_version,
            "decoded_tokens_total": self.decoded_tokens_total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict``. ``group_size`` must match; a different ``segments`` /
        ``max_response_len`` is allowed only if no sample in flight already exceeds the new max."""
        cfg = state["config"]
        if cfg["group_size"] != self.group_size:
            raise ValueError(f"checkpoint group_size {cfg['group_size']} != configured {self.group_size}")
        pools = RolloutPools(self.group_size)
        pools.load_state_dict(state["pools"])
        too_long = [s.sample_id for s in pools.unfinished if s.response_len >= self.max_response_len]
        if too_long:
            raise PoolInvariantError(f"samples {too_long[:5]} already reach max_response_len "
                                     f"{self.max_response_len} of this scheduler")
        self.pools = pools
        self.step_count = int(state["step_count"])
        self.next_sample_id = int(state["next_sample_id"])
        self.next_group_id = int(state["next_group_id"])
        lpv = state.get("last_policy_version")
        self.last_policy_version = None if lpv is None else int(lpv)
        self.decoded_tokens_total = int(state.get("decoded_tokens_total", 0))
