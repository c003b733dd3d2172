"""The simulator's pool model agrees step by step with the real SegmentScheduler.

Both see the same response lengths in the same order: the scheduler through the scripted engine
(lengths keyed by sample id), the simulator through a length source replaying the same groups.
"""

from __future__ import annotations

import numpy as np
import pytest
from fakes import ScriptedEngine

from ulorl.sim.simulator import LengthDist, LogNormalLengths, RolloutSetup, simulate
from ulorl.rollout.scheduler import PromptRequest, SegmentScheduler
from ulorl.rollout.types import SamplingParams


class _Replay(LengthDist):
    """Hands out pre-drawn groups in order."""

    def __init__(self, groups: np.ndarray) -> None:
        self.groups = groups
        self.i = 0

    def sample(self, rng, n_groups, group_size):
        out = self.groups[self.i:self.i + n_groups]
        self.i += n_groups
        return out

    def describe(self):
        return {"kind": "replay"}


@pytest.mark.parametrize("segments,regime", [(1, "static"), (2, "static"), (4, "compact"), (8, "static")])
def test_simulator_pool_dynamics_equal_the_scheduler(segments, regime):
    P, G, M, steps = 6, 4, 64, 30
    groups = np.minimum(LogNormalLengths(3.0, 0.9, rho=0.5).sample(np.random.default_rng(1), P * steps, G), 200)
    eng = ScriptedEngine(lengths={i: int(x) for i, x in enumerate(groups.reshape(-1))}, max_len=200)
    sched = SegmentScheduler(eng, segments=segments, max_response_len=M, group_size=G, prompts_per_step=P,
                             sampling=SamplingParams())
    got = []
    for k in range(steps):
        prompts = [PromptRequest(prompt_ids=[50 + k, 7, 8]) for _ in range(P)]
        r = sched.step(prompts, policy_version=k)
        st = eng.last_stats
        got.append([r.batch_rows, r.unfinished, r.finished + r.truncated, r.truncated, st.decode_iterations,
                    st.useful_tokens, st.prefill_tokens, len(r.groups)])
    tr = simulate(RolloutSetup(M, segments, P, G, regime, prompt_len=3, context="row"), _Replay(groups),
                  steps=steps, warmup=0)
    want = np.stack([tr.batch_rows, tr.unfinished, tr.completed, tr.truncated, tr.features[:, 0],
                     tr.useful_tokens, tr.features[:, 3], tr.released_groups], axis=1)
    assert np.array_equal(np.asarray(got), want)
    if regime == "static":      # the scripted engine reports static row-slots (rows x iterations)
        assert tr.features[:, 1].tolist() == [r[0] * r[4] for r in got]
