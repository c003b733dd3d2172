"""A local ``mlflow server`` on 127.0.0.1 over a SQLite store, for concurrent trial writers.

SQLite locks under parallel writers; one server process serialises them. Job execution is off and
there is one worker (STACK.md: ~500 MB instead of ~2 GB).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional

from ulorl.tracking.uri import artifact_root_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    def __init__(self, sqlite_uri: str, port: Optional[int] = None, log_path: Optional[Path] = None) -> None:
        if not sqlite_uri.startswith("sqlite:"):
            raise ValueError(f"MlflowServer serves a sqlite store, got {sqlite_uri}")
        self.store = sqlite_uri
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        db = Path(sqlite_uri[len("sqlite:///"):])
        self.log_path = log_path or db.parent / f"{db.stem}-server.log"
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout_s: float = 60.0) -> None:
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        exe = Path(sys.executable).with_name("mlflow")
        cmd = [str(exe) if exe.exists() else "mlflow", "server", "--backend-store-uri", self.store,
               "--default-artifact-root", artifact_root_for(self.store) or "", "--host", "127.0.0.1",
               "--port", str(self.port), "--workers", "1"]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server not ready after {timeout_s:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        self.proc = None

    def __enter__(self) -> "MlflowServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
