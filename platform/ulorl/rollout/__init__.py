"""Segment rollout (PAPER.md section 1): sample records, pools, the scheduler, engines.

Importing this package never imports torch or a model; engines live in ``ulorl.rollout.engines``.
"""

from ulorl.rollout.pools import ExperiencePool, PoolInvariantError, RolloutPools, UnfinishedPool, termination_status
from ulorl.rollout.scheduler import (
    PromptLike,
    PromptRequest,
    RolloutStepResult,
    SegmentScheduler,
    request_seed,
)
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
    "Engine", "EngineStats", "ExperiencePool", "GenerationRequest", "GenerationResult", "PoolInvariantError",
    "PromptLike", "PromptRequest", "RolloutPools", "RolloutStepResult", "Sample", "SampleStatus",
    "SamplingParams", "SegmentScheduler", "SegmentSpan", "UnfinishedPool", "request_seed", "segment_length",
    "termination_status",
]
