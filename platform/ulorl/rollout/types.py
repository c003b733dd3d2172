"""Rollout records and the engine protocol shared by the scheduler and every engine.

Nothing here imports torch or a model: the segment scheduler is pure Python over ``Engine``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Protocol, runtime_checkable

PROBLEM_META_KEY = "problem"  # key of the raw problem text in a prompt's / sample's ``meta``


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
    ``group_id`` identifies the G responses of one prompt. ``meta`` carries the prompt's id and its
    raw problem text (``PROBLEM_META_KEY``; the reward reads it, see ``problem``).
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
    # MoE engines: per segment, the experts of every response token and layer, Int[tokens, layers, top_k]
    # (uint8 / int16 numpy, ulorl.rollout.routes); empty for dense models and engines that return none
    routed_experts: list[Any] = field(default_factory=list)
    status: SampleStatus = SampleStatus.DECODING
    reward: Optional[float] = None
    created_step: int = 0
    finished_step: Optional[int] = None

    @property
    def response_len(self) -> int:
        return len(self.response_ids)

    @property
    def problem(self) -> str:
        """The raw problem text this sample answers ("" when the prompt did not carry it): the reward
        uses it to map option letters to option texts, tell an ordered answer from a set and read a
        closing sentence that names the asked quantity."""
        return str(self.meta.get(PROBLEM_META_KEY) or "")

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
        if self.routed_experts:
            from ulorl.rollout.routes import encode_routes
            d["routed_experts"] = [encode_routes(r) for r in self.routed_experts]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        d = dict(d)
        d["status"] = SampleStatus(d["status"])
        d["segments"] = [SegmentSpan(**s) for s in d["segments"]]
        if d.get("routed_experts"):
            from ulorl.rollout.routes import decode_routes
            d["routed_experts"] = [decode_routes(r) for r in d["routed_experts"]]
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


def check_sampling(sampling: SamplingParams) -> None:
    """The sampling checks every engine makes before decoding: temperature > 0 (greedy included: the
    returned log-probs are ``log_softmax(logits / T)``), ``top_p`` in (0, 1], ``top_k`` -1 (off) or
    >= 0. Raises ValueError naming the setting."""
    if not sampling.temperature > 0:
        raise ValueError(f"sampling.temperature must be > 0 (greedy too: log-probs use it), got {sampling.temperature}")
    if not 0.0 < sampling.top_p <= 1.0:
        raise ValueError(f"sampling.top_p must be in (0, 1], got {sampling.top_p}")
    if sampling.top_k < -1:
        raise ValueError(f"sampling.top_k must be -1 (off) or >= 0, got {sampling.top_k}")


def request_context(request: GenerationRequest, max_model_len: Optional[int] = None) -> list[int]:
    """The tokens ``request`` decodes after, ``prompt_ids + prefix_ids``, once it passes the checks every
    engine makes: a non-empty context, ``max_new_tokens >= 0`` and, under a context limit
    (``max_model_len``, None: none), context + ``max_new_tokens`` within it. Raises ValueError naming
    the request."""
    ctx = list(request.prompt_ids) + list(request.prefix_ids)
    if not ctx:
        raise ValueError(f"request {request.request_id}: empty prompt_ids + prefix_ids")
    if request.max_new_tokens < 0:
        raise ValueError(f"request {request.request_id}: max_new_tokens must be >= 0, got {request.max_new_tokens}")
    if max_model_len is not None and len(ctx) + request.max_new_tokens > max_model_len:
        raise ValueError(f"request {request.request_id}: context {len(ctx)} + max_new_tokens {request.max_new_tokens} "
                         f"exceeds the engine's max_model_len {max_model_len}")
    return ctx


@dataclass
class GenerationResult:
    request_id: int
    token_ids: list[int]
    logprobs: list[float]                  # log_softmax(logits / T) of each sampled token
    finish_reason: Literal["eos", "length"]
    routed_experts: Optional[Any] = None   # MoE: Int[tokens, layers, top_k] numpy (ulorl.rollout.routes)


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


WeightStream = Iterable[tuple[str, Any]]
"""``(name, tensor)`` pairs of the policy, HF parameter names, consumed lazily."""


@runtime_checkable
class Engine(Protocol):
    """Everything the scheduler, the trainer, weight sync and placement ask of a rollout engine
    (hf, vllm, the Ray ``RemoteEngine``, or a scripted fake in tests).

    Optional capabilities are typed members every engine has (``EngineBase`` holds the defaults of
    an engine without them): code reads them, never probes for them.
    """

    eos_token_id: int
    policy_version: int

    @property
    def max_model_len(self) -> Optional[int]:
        """Context limit (prompt + response tokens); None: no limit. The scheduler clips requests to it."""
        ...

    @property
    def last_stats(self) -> Optional[EngineStats]:
        """Counters of the last ``generate`` call (None: none kept)."""
        ...

    @property
    def streams_weights(self) -> bool:
        """True: ``push_weights`` hands the backend's lazy weight streams to ``update_weights_from``;
        False: it sends ``state_dict_for_rollout()`` to ``update_weights`` (an in-process engine
        that shares or copies the trainer's tensors)."""
        ...

    @property
    def colocate(self) -> bool:
        """The engine shares the trainer's GPU: the trainer calls ``sleep`` before each update."""
        ...

    @property
    def asleep(self) -> bool:
        """Weights discarded by ``sleep``; the next ``update_weights*`` call wakes the engine."""
        ...

    @property
    def weight_transfer(self) -> str:
        """How weights reach the engine: 'stream' (buckets over the engine's RPC), 'nccl' or 'ipc'."""
        ...

    @property
    def tensor_parallel_size(self) -> int:
        """Processes (GPUs) one engine decodes on."""
        ...

    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[GenerationResult]:
        """Decode each request; results in the same order as requests."""
        ...

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Load new policy weights (and drop any prefix cache computed under old ones)."""
        ...

    def update_weights_streamed(self, weights: WeightStream, version: int) -> None:
        """Load new policy weights from one lazily consumed stream."""
        ...

    def update_weights_from(self, stream_factory: Callable[[], WeightStream], version: int) -> None:
        """Load new policy weights from ``stream_factory()`` (native transfer reads it twice)."""
        ...

    def sleep(self) -> None:
        """Free the engine's GPU memory until the next weight update (``colocate`` engines only)."""
        ...

    def wake(self) -> None:
        """Leave sleep without a weight update, where the engine can."""
        ...

    def close(self) -> None:
        """Stop the engine's own processes and free what it holds (idempotent)."""
        ...


class EngineBase:
    """The ``Engine`` members of an engine without the optional capabilities: no context limit,
    no counters, weights as one state dict, no colocation or sleep, nothing to close. An engine
    subclasses it and overrides what it supports."""

    eos_token_id: int
    policy_version: int = 0
    max_model_len: Optional[int] = None
    last_stats: Optional[EngineStats] = None
    streams_weights: bool = False
    colocate: bool = False
    asleep: bool = False
    weight_transfer: str = "stream"
    tensor_parallel_size: int = 1

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement update_weights")

    def update_weights_streamed(self, weights: WeightStream, version: int) -> None:
        """The whole stream collected into one state dict for ``update_weights``."""
        self.update_weights(dict(weights), version)

    def update_weights_from(self, stream_factory: Callable[[], WeightStream], version: int) -> None:
        self.update_weights_streamed(stream_factory(), version)

    def sleep(self) -> None:
        raise RuntimeError(f"{type(self).__name__} cannot sleep: it is not colocated with the trainer")

    def wake(self) -> None:
        """Nothing to do while awake; an engine asleep (weights discarded) wakes only with a weight update."""
        if self.asleep:
            raise RuntimeError(f"{type(self).__name__}.wake: the weights were discarded in sleep; push the "
                               "weights with update_weights / update_weights_streamed to wake it")

    def close(self) -> None:
        """Nothing to stop."""
