"""Rollout speed of training runs over the steady window: the one rule that Table 1
(``ulorl-tables``), the dashboard's Speedup page and the sweep summary share.

* **Steady window**: the steps after a run's first S (its ``rollout.segments``). With S segments a
  response admitted at step k can finish as late as step k + S - 1, so the pools (and the samples
  trained per step) settle only after S steps; timing the warm-up flatters large S.
* **Step time** in the window is ``time/step_s`` minus the held-out evaluation of that step
  (``time/eval_s``, logged only at evaluation steps): the evaluation is the same work at every S.
* **Per run**: median step time, and trained (``train/samples``) and finished (``rollout/finished``)
  samples per second = samples summed / step time summed over the window.
* **Across runs** of one (batching, S) cell (seeds, trials): the median of the per-run values; a
  speedup compares cells of the same batching, ``time(S=1) / time(S)`` and ``rate(S) / rate(S=1)``.

Pure functions over ``{step: value}`` maps; no MLflow here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

# Metrics the rule reads (every one optional except time/step_s).
STEP_TIME, EVAL_TIME, TRAINED, FINISHED = "time/step_s", "time/eval_s", "train/samples", "rollout/finished"
SPEED_METRICS: tuple[str, ...] = (STEP_TIME, EVAL_TIME, TRAINED, FINISHED)

WINDOW_TEXT = "steady window: the steps after each run's first S, held-out evaluation time left out"
# Why S > 1 can lose on a CPU, and where the other regime is shown (the sweep summary and the
# Speedup page print it under a ratio below 1).
BELOW_ONE_WHY = ("compaction on a CPU removes the tail that segments save; the static regime and the "
                 "simulator show the GPU-like case")
OTHER_REGIME_COMMANDS = "ulorl-sweep sweeps/segments.yaml (static rows, then ulorl-tables)   or   ulorl-sim paper"


def steady_window(steps: Sequence[int], values: Sequence[float], segments: int) -> list[tuple[int, float]]:
    """(step, value) pairs after the first ``segments`` steps.
    ``steady_window([1, 2, 3], [9, 1, 2], 1) == [(2, 1), (3, 2)]``."""
    return [(st, v) for st, v in zip(steps, values) if st > segments]


@dataclass(frozen=True)
class RunSpeed:
    """One run's speed over its window. ``trained_per_s`` / ``finished_per_s`` are NaN when the run
    did not log the metric."""

    steps: int
    first_step: int
    median_step_s: float
    total_s: float
    finished: float
    trained_per_s: float
    finished_per_s: float


def run_speed(step_s: Mapping[int, float], segments: int, trained: Optional[Mapping[int, float]] = None,
              finished: Optional[Mapping[int, float]] = None, eval_s: Optional[Mapping[int, float]] = None,
              ) -> Optional[RunSpeed]:
    """Speed of one run over the steps after its first ``segments`` (0: every step).

    Args:
        step_s: step -> ``time/step_s``; trained / finished: step -> ``train/samples`` /
            ``rollout/finished``; eval_s: step -> ``time/eval_s`` (subtracted from that step's time).
    Returns:
        None when no step falls in the window.
    """
    window = steady_window(sorted(step_s), [step_s[s] for s in sorted(step_s)], segments)
    if not window:
        return None
    ev = eval_s or {}
    times = {st: max(0.0, v - ev.get(st, 0.0)) for st, v in window}
    total = sum(times.values())

    def rate(counts: Optional[Mapping[int, float]]) -> tuple[float, float]:
        if not counts:
            return math.nan, math.nan
        n = sum(counts.get(st, 0.0) for st in times)
        return n, (n / total if total > 0 else math.nan)

    fin, fin_rate = rate(finished)
    _, trained_rate = rate(trained)
    return RunSpeed(steps=len(times), first_step=min(times), median_step_s=statistics.median(times.values()),
                    total_s=total, finished=fin, trained_per_s=trained_rate, finished_per_s=fin_rate)


def median_of(values: Sequence[float]) -> float:
    """Median of the finite values (the across-runs rule); NaN when none."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(vals) if vals else math.nan


@dataclass(frozen=True)
class Speedup:
    """S against the S = 1 reference of the same batching (medians over each cell's runs)."""

    segments: int
    batching: str
    runs: int
    reference_runs: int
    step_s: float
    reference_step_s: float
    trained_per_s: float
    reference_trained_per_s: float

    @property
    def step_speedup(self) -> float:
        """time(S=1) / time(S): above 1 when S is faster per step."""
        return self.reference_step_s / self.step_s if self.step_s > 0 else math.nan

    @property
    def throughput_x(self) -> float:
        """trained samples/s at S over that at S = 1."""
        ok = self.reference_trained_per_s > 0 and math.isfinite(self.trained_per_s)
        return self.trained_per_s / self.reference_trained_per_s if ok else math.nan


def speedup(reference: Sequence[RunSpeed], others: Sequence[RunSpeed], segments: int, batching: str) -> Speedup:
    """The cell ``others`` (S = ``segments``) against ``reference`` (S = 1), same batching."""
    return Speedup(segments=segments, batching=batching, runs=len(others), reference_runs=len(reference),
                   step_s=median_of([r.median_step_s for r in others]),
                   reference_step_s=median_of([r.median_step_s for r in reference]),
                   trained_per_s=median_of([r.trained_per_s for r in others]),
                   reference_trained_per_s=median_of([r.trained_per_s for r in reference]))


def speedup_line(sp: Speedup) -> str:
    """``speedup S=4 vs S=1 (compact batching, ...): time/step 0.81 s vs 0.58 s = 0.71x; ...``."""
    def num(v: float, fmt: str) -> str:
        return format(v, fmt) if math.isfinite(v) else "-"

    trained = (f"; trained samples/s {num(sp.trained_per_s, '.1f')} vs {num(sp.reference_trained_per_s, '.1f')}"
               f" = {num(sp.throughput_x, '.2f')}x") if math.isfinite(sp.throughput_x) else ""
    return (f"speedup S={sp.segments} vs S=1 ({sp.batching} batching, {WINDOW_TEXT}): time/step "
            f"{num(sp.step_s, '.3f')} s vs {num(sp.reference_step_s, '.3f')} s = {num(sp.step_speedup, '.2f')}x"
            f"{trained} (median over {sp.runs} run(s) vs {sp.reference_runs})")


def below_one_note(sp: Speedup) -> Optional[str]:
    """One line saying why S lost to S = 1 and which command shows the other regime; None when it did not."""
    ratios = [r for r in (sp.step_speedup, sp.throughput_x) if math.isfinite(r)]
    if not ratios or min(ratios) >= 1.0:
        return None
    why = BELOW_ONE_WHY if sp.batching == "compact" else "segment overheads outweigh the tail they save here"
    return f"below 1x: {why}: {OTHER_REGIME_COMMANDS}"
