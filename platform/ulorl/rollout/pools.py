"""Unfinished and experience pools of segment rollout (PAPER.md Algorithm 1, DESIGN.md decision 1).

A sample enters the system once (``RolloutPools.admit``) and leaves it exactly once: either in a
released group (``ExperiencePool.release``, ready to train) or dropped with its whole group
(``RolloutPools.drop_group``, over-stale). In between it is in exactly one place:

* ``UnfinishedPool`` — status DECODING, more segments to come;
* ``ExperiencePool`` — status FINISHED (EOS) or TRUNCATED (global max, reward 0), waiting until
  all G responses of its group are done (group gating: GRPO advantages need all G rewards).

Termination rules after a sample received a segment (``termination_status``):

1. EOS                                  -> FINISHED,  experience pool;
2. no EOS, response < global max        -> DECODING,  back to the unfinished pool;
3. no EOS, response == global max       -> TRUNCATED, experience pool, reward 0.

Ledger invariant, checked by ``RolloutPools.check`` and by the tests after every step::

    admitted == len(unfinished) + experience.num_samples + released + dropped

Everything here is plain Python; ``state_dict`` returns JSON-able data (``Sample.to_dict``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Optional

from ulorl.rollout.types import Sample, SampleStatus

__all__ = [
    "PoolInvariantError",
    "UnfinishedPool",
    "ExperiencePool",
    "RolloutPools",
    "has_mixed_rewards",
    "termination_status",
]

#: Which ready groups count toward ``min_groups`` in a release (None: every ready group).
GroupPredicate = Callable[[list[Sample]], bool]


def has_mixed_rewards(group: list[Sample]) -> bool:
    """True when the group's rewards are not all equal (a reward of None counts as 0): the groups
    that carry a learning signal, i.e. survive ``algo.dynamic_sampling``."""
    return len({float(s.reward or 0.0) for s in group}) > 1


class PoolInvariantError(RuntimeError):
    """A sample was lost, duplicated or routed to the wrong pool (a bug, never user error)."""


def termination_status(finish_reason: str, response_len: int, max_response_len: int) -> SampleStatus:
    """Route a sample after a segment: EOS wins, then the global max, else keep decoding.

    An EOS emitted as the very last allowed token counts as FINISHED, not TRUNCATED.
    """
    if finish_reason == "eos":
        return SampleStatus.FINISHED
    if response_len >= max_response_len:
        return SampleStatus.TRUNCATED
    return SampleStatus.DECODING


class UnfinishedPool:
    """Samples still decoding, in admission order (sample_id -> Sample)."""

    def __init__(self) -> None:
        self._samples: OrderedDict[int, Sample] = OrderedDict()

    def __len__(self) -> int:
        return len(self._samples)

    def __iter__(self) -> Iterator[Sample]:
        return iter(list(self._samples.values()))

    def __contains__(self, sample_id: int) -> bool:
        return sample_id in self._samples

    def add(self, sample: Sample) -> None:
        if sample.status is not SampleStatus.DECODING:
            raise PoolInvariantError(f"sample {sample.sample_id} has status {sample.status.value}, "
                                     "only DECODING samples belong in the unfinished pool")
        if sample.sample_id in self._samples:
            raise PoolInvariantError(f"sample {sample.sample_id} is already in the unfinished pool")
        self._samples[sample.sample_id] = sample

    def take_all(self) -> list[Sample]:
        """Remove and return every sample (oldest first): the carried-over part of a rollout batch."""
        out = list(self._samples.values())
        self._samples.clear()
        return out

    def remove_group(self, group_id: int) -> list[Sample]:
        """Remove and return the members of ``group_id`` still decoding."""
        ids = [sid for sid, s in self._samples.items() if s.group_id == group_id]
        return [self._samples.pop(sid) for sid in ids]

    def state_dict(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self._samples.values()]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        self._samples.clear()
        for d in state:
            self.add(Sample.from_dict(d))


class ExperiencePool:
    """Done samples (FINISHED / TRUNCATED) grouped by ``group_id`` until the group is complete.

    A group is *ready* once all ``group_size`` members are in the pool. ``release`` hands out
    ready groups oldest first (smallest group_id: groups are numbered in admission order), each
    a list of ``group_size`` samples sorted by sample_id; incomplete groups keep waiting.
    """

    def __init__(self, group_size: int) -> None:
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.group_size = group_size
        self._groups: dict[int, dict[int, Sample]] = {}

    def __len__(self) -> int:
        return self.num_samples

    @property
    def num_samples(self) -> int:
        return sum(len(g) for g in self._groups.values())

    @property
    def num_groups(self) -> int:
        """Groups with at least one member waiting (complete or not)."""
        return len(self._groups)

    def ready_group_ids(self) -> list[int]:
        return sorted(gid for gid, g in self._groups.items() if len(g) == self.group_size)

    @property
    def num_ready(self) -> int:
        return len(self.ready_group_ids())

    def samples(self) -> list[Sample]:
        return [s for gid in sorted(self._groups) for s in self._groups[gid].values()]

    def add(self, sample: Sample) -> None:
        if sample.status not in (SampleStatus.FINISHED, SampleStatus.TRUNCATED):
            raise PoolInvariantError(f"sample {sample.sample_id} has status {sample.status.value}; "
                                     "only FINISHED or TRUNCATED samples enter the experience pool")
        group = self._groups.setdefault(sample.group_id, {})
        if sample.sample_id in group:
            raise PoolInvariantError(f"sample {sample.sample_id} is already in the experience pool")
        if len(group) >= self.group_size:
            raise PoolInvariantError(f"group {sample.group_id} already holds {self.group_size} samples")
        group[sample.sample_id] = sample

    def release(self, min_groups: int = 1, max_groups: Optional[int] = None,
                counts: Optional[GroupPredicate] = None) -> list[list[Sample]]:
        """Remove and return complete groups, oldest first, if at least ``min_groups`` are ready.

        Returns ``[]`` (and releases nothing) when fewer than ``min_groups`` groups are complete.
        ``max_groups`` caps how many are released at once (the rest stay ready for next time).
        ``counts`` (e.g. :func:`has_mixed_rewards`): only ready groups it accepts count toward
        ``min_groups``; once enough do, every ready group is released (the update filters the rest).
        """
        ready = self.ready_group_ids()
        counted = ready if counts is None else [
            gid for gid in ready if counts(sorted(self._groups[gid].values(), key=lambda s: s.sample_id))]
        if len(counted) < max(1, min_groups):
            return []
        if max_groups is not None:
            ready = ready[:max_groups]
        return [sorted(self._groups.pop(gid).values(), key=lambda s: s.sample_id) for gid in ready]

    def remove_group(self, group_id: int) -> list[Sample]:
        """Remove and return the members of ``group_id`` waiting here (for a group drop)."""
        return list(self._groups.pop(group_id, {}).values())

    def state_dict(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.samples()]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        self._groups.clear()
        for d in state:
            self.add(Sample.from_dict(d))


class RolloutPools:
    """Both pools plus the ledger that proves no sample is lost or duplicated.

    Counters (cumulative, in samples unless named ``*_groups``): ``admitted``, ``finished`` (EOS
    events), ``truncated``, ``released``, ``released_groups``, ``dropped``, ``dropped_groups``.
    ``finished``/``truncated`` count completion events: a done sample whose group is dropped later
    stays counted there and is also counted in ``dropped`` (the ledger uses ``dropped`` only).
    """

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size
        self.unfinished = UnfinishedPool()
        self.experience = ExperiencePool(group_size)
        self.admitted = 0
        self.finished = 0
        self.truncated = 0
        self.released = 0
        self.released_groups = 0
        self.dropped = 0
        self.dropped_groups = 0
        # group_id -> number of members not yet released or dropped (all G are admitted together)
        self._live_groups: dict[int, int] = {}

    # -- entry -------------------------------------------------------------------------------
    def admit(self, samples: list[Sample]) -> None:
        """Register new DECODING samples (whole groups of ``group_size``) without pooling them.

        The caller decodes their first segment and then ``route``s each one.
        """
        by_group: dict[int, int] = {}
        for s in samples:
            if s.status is not SampleStatus.DECODING or s.response_ids:
                raise PoolInvariantError(f"sample {s.sample_id} is not fresh (status {s.status.value}, "
                                         f"{len(s.response_ids)} response tokens)")
            by_group[s.group_id] = by_group.get(s.group_id, 0) + 1
        for gid, n in by_group.items():
            if gid in self._live_groups:
                raise PoolInvariantError(f"group {gid} was admitted twice")
            if n != self.group_size:
                raise PoolInvariantError(f"group {gid} admitted with {n} samples, expected {self.group_size}")
        for gid, n in by_group.items():
            self._live_groups[gid] = n
        self.admitted += len(samples)

    def route(self, sample: Sample, status: SampleStatus, step: int) -> None:
        """Place a sample that just got a segment: unfinished pool or experience pool.

        Sets ``sample.status``; TRUNCATED samples get reward 0 and FINISHED ones keep the reward
        the caller's scorer set (or ``None`` if there is none).
        """
        if sample.group_id not in self._live_groups:
            raise PoolInvariantError(f"sample {sample.sample_id} of unknown or closed group {sample.group_id}")
        sample.status = status
        if status is SampleStatus.DECODING:
            self.unfinished.add(sample)
            return
        sample.finished_step = step
        if status is SampleStatus.TRUNCATED:
            sample.reward = 0.0
            self.truncated += 1
        elif status is SampleStatus.FINISHED:
            self.finished += 1
        else:
            raise PoolInvariantError(f"cannot route sample {sample.sample_id} with status {status.value}")
        self.experience.add(sample)

    # -- exits -------------------------------------------------------------------------------
    def release(self, min_groups: int = 1, max_groups: Optional[int] = None,
                counts: Optional[GroupPredicate] = None) -> list[list[Sample]]:
        groups = self.experience.release(min_groups, max_groups, counts)
        for g in groups:
            self._live_groups.pop(g[0].group_id)
            self.released += len(g)
            self.released_groups += 1
        return groups

    def drop_group(self, group_id: int, in_flight: Optional[list[Sample]] = None) -> list[Sample]:
        """Drop every remaining member of a group (status DROPPED, counted), wherever it is.

        ``in_flight`` are members currently held by the caller (taken out of the unfinished pool
        for decoding, not yet routed); they are dropped too. Returns the dropped samples.
        """
        if group_id not in self._live_groups:
            raise PoolInvariantError(f"group {group_id} is not live (already released or dropped)")
        members = self.unfinished.remove_group(group_id) + self.experience.remove_group(group_id)
        members += [s for s in (in_flight or []) if s.group_id == group_id]
        expected = self._live_groups.pop(group_id)
        if len(members) != expected:
            raise PoolInvariantError(f"group {group_id}: found {len(members)} live members, expected {expected}")
        for s in members:
            s.status = SampleStatus.DROPPED
        self.dropped += len(members)
        self.dropped_groups += 1
        return members

    # -- checks ------------------------------------------------------------------------------
    @property
    def live_groups(self) -> dict[int, int]:
        return dict(self._live_groups)

    def check(self, in_flight: int = 0) -> None:
        """Raise ``PoolInvariantError`` unless the ledger adds up.

        ``in_flight``: samples the caller holds outside both pools at the moment of the check.
        """
        held = len(self.unfinished) + self.experience.num_samples + in_flight
        if self.admitted != held + self.released + self.dropped:
            raise PoolInvariantError(
                f"ledger broken: admitted {self.admitted} != unfinished {len(self.unfinished)} + "
                f"experience {self.experience.num_samples} + in flight {in_flight} + released "
                f"{self.released} + dropped {self.dropped}")
        if sum(self._live_groups.values()) != held:
            raise PoolInvariantError(f"live group members {sum(self._live_groups.values())} != held {held}")
        ids = [s.sample_id for s in self.unfinished] + [s.sample_id for s in self.experience.samples()]
        if len(ids) != len(set(ids)):
            raise PoolInvariantError("a sample is in both pools")

    def counters(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in (
            "admitted", "finished", "truncated", "released", "released_groups", "dropped", "dropped_groups")}

    def state_dict(self) -> dict[str, Any]:
        return {
            "group_size": self.group_size,
            "unfinished": self.unfinished.state_dict(),
            "experience": self.experience.state_dict(),
            "counters": self.counters(),
            "live_groups": [[gid, n] for gid, n in self._live_groups.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["group_size"] != self.group_size:
            raise ValueError(f"checkpoint group_size {state['group_size']} != configured {self.group_size}")
        self.unfinished.load_state_dict(state["unfinished"])
        self.experience.load_state_dict(state["experience"])
        for k, v in state["counters"].items():
            setattr(self, k, int(v))
        self._live_groups = {int(g): int(n) for g, n in state["live_groups"]}
        self.check()
