"""The training progress of ``ulorl-train`` on stderr: a live bar on a terminal (step / total, elapsed,
time left, then the last step's reward, entropy, masked fraction, pools, time per step and held-out
score), one plain line per step anywhere else (CI, a pipe, a file)."""

from __future__ import annotations

import math
import sys
from typing import Any, Optional, TextIO

from ulorl.tracking import schema


def _num(m: dict[str, float], key: str, fmt: str = ".3f") -> str:
    v = m.get(key)
    return format(v, fmt) if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def step_text(m: dict[str, float]) -> str:
    """The key metrics of one step: ``reward 0.412  H 0.081  masked 0.120  pool 12/3  0.8s/step``
    (``-`` for a value the step did not log, e.g. entropy on a step without an update)."""
    parts = [
        f"reward {_num(m, 'rollout/reward_mean')}",
        f"H {_num(m, 'train/entropy')}",
        f"masked {_num(m, 'train/masked_frac')}",
        f"pool {int(m.get('pool/unfinished', 0))}/{int(m.get('pool/experience', 0))}",
        f"{_num(m, 'time/step_s', '.1f')}s/step",
    ]
    if "eval/heldout/avg_at_k" in m:
        parts.append(f"heldout {_num(m, 'eval/heldout/avg_at_k')}")
    if m.get(schema.SKIPPED_METRIC):
        parts.append("no update")
    return "  ".join(parts)


class TrainProgress:
    """Progress of one run from step ``start`` to ``total``; ``enabled=False`` prints nothing."""

    def __init__(self, total: int, start: int, enabled: bool, file: Optional[TextIO] = None) -> None:
        self.enabled = enabled
        self.total = total
        self.file = file or sys.stderr
        self.bar: Any = None
        if not enabled:
            return
        from rich.console import Console

        self.console = Console(file=self.file, soft_wrap=True)
        if self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("[bold]train"), BarColumn(bar_width=24), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("left"), TimeRemainingColumn(), TextColumn("{task.description}"),
                console=self.console, transient=False,
            )
            self.task = self.bar.add_task("", total=total, completed=start)
            self.bar.start()

    def update(self, step: int, m: dict[str, float]) -> None:
        if not self.enabled:
            return
        text = step_text(m)
        if self.bar is not None:
            self.bar.update(self.task, completed=step, description=text.replace("[", r"\["))
        else:
            self.console.print(f"step {step}/{self.total}  {text}", markup=False, highlight=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
