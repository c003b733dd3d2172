"""A real multi-node Ray cluster on 127.0.0.1 for tests: one ``ray start --block`` process per node.

Each node is its own ``ray start`` process (own raylet, own node id) in its own session, so the
test ends exactly the processes it started (``os.killpg`` on each session), never other Ray
instances on the machine. Token authentication (``RAY_AUTH_MODE=token``) is on unless disabled.
A node given ``private_dir`` runs in its own mount namespace with an empty tmpfs there (util-linux
``unshare``, root): a path the other nodes see and it does not.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRayCluster:
    def __init__(self, nodes: list[dict[str, Any]], token_auth: bool = True,
                 object_store_mb: int = 100) -> None:
        self.nodes = nodes
        self.token = secrets.token_hex(32) if token_auth else None
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp = Path(tempfile.mkdtemp(prefix="ulr-", dir="/tmp"))
        self.object_store_mb = object_store_mb
        self.procs: list[subprocess.Popen] = []

    def env(self) -> dict[str, str]:
        """What a client of this cluster needs in its environment (the token included)."""
        # multi-node on one machine: Ray refuses it unless this is 1; --node-ip-address keeps it on 127.0.0.1
        out = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_USAGE_STATS_ENABLED": "0"}
        if self.token:
            out.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token})
        return out

    def _ray(self) -> str:
        exe = Path(sys.executable).with_name("ray")
        return str(exe) if exe.exists() else "ray"

    def start(self, timeout_s: float = 120.0) -> "LocalRayCluster":
        env = {**os.environ, **self.env()}
        for i, n in enumerate(self.nodes):
            common = [f"--num-cpus={n.get('CPU', 1):g}", f"--num-gpus={n.get('GPU', 0):g}",
                      f"--object-store-memory={self.object_store_mb * 2**20}", "--node-ip-address=127.0.0.1",
                      "--disable-usage-stats", "--block"]
            if i == 0:
                cmd = [self._ray(), "start", "--head", f"--port={self.port}", "--include-dashboard=false",
                       f"--temp-dir={self.temp}", *common]
            else:
                cmd = [self._ray(), "start", f"--address={self.address}", *common]
            if n.get("private_dir"):
                # this node (its raylet and every worker it starts) sees an empty tmpfs at private_dir: a
                # directory the other nodes share but this one does not (a private mount namespace)
                d = str(n["private_dir"])
                cmd = ["unshare", "-m", "sh", "-c", f'mount -t tmpfs tmpfs "{d}" && exec "$@"', "sh", *cmd]
            log = open(self.temp / f"node{i}.log", "ab")
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                               start_new_session=True))
            self._wait_nodes(i + 1, timeout_s)
        return self

    def _wait_nodes(self, n: int, timeout_s: float) -> None:
        code = ("import ray; ray.init(address='%s', log_to_driver=False); "
                "print(sum(1 for x in ray.nodes() if x['Alive']))" % self.address)
        deadline = time.time() + timeout_s
        last = ""
        while time.time() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    logs = "\n".join(f.read_text()[-1500:] for f in sorted(self.temp.glob("node*.log")))
                    raise RuntimeError(f"ray start exited with {p.returncode}:\n{logs}")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                                 env={**os.environ, **self.env()})
            last = out.stdout.strip().splitlines()[-1:] or out.stderr[-500:]
            if out.returncode == 0 and out.stdout.strip().endswith(str(n)):
                return
            time.sleep(2)
        raise RuntimeError(f"{n} Ray node(s) not up after {timeout_s:.0f}s: {last}")

    def pids(self) -> list[int]:
        """Every live process in the sessions this cluster started."""
        out = []
        for p in self.procs:
            ps = subprocess.run(["ps", "-o", "pid=", "-s", str(p.pid)], capture_output=True, text=True).stdout
            out += [int(x) for x in ps.split()]
        return out

    def rss_mb(self) -> float:
        pids = self.pids()
        if not pids:
            return 0.0
        ps = subprocess.run(["ps", "-o", "rss=", "-p", ",".join(map(str, pids))], capture_output=True, text=True)
        return sum(int(x) for x in ps.stdout.split()) / 1024

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 30
        while self.pids() and time.time() < deadline:
            time.sleep(0.5)
        for p in self.procs:  # stragglers in our own sessions only
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
        deadline = time.time() + 30  # processes killed above may take a moment to leave the table
        while self.pids() and time.time() < deadline:
            time.sleep(0.5)
        shutil.rmtree(self.temp, ignore_errors=True)

    def __enter__(self) -> "LocalRayCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
