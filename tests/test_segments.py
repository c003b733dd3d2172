"""The segment length (PAPER.md section 1): one function, ``ceil(L / S)``, used by the config, the
scheduler and the rollout simulator."""

from __future__ import annotations

import pytest
from fakes import ScriptedEngine

from ulorl.config import RolloutConfig
from ulorl.sim.simulator import RolloutSetup
from ulorl.rollout.scheduler import PromptRequest, SegmentScheduler
from ulorl.rollout.types import SamplingParams
from ulorl.segments import segment_length


@pytest.mark.parametrize(("L", "S", "expected"), [
    (16, 4, 4),    # S | L: 16 / 4
    (10, 3, 4),    # 4 + 4 + 2 fits in 3 segments; floor (3) would need a 4th
    (11, 4, 3),    # 3 + 3 + 3 + 2
    (5, 5, 1),
    (1, 1, 1),
    (7, 1, 7),     # one segment: the whole response (TOIS)
])
def test_segment_length_is_ceiling(L: int, S: int, expected: int) -> None:
    assert segment_length(L, S) == expected


@pytest.mark.parametrize(("L", "S"), [(0, 1), (8, 0), (-4, 2)])
def test_segment_length_refuses_non_positive_arguments(L: int, S: int) -> None:
    with pytest.raises(ValueError, match="max_response_len >= 1 and segments >= 1"):
        segment_length(L, S)


def test_config_scheduler_and_simulator_agree_where_floor_would_not() -> None:
    # A bare RolloutConfig skips the experiment's divisibility check; 10 // 3 = 3 would differ.
    cfg = RolloutConfig(max_response_len=10, segments=3)
    sched = SegmentScheduler(ScriptedEngine(), segments=3, max_response_len=10, group_size=1,
                             prompts_per_step=1, sampling=SamplingParams())
    setup = RolloutSetup(max_len=10, segments=3, prompts_per_step=1, group_size=1)
    assert cfg.segment_len == sched.segment_len == setup.segment_len == 4


def test_scheduler_decodes_ceil_sized_segments_and_clips_the_last() -> None:
    engine = ScriptedEngine(lengths={0: 100})      # never reaches EOS within the 10-token budget
    sched = SegmentScheduler(engine, segments=3, max_response_len=10, group_size=1, prompts_per_step=1,
                             sampling=SamplingParams())
    sched.step([PromptRequest(prompt_ids=[5, 6], answer="1")], policy_version=0)
    for _ in range(4):
        sched.step([], policy_version=0)
    budgets = [q.max_new_tokens for call in engine.calls for q in call]
    assert budgets == [4, 4, 2]                    # at most S = 3 segments, 10 tokens in all

