"""Admission-cohort rollout reward: the mean reward of all samples admitted at one step.

Why. Under segment rollout the per-step mean over *completed* samples (``rollout/reward_mean``) is
biased by finish order: in the first steps only short responses can finish, and on a long-tailed
task short responses are the easy ones, so the early steps look better than steady state and a
learning curve built from them can fall while the policy improves. A cohort (every sample
admitted at step k, i.e. prompts x G) is reported once its last sample has completed, at step k,
so every point averages short and long responses alike. It lags by up to S - 1 steps; cohorts
still decoding when a run ends are not reported.

Pure bookkeeping (no I/O); the trainer checkpoints it with ``state_dict``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["CohortRewards", "ClosedCohort"]


@dataclass(frozen=True)
class ClosedCohort:
    """A cohort whose samples have all completed (EOS, truncated or dropped)."""

    step: int
    reward_mean: float        # over scored samples (truncated count as 0; dropped are excluded)
    response_len_mean: float
    samples: int              # scored samples


@dataclass
class _Open:
    admitted: int
    done: int = 0
    scored: int = 0
    reward_sum: float = 0.0
    len_sum: int = 0


@dataclass
class CohortRewards:
    """Counts per admission step until every admitted sample is accounted for."""

    open: dict[int, _Open] = field(default_factory=dict)

    def admit(self, step: int, n: int) -> None:
        if n <= 0:
            return
        if step in self.open:
            raise ValueError(f"cohort of step {step} admitted twice")
        self.open[step] = _Open(admitted=n)

    def complete(self, step: int, reward: Optional[float], response_len: int) -> None:
        """One sample of cohort ``step`` left the rollout; ``reward=None`` for a dropped sample."""
        c = self.open.get(step)
        if c is None:
            raise KeyError(f"no open cohort for step {step}")
        c.done += 1
        if c.done > c.admitted:
            raise ValueError(f"cohort of step {step}: {c.done} samples done of {c.admitted} admitted")
        if reward is not None:
            c.scored += 1
            c.reward_sum += float(reward)
            c.len_sum += int(response_len)

    def pop_closed(self) -> list[ClosedCohort]:
        """Cohorts with every sample done (oldest first), removed from the open set."""
        out = []
        for step in sorted(self.open):
            c = self.open[step]
            if c.done == c.admitted:
                del self.open[step]
                if c.scored:
                    out.append(ClosedCohort(step, c.reward_sum / c.scored, c.len_sum / c.scored, c.scored))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {str(k): [c.admitted, c.done, c.scored, c.reward_sum, c.len_sum] for k, c in self.open.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.open = {int(k): _Open(int(a), int(d), int(s), float(r), int(n)) for k, (a, d, s, r, n) in state.items()}
