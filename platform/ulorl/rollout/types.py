"""Rollout records and the engine protocol shared by the scheduler and every engine.

Nothing here imports torch or a model: the segment scheduler is pure Python over ``Engine``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Protocol, runtime_checkable


class SampleStatus(str, enum.Enum):  # noqa: UP042 - StrEnum changes str() / format() of a member
    DECODING = "decoding"        # in the unfinished pool, more segments to come
    FINISHED = "finished"        # EOS reached
    TRUNCATED = "truncated"      # global max length reached without EOS (reward 0)
    DROPPED = "dropped"          # removed as over-stale (counted, never trained on)


@dataclass
class SegmentSpan:
    """Response tokens ``[start, end)`` decoded in one rollout step by policy ``version``."""

    start: int
    end: int
    version: int


@dataclass
class Sample:
    """One response of one prompt, possibly decoded over several steps (segments).

    ``response_ids``, ``sampling_logprobs`` and ``old_logprobs`` (SAIS: log-probs recomputed by the
    trainer at the version that generated each segment) all have one entry per response token.
    ``group_id`` identifies the G responses of one prompt.
    """

    sample_id: int
    group_id: int
    prompt_ids: list[int]
    answer: str = ""
    prompt_text: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    response_ids: list[int] = field(default_factory=list)
    sampling_logprobs: list[float] = field(default_factory=list)
    old_logprobs: list[float] = field(default_factory=list)
    segments: list[SegmentSpan] = field(default_factory=list)
    status: SampleStatus = SampleStatus.DECODING
    reward: Optional[float] = None
    created_step: int = 0
    finished_step: Optional[int] = None

    @property
    def response_len(self) -> int:
        return len(self.response_ids)

    @property
    def staleness(self) -> int:
        """Policy versions between the first and the last segment (0 for one segment)."""
        if not self.segments:
            return 0
        return self.segments[-1].version - self.segments[0].version

    @property
    def done(self) -> bool:
        return self.status is not SampleStatus.DECODING

    def token_versions(self) -> list[int]:
        """Policy version that generated each response token, [T]."""
        out: list[int] = []
        for seg in self.segments:
            out.extend([seg.version] * (seg.end - seg.start))
        return out

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["status"] = self.status.value
        d["segments"] = [s.__dict__.copy() for s in self.segments]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        d = dict(d)
        d["status"] = SampleStatus(d["status"])
        d["segments"] = [SegmentSpan(**s) for s in d["segments"]]
        return cls(**d)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings. ``top_k=-1`` and ``top_p=1.0`` mean off."""

    temperature: float = 0.85
    top_p: float = 1.0
    top_k: int = -1
    greedy: bool = False
    seed: int = 0


@dataclass
class GenerationRequest:
    """Decode up to ``max_new_tokens`` after ``prompt_ids + prefix_ids`` (token ids, never text).

    ``prefix_ids`` are response tokens from earlier segments; they are re-prefilled under the
    engine's current weights. ``seed`` makes the request's random draws reproducible.
    """

    request_id: int
    prompt_ids: list[int]
    prefix_ids: list[int]
    max_new_tokens: int
    seed: int = 0


@dataclass
class GenerationResult:
    request_id: int
    token_ids: list[int]
    logprobs: list[float]                  # log_softmax(logits / T) of each sampled token
    finish_reason: Literal["eos", "length"]


@dataclass
class EngineStats:
    """Per-call counters an engine may fill for benchmarks (all optional)."""

    decode_iterations: int = 0
    row_slots: int = 0          # rows x iterations actually computed
    useful_tokens: int = 0      # tokens that belong to a result
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    batch_rows: int = 0


@runtime_checkable
class Engine(Protocol):
    """What the scheduler needs from a rollout engine (hf, vllm, or a scripted fake in tests)."""

    eos_token_id: int
    policy_version: int

    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[GenerationResult]:
        """Decode each request; results in the same order as requests."""
        ...

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Load new policy weights (and drop any prefix cache computed under old ones)."""
        ...
