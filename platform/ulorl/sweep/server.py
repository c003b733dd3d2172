"""The ``mlflow server`` a sweep's driver starts for its trials, over the sweep's SQLite store.

    with MlflowServer("sqlite:////runs/mlflow.db") as srv:            # 127.0.0.1, no auth
        srv.uri                                                        # http://127.0.0.1:PORT
    srv = MlflowServer(store, host="10.0.0.5")                         # cluster-reachable: basic auth on
    srv.client_env()                                                   # MLFLOW_TRACKING_USERNAME / _PASSWORD

* One server process serialises the trials' writes (SQLite locks under parallel writers); job
  execution is off and there is one worker (STACK.md: ~500 MB instead of ~2 GB).
* With auth (beyond loopback, or forced) artifacts are proxied (``--serve-artifacts``): trials on any
  node upload through the server into ``<db stem>-artifacts/`` beside the store, so no node needs the
  driver's filesystem (reading them back then also goes through a server). On loopback without
  auth they stay plain ``file://`` paths there, readable with the SQLite URI alone.
* Beyond loopback the server runs MLflow's basic-auth app (``mlflow[auth]``): an admin user whose
  password comes from ``password`` or is generated (``secrets``), handed to the server in its auth
  config file (``admin_password``, in a private temp dir, removed from the file once the server has
  created the user: no process's environment and no file keeps it) and to clients through
  ``client_env()``; it is never printed or written to the logs. The auth user store is a fresh file
  per start in that dir. Listening beyond loopback without auth is refused.
* The server never outlives the driver: it runs under a guard (``ulorl.sweep.server_guard``) that stops
  its whole process group and removes the auth dir when the driver ends, ``kill -9`` included. With
  ``state_dir`` (the sweep folder) the guard records the server in ``tracking_server.json`` there, and
  :func:`stop_stale_server` (``ulorl-sweep --resume``) stops a server whose guard was killed too.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from ulorl.sweep.server_guard import cmdline, group_members, stop_group
from ulorl.tracking.store import prepare_store
from ulorl.tracking.uri import artifact_root_for, is_loopback

ADMIN_USER = "ulorl-admin"
STATE_FILE = "tracking_server.json"   # in the sweep folder while its server runs
AUTH_DIR_PREFIX = "ulorl-mlflow-auth-"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host if host != "0.0.0.0" else "", 0))
        return s.getsockname()[1]


def advertised_host(host: str) -> str:
    """The address clients use: ``host``, or this machine's outward IP for a wildcard bind."""
    if host not in ("0.0.0.0", "::"):
        return host
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: picks the outward interface
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


