"""Send everything a sweep driver writes to a log file, and keep the console for our own view.

While a sweep runs, Ray, Ray Tune, Optuna, MLflow and the trials (their output reaches the driver
through Ray) write status tables, checkpoint lines, progress bars and warnings to the process's
stdout and stderr. :class:`OutputCapture` points file descriptors 1 and 2 (Python writes, C
libraries and child processes alike) at the log file for its duration; with ``echo`` it copies
them to the terminal too (``ulorl-sweep --verbose``). ``console`` is a text stream on the original
stdout (or stderr: ``console_fd=2``, when stdout carries ``--json``), for the sweep's own view.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any, Optional, TextIO


class OutputCapture:
    """Context manager: fds 1 and 2 -> ``log_path`` (appended), ``echo`` -> also the originals."""

    def __init__(self, log_path: Path, echo: bool = False, console_fd: int = 1) -> None:
        self.log_path = Path(log_path)
        self.echo = echo
        self.console_fd = console_fd if console_fd in (1, 2) else 1
        self.console: TextIO = sys.stdout
        self._saved: dict[int, int] = {}
        self._threads: list[threading.Thread] = []
        self._log: Optional[Any] = None

    def __enter__(self) -> OutputCapture:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = {fd: os.dup(fd) for fd in (1, 2)}
        self.console = os.fdopen(os.dup(self._saved[self.console_fd]), "w", buffering=1, encoding="utf-8",
                                 errors="replace")
        self._log = open(self.log_path, "ab", buffering=0)  # noqa: SIM115 -- closed in __exit__
        if not self.echo:
            for fd in (1, 2):
                os.dup2(self._log.fileno(), fd)
            return self
        for fd in (1, 2):  # a pipe per stream; a thread copies it to the log and the original
            r, w = os.pipe()
            os.dup2(w, fd)
            os.close(w)
            t = threading.Thread(target=self._tee, args=(r, self._saved[fd]), daemon=True, name=f"ulorl-tee-{fd}")
            t.start()
            self._threads.append(t)
        return self

    def _tee(self, read_fd: int, out_fd: int) -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as src:
            while chunk := src.read(65536):
                assert self._log is not None
                self._log.write(chunk)
                os.write(out_fd, chunk)

    def __exit__(self, *exc: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)   # closes our pipe's write end on fd: the tee sees EOF (unless children hold it)
        for t in self._threads:
            t.join(timeout=2.0)
        for saved in self._saved.values():
            os.close(saved)
        self.console.flush()
        self.console.close()
        if self._log is not None and not any(t.is_alive() for t in self._threads):
            self._log.close()
        self.console = sys.stdout
