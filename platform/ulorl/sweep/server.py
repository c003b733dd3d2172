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
  password comes from ``password`` or is generated (``secrets``), handed to the server through its
  environment (``MLFLOW_AUTH_ADMIN_PASSWORD``) and to clients through ``client_env()``; it is never
  printed or written to the logs. The auth user store is a fresh file per start in a private temp
  dir. Listening beyond loopback without auth is refused.
"""

from __future__ import annotations

import ipaddress
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
from pathlib import Path
from typing import Optional

from ulorl.tracking.store import prepare_store
from ulorl.tracking.uri import artifact_root_for

ADMIN_USER = "ulorl-admin"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host if host != "0.0.0.0" else "", 0))
        return s.getsockname()[1]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
                 host: str = "127.0.0.1", auth: Optional[bool] = None, password: Optional[str] = None) -> None:
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
        self.proc: Optional[subprocess.Popen] = None
        self._auth_dir: Optional[Path] = None

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

    def start(self, timeout_s: float = 90.0) -> None:
        prepare_store(self.store)  # a clear error for a read-only store; tables created once, under a lock
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            env.pop(k, None)
        self.artifacts.mkdir(parents=True, exist_ok=True)
        if self.auth:
            self._auth_dir = Path(tempfile.mkdtemp(prefix="ulorl-mlflow-auth-"))
            ini = self._auth_dir / "basic_auth.ini"
            ini.write_text("[mlflow]\ndefault_permission = READ\n"
                           f"database_uri = sqlite:///{self._auth_dir / 'auth.db'}\n"
                           f"admin_username = {self.username}\n"
                           "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
            env.update({"MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_AUTH_ADMIN_PASSWORD": self._password or "",
                        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_urlsafe(32)})
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self._command(), stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise RuntimeError(f"mlflow server exited with {code}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health" if self.host in ("0.0.0.0", "::")
                                            else f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as exc:  # /health answers 401 under basic auth once it is up
                if exc.code in (401, 403):
                    return
                time.sleep(0.5)
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server not ready after {timeout_s:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None:
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
        if self._auth_dir is not None:
            shutil.rmtree(self._auth_dir, ignore_errors=True)
            self._auth_dir = None

    def __enter__(self) -> MlflowServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