class MlflowServer:
    def __init__(self, sqlite_uri: str, port: Optional[int] = None, log_path: Optional[Path] = None, *,
                 host: str = "127.0.0.1", auth: Optional[bool] = None, password: Optional[str] = None,
                 state_dir: Optional[Path] = None, hide_env: Sequence[str] = ()) -> None:
        if not sqlite_uri.startswith("sqlite:"):
            raise ValueError(f"MlflowServer serves a sqlite store, got {sqlite_uri}")
        self.auth = (not is_loopback(host)) if auth is None else bool(auth)
        if not self.auth and not is_loopback(host):
            raise ValueError(f"tracking server on {host} (beyond loopback) must run with authentication")
        self.store = sqlite_uri
        self.host = host
        self.port = port or free_port(host)
        self.uri = f"http://{advertised_host(host)}:{self.port}"
        self.username = ADMIN_USER if self.auth else None
        self._password = (password or secrets.token_urlsafe(24)) if self.auth else None
        db = Path(sqlite_uri[len("sqlite:///"):])
        self.artifacts = Path((artifact_root_for(sqlite_uri) or "")[len("file://"):])
        self.log_path = log_path or db.parent / f"{db.stem}-server.log"
        # cluster mode (auth on or beyond loopback): trials on other nodes upload through the server
        self.proxy_artifacts = self.auth or not is_loopback(host)
        self.proc: Optional[subprocess.Popen[bytes]] = None   # the guard (ulorl.sweep.server_guard)
        self._auth_dir: Optional[Path] = None
        self.state_file = Path(state_dir) / STATE_FILE if state_dir is not None else None
        self.hide_env = tuple(hide_env)   # variables of the driver the server must not inherit (a password)

    def client_env(self) -> dict[str, str]:
        """What a client needs besides ``uri`` (empty without auth). Hand it over, never print it."""
        if not self.auth:
            return {}
        return {"MLFLOW_TRACKING_USERNAME": self.username or "", "MLFLOW_TRACKING_PASSWORD": self._password or ""}

    def _command(self) -> list[str]:
        exe = Path(sys.executable).with_name("mlflow")
        cmd = [str(exe) if exe.exists() else "mlflow", "server", "--backend-store-uri", self.store]
        if self.proxy_artifacts:
            cmd += ["--serve-artifacts", "--artifacts-destination", self.artifacts.as_uri()]
        else:  # one machine: artifacts stay plain files beside the store, readable without a server
            cmd += ["--default-artifact-root", self.artifacts.as_uri()]
        cmd += ["--host", self.host, "--port", str(self.port), "--workers", "1"]
        if not is_loopback(self.host):
            adv = advertised_host(self.host)
            cmd += ["--allowed-hosts", f"{adv},{adv}:{self.port},localhost,localhost:{self.port},127.0.0.1,"
                                       f"127.0.0.1:{self.port}"]
        if self.auth:
            cmd += ["--app-name", "basic-auth"]
        return cmd

    def _auth_ini(self, with_password: bool) -> str:
        assert self._auth_dir is not None
        return ("[mlflow]\ndefault_permission = READ\n"
                f"database_uri = sqlite:///{self._auth_dir / 'auth.db'}\n"
                f"admin_username = {self.username}\n"
                + (f"admin_password = {self._password}\n" if with_password else "")
                + "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")

    def _write_ini(self, with_password: bool) -> None:
        assert self._auth_dir is not None
        ini = self._auth_dir / "basic_auth.ini"
        tmp = self._auth_dir / ".basic_auth.ini.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self._auth_ini(with_password))
        os.replace(tmp, ini)

    def start(self, timeout_s: float = 90.0) -> None:
        prepare_store(self.store)  # a clear error for a read-only store; tables created once, under a lock
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_AUTH_ADMIN_PASSWORD",
                  *self.hide_env):
            env.pop(k, None)
        self.artifacts.mkdir(parents=True, exist_ok=True)
        if self.auth:
            self._auth_dir = Path(tempfile.mkdtemp(prefix=AUTH_DIR_PREFIX))
            self._write_ini(with_password=True)   # read once, when the server creates the admin user
            env.update({"MLFLOW_AUTH_CONFIG_PATH": str(self._auth_dir / "basic_auth.ini"),
                        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_urlsafe(32)})
        self._log = open(self.log_path, "ab")
        guard = [sys.executable, "-m", "ulorl.sweep.server_guard", "--parent", str(os.getpid()),
                 "--auth-dir", str(self._auth_dir or ""), "--state", str(self.state_file or ""),
                 "--port", str(self.port), "--", *self._command()]
        # its own session: Ctrl-C in the terminal reaches the driver, which stops the server in order
        self.proc = subprocess.Popen(guard, stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise RuntimeError(f"mlflow server exited with {code}; see {self.log_path}")
            if self._healthy():
                if self.auth:   # the admin user exists now: the password leaves the file
                    self._write_ini(with_password=False)
                return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server not ready after {timeout_s:.0f} s; see {self.log_path}")

    def _healthy(self) -> bool:
        url = f"http://127.0.0.1:{self.port}/health" if self.host in ("0.0.0.0", "::") else f"{self.uri}/health"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return bool(r.status == 200)
        except urllib.error.HTTPError as exc:  # /health answers 401 under basic auth once it is up
            return exc.code in (401, 403)
        except OSError:
            return False

    def stop(self) -> None:
        """Stop the server: the guard reads end-of-file on its stdin, stops the server's process group and
        removes the auth dir and the state file; when it does not within 30 s, both are killed here."""
        if self.proc is not None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                if self.state_file is not None:
                    stop_stale_server(self.state_file.parent)
            self._log.close()
            self.proc = None
        if self._auth_dir is not None:
            shutil.rmtree(self._auth_dir, ignore_errors=True)
            self._auth_dir = None

    def __enter__(self) -> MlflowServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_stale_server(state_dir: Path) -> Optional[str]:
    """Stop the tracking server an earlier driver of the sweep in ``state_dir`` left running (its guard
    was killed too, so nothing stopped it), remove its auth dir and the state file. Returns what was done
    (None when there was nothing to do). A recorded pid is only signalled while its command line is still
    that server's (the port it was given), never a process that reused the number."""
    state_file = Path(state_dir) / STATE_FILE
    if not state_file.is_file():
        return None
    try:
        info: dict[str, Any] = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        info = {}
    port = str(info.get("port", ""))
    stopped = []
    guard, pgid = info.get("guard_pid"), info.get("server_pgid")
    if isinstance(guard, int) and "ulorl.sweep.server_guard" in (cmdline(guard) or ""):
        os.kill(guard, signal.SIGKILL)   # a guard alone would restart nothing; the group is stopped below
        stopped.append(f"guard {guard}")
    if isinstance(pgid, int) and port and any(f"--port {port}" in (cmdline(pid) or "") for pid in group_members(pgid)):
        stop_group(pgid)
        stopped.append(f"mlflow server {pgid} on port {port}")
    auth_dir = info.get("auth_dir") or ""
    if auth_dir and Path(auth_dir).name.startswith(AUTH_DIR_PREFIX) and Path(auth_dir).exists():
        shutil.rmtree(auth_dir, ignore_errors=True)
        stopped.append(f"its auth folder {auth_dir}")
    state_file.unlink(missing_ok=True)
    if not stopped:
        return None
    return f"stopped what an earlier driver of this sweep left running: {', '.join(stopped)}"
