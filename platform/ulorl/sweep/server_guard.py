"""The guard between a sweep's driver and its tracking server: the server never outlives the driver.

    python -m ulorl.sweep.server_guard --parent PID --auth-dir DIR --state FILE -- mlflow server ...

``MlflowServer.start`` runs this guard with its stdin a pipe whose other end only the driver holds. The
guard starts the server in a process group of its own (``mlflow server`` and the uvicorn it starts),
records it in ``--state`` (a JSON file in the sweep folder: ``--resume`` reads it to stop a server whose
guard was killed too, :func:`ulorl.sweep.server.stop_stale_server`) and waits. When the driver goes, the
guard stops the server's whole group, removes the auth folder (``--auth-dir``) and the state file, and
exits:

* a clean stop, and any death of the driver (``kill -9`` included: the kernel closes a dead process's
  files), close the pipe: the guard reads end-of-file (any POSIX system);
* on Linux the guard also asks the kernel for SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``
  through ctypes), which holds even if a forked child of the driver kept the pipe open.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

PR_SET_PDEATHSIG = 1   # <linux/prctl.h>


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the Linux kernel to send ``sig`` to this process when its parent dies; False elsewhere (or when
    prctl is not reachable), where the guard relies on its stdin pipe alone."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def cmdline(pid: int) -> Optional[str]:
    """The command line of process ``pid``; None when it is gone or a zombie (dead, not yet reaped)."""
    proc = Path(f"/proc/{pid}")
    if proc.is_dir():
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return None
            return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            return None
    if Path("/proc/self").is_dir():   # a /proc without this pid: it is gone
        return None
    try:   # no /proc (macOS): ask ps
        out = subprocess.run(["ps", "-o", "stat=,command=", "-p", str(pid)], capture_output=True, text=True)
    except OSError:
        return None
    line = out.stdout.strip()
    return None if not line or line.startswith("Z") else line.split(None, 1)[-1]


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, its leader first; without /proc, the
    leader alone (or none)."""
    members = [pgid] if cmdline(pgid) is not None else []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(stat.parent.name)
        if len(fields) > 2 and int(fields[2]) == pgid and pid != pgid and fields[0] != "Z":
            members.append(pid)
    return members


def stop_group(pgid: int, timeout_s: float = 20.0, leader: Optional[subprocess.Popen[bytes]] = None) -> None:
    """SIGTERM to process group ``pgid``, SIGKILL when a live member is still there after ``timeout_s``.
    ``leader``: the group's leader when it is this process's child, reaped as it ends."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if leader is not None:
            leader.poll()
        if not group_members(pgid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def write_state(path: Path, info: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(info), encoding="utf-8")
    os.replace(tmp, path)


def _watch_stdin(stop: threading.Event) -> None:
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, ValueError):
        pass
    stop.set()   # end of file: the driver closed its end, or died


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ulorl.sweep.server_guard")
    p.add_argument("--parent", type=int, required=True, help="the driver's pid")
    p.add_argument("--auth-dir", default="", help="folder removed when the server stops")
    p.add_argument("--state", default="", help="JSON file recording the server while it runs")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the server's command line")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: stop.set())
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != args.parent:   # the driver died before the death signal was armed
        stop.set()
    threading.Thread(target=_watch_stdin, args=(stop,), daemon=True).start()
    server: Optional[subprocess.Popen[bytes]] = None
    state = Path(args.state) if args.state else None
    code = 0
    try:
        if not stop.is_set():
            server = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
            if state is not None:
                write_state(state, {"guard_pid": os.getpid(), "server_pgid": server.pid, "port": args.port,
                                    "auth_dir": args.auth_dir, "command": command[:2]})
        while server is not None and not stop.wait(0.2):
            if server.poll() is not None:   # the server ended by itself: the driver sees the guard end
                code = server.returncode or 1
                break
    finally:
        if server is not None:
            stop_group(server.pid, leader=server)
            server.wait()
        if args.auth_dir:
            shutil.rmtree(args.auth_dir, ignore_errors=True)
        if state is not None:
            state.unlink(missing_ok=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
