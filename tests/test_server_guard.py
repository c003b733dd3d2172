"""The guard that keeps a sweep's tracking server from outliving its driver, on a stand-in server (a
process of its own group with a child, as ``mlflow server`` has its uvicorn; the point here is process
lifetime, the real server is in tests/test_sweep_interrupt.py's slow tests):

* the driver killed with SIGKILL: the guard stops the server's whole group, removes the auth folder and
  the state file within seconds;
* the guard killed with SIGKILL too: the server is left, and ``stop_stale_server`` (what the next
  ``ulorl-sweep`` of the sweep runs first) stops it, removes both, and never signals a process that
  does not carry the recorded port.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ulorl.sweep.server import STATE_FILE, stop_stale_server
from ulorl.sweep.server_guard import cmdline as _cmdline
from ulorl.sweep.server_guard import group_members as _group
from ulorl.sweep.server_guard import set_parent_death_signal

STAND_IN = ("import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', '--port', sys.argv[2]])\n"
            "time.sleep(600)\n")


def _guard_command(tmp_path: Path, port: int, parent: str) -> list[str]:
    auth = tmp_path / "ulorl-mlflow-auth-x"
    auth.mkdir(exist_ok=True)
    (auth / "basic_auth.ini").write_text("[mlflow]\n")
    return [sys.executable, "-m", "ulorl.sweep.server_guard", "--parent", parent, "--auth-dir", str(auth),
            "--state", str(tmp_path / STATE_FILE), "--port", str(port), "--",
            sys.executable, "-c", STAND_IN, "--port", str(port)]


def _wait(cond, timeout_s: float = 20.0) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def _server(tmp_path: Path) -> dict:
    assert _wait(lambda: (tmp_path / STATE_FILE).exists())
    info = json.loads((tmp_path / STATE_FILE).read_text())
    assert _wait(lambda: len(_group(info["server_pgid"])) == 2)        # the stand-in and its child
    return info


def test_parent_death_signal_is_armed_on_linux():
    assert set_parent_death_signal() is sys.platform.startswith("linux")


def test_the_guard_stops_the_server_group_when_the_driver_is_killed(tmp_path):
    cmd = _guard_command(tmp_path, 47001, "PARENT")
    driver_code = ("import subprocess, sys, os, time\n"
                   f"cmd = {cmd!r}\n"
                   "cmd[cmd.index('PARENT')] = str(os.getpid())\n"
                   "subprocess.Popen(cmd, stdin=subprocess.PIPE, start_new_session=True)\n"
                   "time.sleep(600)\n")
    driver = subprocess.Popen([sys.executable, "-c", driver_code])
    try:
        info = _server(tmp_path)
        members = _group(info["server_pgid"])
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        assert _wait(lambda: not _group(info["server_pgid"]) and _cmdline(info["guard_pid"]) is None), \
            [(p, _cmdline(p)) for p in members]
        assert not (tmp_path / "ulorl-mlflow-auth-x").exists() and not (tmp_path / STATE_FILE).exists()
    finally:
        driver.kill()


def test_a_server_whose_guard_died_too_is_stopped_by_the_next_driver(tmp_path):
    guard = subprocess.Popen(_guard_command(tmp_path, 47002, str(os.getpid())), stdin=subprocess.PIPE,
                             start_new_session=True)
    info = _server(tmp_path)
    members = _group(info["server_pgid"])
    try:
        guard.send_signal(signal.SIGKILL)
        guard.wait()
        time.sleep(0.5)
        assert _group(info["server_pgid"]) == members                 # left running: nothing stopped it
        recycled = dict(info, port=47999)                              # another port: not that server
        (tmp_path / STATE_FILE).write_text(json.dumps(recycled))
        assert stop_stale_server(tmp_path) == f"stopped what an earlier driver of this sweep left running: its auth " \
            f"folder {info['auth_dir']}"
        assert _group(info["server_pgid"]) == members                 # a process without the port is never hit
        (tmp_path / STATE_FILE).write_text(json.dumps(info))
        (tmp_path / "ulorl-mlflow-auth-x").mkdir()
        assert stop_stale_server(tmp_path) == (
            f"stopped what an earlier driver of this sweep left running: mlflow server {info['server_pgid']} on port "
            f"47002, its auth folder {info['auth_dir']}")
        assert _wait(lambda: not _group(info["server_pgid"]))
        assert not (tmp_path / STATE_FILE).exists() and not (tmp_path / "ulorl-mlflow-auth-x").exists()
        assert stop_stale_server(tmp_path) is None                    # nothing left to do
    finally:
        for pid in _group(info["server_pgid"]):
            os.kill(pid, signal.SIGKILL)
