"""Atomic checkpoints: model, optimizer, RNG, step, pools, data position, DMMPT state.

Layout: ``<output_dir>/checkpoints/step_000010/`` holds ``model/`` (save_pretrained), the backend's
optimizer state, ``trainer_state.json`` and ``rng.pt``. A checkpoint is built in a temporary sibling
folder and renamed into place, and ``latest`` (a one-line file) is replaced atomically after that, so
a crash mid-write never leaves a corrupt or half-written "latest". A write that fails removes its
temporary folder (the previous checkpoint stays the latest); a full disk raises
:class:`CheckpointSpaceError`, naming the folder, "no space left" and the free space.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

LATEST = "latest"
# Below this much free space a failed write is put down to a full disk: torch's zip writer reports the
# failed write as "unexpected pos" without the errno; after ENOSPC a file system has ~0 bytes left.
LOW_SPACE_BYTES = 1 << 20


class CheckpointSpaceError(RuntimeError):
    """A checkpoint could not be written for lack of disk space; the message names the folder and the fix."""

    def __init__(self, message: str, root: Path) -> None:
        super().__init__(message)
        self.root = root


def capture_rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_root(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / "checkpoints"


def write_checkpoint(
    output_dir: str | os.PathLike,
    step: int,
    trainer_state: dict[str, Any],
    save_payload: Callable[[Path], None],
    keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` atomically; ``save_payload(dir)`` saves model/optimizer files.

    On any failure the temporary folder (and a half-written ``latest`` pointer) is removed before the
    error propagates; a full disk becomes :class:`CheckpointSpaceError`.
    """
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    latest_tmp = root / f".{LATEST}.tmp"
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        save_payload(tmp)
        torch.save(capture_rng_state(), tmp / "rng.pt")
        with open(tmp / "trainer_state.json", "w") as f:
            json.dump(trainer_state, f)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        latest_tmp.write_text(final.name + "\n")
        os.replace(latest_tmp, root / LATEST)
    except BaseException as exc:
        free = free_bytes(root)  # before the clean-up gives space back
        shutil.rmtree(tmp, ignore_errors=True)
        latest_tmp.unlink(missing_ok=True)
        if isinstance(exc, Exception) and out_of_space(exc, free):
            pointer = root / LATEST
            kept = pointer.read_text().strip() if pointer.is_file() else None
            raise CheckpointSpaceError(
                f"checkpoint of step {step} not written: no space left on the device holding {root} "
                f"({(free or 0) / 2**20:.1f} MiB free); its temporary folder was removed and "
                + (f"the last checkpoint {root / kept} is intact" if kept else "no earlier checkpoint exists")
                + "; free space there, then continue the run with --resume", root) from exc
        raise
    _prune(root, keep)
    return final


def free_bytes(path: str | os.PathLike) -> Optional[int]:
    """Bytes an unprivileged writer may still use on the file system holding ``path`` (None if unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def out_of_space(exc: BaseException, free: Optional[int]) -> bool:
    """True when ``exc`` (or an exception it was raised from) is a full disk: ``ENOSPC``, the message of
    a library that reports it in words (safetensors: "No space left on device (os error 28)"), or any
    error while fewer than :data:`LOW_SPACE_BYTES` are ``free`` (torch's "unexpected pos")."""
    seen: set[int] = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(e) or "os error 28" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return free is not None and free < LOW_SPACE_BYTES


def _prune(root: Path, keep: int) -> None:
    steps = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp_step_*"):
        shutil.rmtree(stale, ignore_errors=True)


def latest_checkpoint(output_dir: str | os.PathLike) -> Optional[Path]:
    root = checkpoint_root(output_dir)
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    if not (path / "trainer_state.json").is_file():
        raise RuntimeError(f"checkpoint pointer {pointer} names {path}, which is incomplete")
    return path


def read_trainer_state(ckpt: Path) -> dict[str, Any]:
    with open(ckpt / "trainer_state.json") as f:
        return json.load(f)


def load_rng(ckpt: Path) -> None:
    restore_rng_state(torch.load(ckpt / "rng.pt", weights_only=False))
