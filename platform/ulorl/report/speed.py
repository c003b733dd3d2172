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
* **Wall and CPU seconds.** On a shared machine the wall time of a step depends on what else ran at that
  moment: an S = 4 trial under load 7 against an S = 1 reference on an idle machine compares moments, not
  schedules. Each step therefore also logs the trainer process's CPU seconds (``time/step_cpu_s``, all its
  threads; ``time/eval_cpu_s`` at evaluation steps, left out like ``time/eval_s``) and the 1-minute load
  average at its end (``sys/load1``). A speedup is computed from both; the **shown** figure is the CPU
  one when both sides logged CPU seconds (runs from before these metrics: the wall one), and every line
  says which it shows and the mean load each side ran under.

  CPU seconds leave out work outside the trainer process (reward worker processes, an engine in a Ray
  actor): compare CPU figures only between runs whose engine ran in the same place.

Pure functions over ``{step: value}`` maps; no MLflow here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from ulorl.tracking import schema

# Metrics the rule reads (every one optional except time/step_s).
STEP_TIME, EVAL_TIME, TRAINED, FINISHED = "time/step_s", "time/eval_s", "train/samples", "rollout/finished"
STEP_CPU, EVAL_CPU, LOAD = schema.STEP_CPU_METRIC, schema.EVAL_CPU_METRIC, schema.LOAD_METRIC
SPEED_METRICS: tuple[str, ...] = (STEP_TIME, EVAL_TIME, TRAINED, FINISHED, STEP_CPU, EVAL_CPU, LOAD)
SHOWN_TEXT = {"cpu": "CPU seconds of the trainer process (fair under changing load)",
              "wall": "wall time (no CPU seconds logged: runs of different moments may differ in load)"}

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
    median_step_cpu_s: float = math.nan     # NaN: the run logged no time/step_cpu_s in its window
    trained_per_cpu_s: float = math.nan     # trained samples per CPU second of the trainer process
    load: float = math.nan                  # mean sys/load1 over the window


