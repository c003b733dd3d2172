"""Ray Tune callbacks -> :class:`ulorl.sweep.console.SweepView` events.

Tune pickles a tuner's callbacks with its state (``Tuner.restore`` brings them back in a new
driver process), so :class:`ViewCallback` carries only a key; the live view and the function that
names a trial (role, swept values) are registered under that key by the driver that runs the sweep
(:func:`register`), the resumed driver included.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ray.tune import Callback

from ulorl.sweep.console import SweepView
from ulorl.sweep.prune import read_pruned

# trial config -> (role, short swept values)
Describe = Callable[[dict[str, Any]], tuple[str, str]]


@dataclass
class Registered:
    view: SweepView
    describe: Describe
    metric: str


_REGISTRY: dict[str, Registered] = {}


def register(key: str, view: SweepView, describe: Describe, metric: str) -> Registered:
    _REGISTRY[key] = Registered(view, describe, metric)
    return _REGISTRY[key]


def unregister(key: str) -> None:
    _REGISTRY.pop(key, None)


def _error_text(trial: Any) -> str:
    """The exception line of the trial's error file (its traceback's last line), shortened."""
    path = getattr(trial, "error_file", None)
    try:
        lines = [x.strip() for x in Path(path).read_text(errors="replace").splitlines() if x.strip()] if path else []
    except OSError:
        return ""
    return lines[-1][:160] if lines else ""


class ViewCallback(Callback):
    """Forwards trial state changes and results to the registered view (no-op when none is)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def _reg(self) -> Optional[Registered]:
        return _REGISTRY.get(self.key)

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        reg = self._reg()
        if reg is not None:
            role, values = reg.describe(dict(trial.config))
            reg.view.started(trial.trial_id, role, values)

    def on_trial_restore(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.on_trial_start(iteration, trials, trial)

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any],
                        **info: Any) -> None:
        reg = self._reg()
        if reg is None:
            return
        value = result.get(reg.metric)
        score = float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
        step = result.get("step")
        reg.view.result(trial.trial_id, int(step) if isinstance(step, (int, float)) else None, score)

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        reg = self._reg()
        if reg is not None:
            reg.view.retrying(trial.trial_id, _error_text(trial))

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        reg = self._reg()
        if reg is None:
            return
        rec = read_pruned(self.key).get(trial.trial_id)   # the key is the sweep directory
        if rec is not None:
            reg.view.pruned(trial.trial_id, str(rec["reason"]), int(rec["step"]))
        else:
            reg.view.finished(trial.trial_id)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        reg = self._reg()
        if reg is not None:
            reg.view.failed(trial.trial_id, _error_text(trial))
