"""Ctrl-C (SIGINT) and SIGTERM while ``ulorl-train --ray`` drives a placed run.

    signals = DriverSignals()
    with signals:                       # main thread; kept through ray.init (ulorl.scale.local_ray.init_ray)
        ...                             # setup: a signal stops the driver at once (KeyboardInterrupt)
        signals.training = True         # the trainer runs: the first signal is recorded, not raised
        if signals.received: ...        # ask trainer rank 0 to stop after its step (the run's stop queue)
                                        # a second signal gives up waiting (KeyboardInterrupt)

The trainer runs in a Ray actor, in a process group of its own: the terminal's Ctrl-C reaches the driver
only. The driver hands the signal on (``run_placement``'s stop queue), and rank 0 stops as a plain
``ulorl-train`` does on a signal: it finishes its step, checkpoints, marks its MLflow run KILLED.
:class:`PlacementInterrupted` is what a driver stopped before that could happen raises.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any, Optional


class PlacementInterrupted(Exception):
    """The driver was stopped by ``signum`` before trainer rank 0 could end its run itself (a signal during
    setup, or a second one): the actors are gone; ``run_dir`` holds the checkpoints written so far."""

    def __init__(self, signum: int, run_dir: Path, run_id: Optional[str], steps: int) -> None:
        super().__init__(f"interrupted by signal {signum} after {steps} step(s)")
        self.signum = signum
        self.run_dir = run_dir
        self.run_id = run_id
        self.steps = steps


class DriverSignals:
    """SIGINT / SIGTERM handlers of a placed run's driver (module docstring); a context manager that puts the
    old handlers back. Outside the main thread (a Tune trial) it installs nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: Optional[int] = None   # the first signal, None while none came
        self.training = False                 # True once trainer rank 0 runs: a first signal is handed on
        self.hard = False                     # the driver stopped at once (KeyboardInterrupt raised)
        self._old: dict[int, Any] = {}

    @property
    def signum(self) -> int:
        """What stopped the run: the signal received, else SIGINT (a bare KeyboardInterrupt is Ctrl-C)."""
        return signal.SIGINT if self.received is None else self.received

    def receive(self, signum: int, frame: Any = None) -> None:
        """The handler: record the first signal; raise KeyboardInterrupt unless the trainer can stop itself."""
        first = self.received is None
        if first:
            self.received = signum
        if not self.training or not first:
            self.hard = True
            raise KeyboardInterrupt

    def install(self) -> None:
        """Handle SIGINT / SIGTERM here (main thread only)."""
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                old = signal.signal(sig, self.receive)
                self._old.setdefault(sig, old)

    def restore(self) -> None:
        """The handlers from before :meth:`install`."""
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def __enter__(self) -> DriverSignals:
        self.install()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()
