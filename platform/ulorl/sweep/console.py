"""The console of ``ulorl-sweep``: one compact view of the sweep's trials while it runs.

On a terminal it is a live table, redrawn in place: a line per trial (role, swept values,
step / total, latest held-out score, status) under the sweep's progress and estimated time left.
Anywhere else (CI, a pipe, a file) it prints one plain line each time a trial changes state
(started, retrying, finished, failed) and nothing on refresh, so a piped log stays short.

:class:`SweepView` holds the state and is fed events by ``ulorl.sweep.tune_events`` (Ray Tune
callbacks) or by a test's script; it knows nothing about Ray.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional, TextIO

PENDING, RUNNING, RETRYING, FINISHED, FAILED = "pending", "running", "retrying", "finished", "failed"
PRUNED = "pruned"   # stopped early by the sweep's scheduler (ulorl.sweep.prune): done, its remaining steps never run
FINAL = (FINISHED, FAILED, PRUNED)


@dataclass
class TrialLine:
    """One trial as the view shows it."""

    key: str                     # Tune's trial id
    role: str                    # search / baseline / rerun / reference
    values: str                  # short swept values, e.g. "tau=0.9 sigma=0.093"
    total: int                   # planned steps
    step: int = 0
    heldout: Optional[float] = None   # latest value of the sweep's metric (held-out avg@k by default)
    status: str = PENDING
    retries: int = 0

    def label(self) -> str:
        return f"{self.role} {self.values}".strip()


def fmt_duration(seconds: float) -> str:
    """``75 -> '1m15s'``, ``3700 -> '1h01m'``, ``9 -> '9s'``."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class SweepView:
    """State of a sweep's trials, printed live (terminal) or as state-change lines (elsewhere).

    ``planned``: how many trials the sweep will run in all (search + baseline + re-runs +
    references); trials not yet created count as pending in the progress line.
    """

    def __init__(self, name: str, planned: int, steps_per_trial: int, metric: str, out: TextIO,
                 live: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.planned = planned
        self.steps_per_trial = max(1, int(steps_per_trial))
        self.metric = metric
        self.metric_label = "held-out" if metric.startswith("eval/heldout/") else metric.rsplit("/", 1)[-1]
        self.out = out
        self.clock = clock
        self.t0 = clock()
        self.t_running: Optional[float] = None   # when the first trial started (set-up before it is not trial work)
        self.trials: dict[str, TrialLine] = {}
        self.live_enabled = live
        self._live: Any = None

    # ------------------------------------------------------------------ events
    def start(self) -> None:
        """Print the header (plain) or open the live display (terminal)."""
        if self.live_enabled:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.out, force_terminal=True)
            self._live = Live(self, console=console, refresh_per_second=1, transient=False,
                              redirect_stdout=False, redirect_stderr=False)
            self._live.start()
        else:
            self._say(f"sweep {self.name}: {self.planned} trials of {self.steps_per_trial} steps")

    def started(self, key: str, role: str, values: str) -> None:
        t = self.trials.get(key)
        if t is None:
            t = self.trials[key] = TrialLine(key, role, values, self.steps_per_trial)
        elif t.status == RUNNING:
            return
        was = t.status
        t.status = RUNNING
        if self.t_running is None:
            self.t_running = self.clock()
        self._event(t, "resumed from its checkpoint" if was == RETRYING else "started")

    def result(self, key: str, step: Optional[int], heldout: Optional[float]) -> None:
        t = self.trials.get(key)
        if t is None:
            return
        if step is not None:
            t.step = max(t.step, int(step))
        if heldout is not None and math.isfinite(heldout):
            t.heldout = float(heldout)
        self._refresh()

    def retrying(self, key: str, error: str = "") -> None:
        t = self.trials.get(key)
        if t is None:
            return
        t.status, t.retries = RETRYING, t.retries + 1
        self._event(t, f"failed at step {t.step}, retry {t.retries} from its checkpoint"
                    + (f" ({error})" if error else ""))

    def finished(self, key: str) -> None:
        t = self.trials.get(key)
        if t is None or t.status == FINISHED:
            return
        t.status = FINISHED
        t.step = max(t.step, t.total)
        self._event(t, "finished" + (f", {self.metric_label} {t.heldout:.3f}" if t.heldout is not None else ""))

    def pruned(self, key: str, reason: str, step: int) -> None:
        t = self.trials.get(key)
        if t is None or t.status == PRUNED:
            return
        t.status = PRUNED
        self._event(t, f"pruned at step {step} ({reason})"
                    + (f", {self.metric_label} {t.heldout:.3f}" if t.heldout is not None else ""))

    def failed(self, key: str, error: str = "") -> None:
        t = self.trials.get(key)
        if t is None:
            return
        t.status = FAILED
        self._event(t, f"FAILED at step {t.step}" + (f": {error}" if error else ""))

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        else:
            self._say(self.progress_text())

    # ------------------------------------------------------------------ reading
    def unfinished(self) -> list[TrialLine]:
        """Trials created but neither finished nor failed for good."""
        return [t for t in self.trials.values() if t.status not in FINAL]

    def not_created(self) -> int:
        return max(0, self.planned - len(self.trials))

    def progress_text(self) -> str:
        """``sweep mpt_threshold: 3/8 trials done, 57/160 steps, 2m10s elapsed, about 3m40s left``: the
        steps left at the pace of the steps done since the first trial started."""
        done = sum(t.status in FINAL for t in self.trials.values())
        total_steps = self.planned * self.steps_per_trial
        steps = sum(t.total if t.status in FINAL else t.step for t in self.trials.values())
        elapsed = self.clock() - self.t0
        working = self.clock() - (self.t_running if self.t_running is not None else self.t0)
        if done == self.planned:
            left = "done"
        elif steps > 0:
            left = f"about {fmt_duration(working * (total_steps - steps) / steps)} left"
        else:
            left = "time left: after the first steps"
        return (f"sweep {self.name}: {done}/{self.planned} trials done, {steps}/{total_steps} steps, "
                f"{fmt_duration(elapsed)} elapsed, {left}")

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        table = Table(box=None, pad_edge=False, show_edge=False)
        for col, justify in (("trial", "left"), ("step", "right"), (self.metric_label, "right"), ("status", "left")):
            table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for t in self.trials.values():
            held = "-" if t.heldout is None else f"{t.heldout:.3f}"
            table.add_row(t.label(), f"{t.step}/{t.total}", held, t.status + (f" ({t.retries})" if t.retries else ""))
        if self.not_created():
            table.add_row(f"({self.not_created()} more not started)", "", "", "")
        return Group(Text(self.progress_text(), style="bold"), table)

    # ------------------------------------------------------------------ output
    def _event(self, t: TrialLine, what: str) -> None:
        if self._live is not None:
            self._refresh()
            return
        self._say(f"[{fmt_duration(self.clock() - self.t0):>6}] {t.label()}: {what} "
                  f"({sum(x.status in FINAL for x in self.trials.values())}/{self.planned} done)")

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.refresh()

    def _say(self, line: str) -> None:
        self.out.write(line + "\n")
        self.out.flush()