def run_speed(step_s: Mapping[int, float], segments: int, trained: Optional[Mapping[int, float]] = None,
              finished: Optional[Mapping[int, float]] = None, eval_s: Optional[Mapping[int, float]] = None,
              step_cpu_s: Optional[Mapping[int, float]] = None, eval_cpu_s: Optional[Mapping[int, float]] = None,
              load: Optional[Mapping[int, float]] = None) -> Optional[RunSpeed]:
    """Speed of one run over the steps after its first ``segments`` (0: every step).

    Args:
        step_s: step -> ``time/step_s``; trained / finished: step -> ``train/samples`` /
            ``rollout/finished``; eval_s: step -> ``time/eval_s`` (subtracted from that step's time).
        step_cpu_s / eval_cpu_s: step -> ``time/step_cpu_s`` / ``time/eval_cpu_s`` (the same rule in CPU
            seconds; NaN figures unless every window step logged ``time/step_cpu_s``).
        load: step -> ``sys/load1`` (its mean over the window steps that logged it).
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
    n_trained, trained_rate = rate(trained)
    cpu_med, trained_cpu = math.nan, math.nan
    if step_cpu_s and all(st in step_cpu_s for st in times):
        ev_cpu = eval_cpu_s or {}
        cpu = {st: max(0.0, step_cpu_s[st] - ev_cpu.get(st, 0.0)) for st in times}
        cpu_med, cpu_total = statistics.median(cpu.values()), sum(cpu.values())
        trained_cpu = n_trained / cpu_total if trained and cpu_total > 0 else math.nan
    loads = [load[st] for st in times if load and st in load]
    return RunSpeed(steps=len(times), first_step=min(times), median_step_s=statistics.median(times.values()),
                    total_s=total, finished=fin, trained_per_s=trained_rate, finished_per_s=fin_rate,
                    median_step_cpu_s=cpu_med, trained_per_cpu_s=trained_cpu,
                    load=sum(loads) / len(loads) if loads else math.nan)


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
    cpu_step_s: float = math.nan
    reference_cpu_step_s: float = math.nan
    trained_per_cpu_s: float = math.nan
    reference_trained_per_cpu_s: float = math.nan
    load: float = math.nan
    reference_load: float = math.nan

    @property
    def step_speedup(self) -> float:
        """time(S=1) / time(S): above 1 when S is faster per step."""
        return self.reference_step_s / self.step_s if self.step_s > 0 else math.nan

    @property
    def throughput_x(self) -> float:
        """trained samples/s at S over that at S = 1."""
        ok = self.reference_trained_per_s > 0 and math.isfinite(self.trained_per_s)
        return self.trained_per_s / self.reference_trained_per_s if ok else math.nan

    @property
    def cpu_step_speedup(self) -> float:
        """CPU s/step at S = 1 over that at S (NaN when either side logged no CPU seconds)."""
        return _ratio(self.reference_cpu_step_s, self.cpu_step_s)

    @property
    def cpu_throughput_x(self) -> float:
        """Trained samples per CPU second at S over that at S = 1."""
        return _ratio(self.trained_per_cpu_s, self.reference_trained_per_cpu_s)

    @property
    def shown(self) -> str:
        """``"cpu"`` when both sides logged CPU seconds, else ``"wall"``: the figure lines lead with."""
        return "cpu" if math.isfinite(self.cpu_step_speedup) else "wall"

    @property
    def shown_step_speedup(self) -> float:
        return self.cpu_step_speedup if self.shown == "cpu" else self.step_speedup

    @property
    def shown_throughput_x(self) -> float:
        return self.cpu_throughput_x if self.shown == "cpu" else self.throughput_x


def _ratio(a: float, b: float) -> float:
    return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else math.nan


def speedup(reference: Sequence[RunSpeed], others: Sequence[RunSpeed], segments: int, batching: str) -> Speedup:
    """The cell ``others`` (S = ``segments``) against ``reference`` (S = 1), same batching."""
    def med(runs: Sequence[RunSpeed], key: str) -> float:
        return median_of([getattr(r, key) for r in runs])

    return Speedup(segments=segments, batching=batching, runs=len(others), reference_runs=len(reference),
                   step_s=med(others, "median_step_s"), reference_step_s=med(reference, "median_step_s"),
                   trained_per_s=med(others, "trained_per_s"), reference_trained_per_s=med(reference, "trained_per_s"),
                   cpu_step_s=med(others, "median_step_cpu_s"),
                   reference_cpu_step_s=med(reference, "median_step_cpu_s"),
                   trained_per_cpu_s=med(others, "trained_per_cpu_s"),
                   reference_trained_per_cpu_s=med(reference, "trained_per_cpu_s"),
                   load=med(others, "load"), reference_load=med(reference, "load"))


def _num(v: float, fmt: str) -> str:
    return format(v, fmt) if math.isfinite(v) else "-"


def load_text(sp: Speedup) -> str:
    """``load 7.4 vs 1.1`` (mean 1-minute load average over each side's window; ``-`` where not logged)."""
    return f"load {_num(sp.load, '.1f')} vs {_num(sp.reference_load, '.1f')}"


def speedup_line(sp: Speedup) -> str:
    """``speedup S=4 vs S=1 (compact batching, ...), shown: CPU seconds ...: CPU s/step 1.62 vs 1.70 = 1.05x;
    ...; wall time/step 0.81 s vs 0.58 s = 0.71x; ... under load 7.4 vs 1.1 (median over 3 run(s) vs 1)``.
    The shown figure leads; the other one follows, with the load each side ran under."""
    trained = (f"; trained samples/s {_num(sp.trained_per_s, '.1f')} vs {_num(sp.reference_trained_per_s, '.1f')}"
               f" = {_num(sp.throughput_x, '.2f')}x") if math.isfinite(sp.throughput_x) else ""
    wall = (f"wall time/step {_num(sp.step_s, '.3f')} s vs {_num(sp.reference_step_s, '.3f')} s = "
            f"{_num(sp.step_speedup, '.2f')}x{trained}")
    head = f"speedup S={sp.segments} vs S=1 ({sp.batching} batching, {WINDOW_TEXT}), shown: {SHOWN_TEXT[sp.shown]}: "
    tail = f" under {load_text(sp)} (median over {sp.runs} run(s) vs {sp.reference_runs})"
    if sp.shown == "wall":
        return head + wall + tail
    per_cpu = (f"; trained samples per CPU s {_num(sp.trained_per_cpu_s, '.2f')} vs "
               f"{_num(sp.reference_trained_per_cpu_s, '.2f')} = {_num(sp.cpu_throughput_x, '.2f')}x"
               ) if math.isfinite(sp.cpu_throughput_x) else ""
    return (head + f"CPU s/step {_num(sp.cpu_step_s, '.3f')} vs {_num(sp.reference_cpu_step_s, '.3f')} = "
            f"{_num(sp.cpu_step_speedup, '.2f')}x{per_cpu}; {wall}" + tail)


def below_one_note(sp: Speedup) -> Optional[str]:
    """One line saying why S lost to S = 1 (in the shown figure) and which command shows the other regime;
    None when it did not."""
    ratios = [r for r in (sp.shown_step_speedup, sp.shown_throughput_x) if math.isfinite(r)]
    if not ratios or min(ratios) >= 1.0:
        return None
    why = BELOW_ONE_WHY if sp.batching == "compact" else "segment overheads outweigh the tail they save here"
    return f"below 1x: {why}: {OTHER_REGIME_COMMANDS}"
