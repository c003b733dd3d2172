"""Where and when a run was made: the tags every tracked run carries (``RunTracker.start`` / ``end``).

- ``ulorl.git_commit`` / ``ulorl.git_dirty``: the checkout ulorl ran from, and whether its tracked files
  differed from that commit ("true" / "false"; "unknown" outside a git checkout);
- ``ulorl.spec`` / ``ulorl.spec_sha256``: the spec the run came from (a sweep's YAML for a sweep's
  runs, the experiment YAML for ``ulorl-train``; the path relative to its git checkout's root when it
  lies in one) and the SHA-256 of its bytes when the run started. A sweep's child runs inherit both
  from the parent run;
- ``ulorl.started_at`` / ``ulorl.ended_at``: UTC times (ISO 8601, seconds) of the start and of the end;
- ``ulorl.hw.*``: CPU model, cores, host name, torch threads, the BLAS torch was built with, GPU;
  ``ulorl.version.*``: torch, transformers, ulorl, python.

Per-run numbers carry over between machines in distribution, not bit for bit (BLAS builds and thread
counts reorder floating-point sums), so a reader of a result needs to see where each run ran.
"""

from __future__ import annotations

import hashlib
import os
import platform as _platform
import re
import socket
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Optional

import ulorl

GIT_COMMIT_TAG = "ulorl.git_commit"
GIT_DIRTY_TAG = "ulorl.git_dirty"
SPEC_TAG = "ulorl.spec"
SPEC_HASH_TAG = "ulorl.spec_sha256"
STARTED_TAG = "ulorl.started_at"
ENDED_TAG = "ulorl.ended_at"
BLAS_TAG = "ulorl.hw.blas"
# The tags a sweep's child run takes over from its parent run (the spec it came from).
INHERITED_TAGS: tuple[str, ...] = (SPEC_TAG, SPEC_HASH_TAG)
UNKNOWN = "unknown"


def utc_now() -> str:
    """``2026-12-07T22:31:05Z``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_utc(ms: int | float) -> str:
    """Milliseconds since the epoch as :func:`utc_now` writes them: ``iso_utc(0) == "1970-01-01T00:00:00Z"``."""
    return datetime.fromtimestamp(float(ms) / 1000.0, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git(args: list[str], cwd: Path) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_state(where: Path | str | None = None) -> tuple[str, str]:
    """(commit, dirty) of the git checkout holding ``where`` (default: ulorl's own source); dirty is
    "true" when a tracked file differs from the commit, "false" when none does, "unknown" outside git."""
    here = Path(where) if where is not None else Path(ulorl.__file__).resolve().parent
    if here.is_file():
        here = here.parent
    commit = (_git(["rev-parse", "HEAD"], here) or "").strip()
    if not commit:
        return UNKNOWN, UNKNOWN
    status = _git(["status", "--porcelain", "--untracked-files=no"], here)
    return commit, UNKNOWN if status is None else str(bool(status.strip())).lower()


def spec_tags(path: str | os.PathLike[str]) -> dict[str, str]:
    """``ulorl.spec`` (relative to its git checkout's root when in one, else absolute) and
    ``ulorl.spec_sha256`` of the spec file ``path``; {} when it cannot be read."""
    p = Path(path).resolve()
    try:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
    except OSError:
        return {}
    root = (_git(["rev-parse", "--show-toplevel"], p.parent) or "").strip()
    name = str(p)
    if root:
        try:
            name = p.relative_to(Path(root).resolve()).as_posix()
        except ValueError:
            pass
    return {SPEC_TAG: name, SPEC_HASH_TAG: digest}


def blas_build(config_text: str) -> str:
    """The BLAS torch was built with, from ``torch.__config__.show()``: ``"BLAS_INFO=open, ..."`` ->
    ``"open"``; "unknown" when the text names none."""
    m = re.search(r"BLAS_INFO=([^,\s]+)", config_text)
    return m.group(1) if m else UNKNOWN


def machine_tags() -> dict[str, str]:
    """``ulorl.hw.*`` and ``ulorl.version.*`` of this process (torch's threads as set now)."""
    import torch
    import transformers

    cpu = _platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    try:
        blas = blas_build(torch.__config__.show())
    except Exception:  # a build without the config report
        blas = UNKNOWN
    return {
        "ulorl.hw.cpu": cpu or UNKNOWN,
        "ulorl.hw.cores": str(os.cpu_count()),
        "ulorl.hw.host": socket.gethostname(),
        "ulorl.hw.threads": str(torch.get_num_threads()),
        BLAS_TAG: blas,
        "ulorl.hw.gpu": gpu,
        "ulorl.version.torch": torch.__version__,
        "ulorl.version.transformers": transformers.__version__,
        "ulorl.version.ulorl": ulorl.__version__,
        "ulorl.version.python": _platform.python_version(),
    }


def start_tags() -> dict[str, str]:
    """Every provenance tag known when a run starts (the spec's come from the caller)."""
    commit, dirty = git_state()
    return {**machine_tags(), GIT_COMMIT_TAG: commit, GIT_DIRTY_TAG: dirty, STARTED_TAG: utc_now()}


def row_provenance(tags: dict[str, str], start_ms: Optional[int | float] = None,
                   wall_s: Optional[float] = None) -> dict[str, str]:
    """What a results row says of where and when its run was made, from the run's tags; a run tracked
    before these tags existed: the start from MLflow's ``start_ms``, the end derived as start +
    ``time/wall_s`` (``ended_from: "start + time/wall_s"``), else "unknown"."""
    started = tags.get(STARTED_TAG) or (iso_utc(start_ms) if start_ms else UNKNOWN)
    ended, ended_from = tags.get(ENDED_TAG), "tag"
    if not ended:
        ended, ended_from = ((iso_utc(float(start_ms) + 1000.0 * float(wall_s)), "start + time/wall_s")
                             if start_ms and wall_s is not None else (UNKNOWN, UNKNOWN))
    keys = {"commit": GIT_COMMIT_TAG, "dirty": GIT_DIRTY_TAG, "spec": SPEC_TAG, "spec_sha256": SPEC_HASH_TAG,
            "cpu": "ulorl.hw.cpu", "cores": "ulorl.hw.cores", "host": "ulorl.hw.host", "threads": "ulorl.hw.threads",
            "blas": BLAS_TAG, "torch": "ulorl.version.torch"}
    out = {name: tags.get(tag) or UNKNOWN for name, tag in keys.items()}
    return {**out, "started": started, "ended": ended, "ended_from": ended_from}


__all__ = ["BLAS_TAG", "ENDED_TAG", "GIT_COMMIT_TAG", "GIT_DIRTY_TAG", "INHERITED_TAGS", "SPEC_HASH_TAG", "SPEC_TAG",
           "STARTED_TAG", "UNKNOWN", "blas_build", "git_state", "iso_utc", "machine_tags", "row_provenance",
           "spec_tags", "start_tags", "utc_now"]
