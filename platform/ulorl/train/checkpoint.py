"""Atomic checkpoints: model, optimizer, RNG, step, pools, data position, DMMPT state.

Layout: ``<output_dir>/checkpoints/step_000010/`` holds ``model/`` (save_pretrained), the backend's
optimizer state, ``trainer_state.json``, ``rng.pt`` and ``manifest.json`` (the size and the sha256 of
every other file). A checkpoint is built in a temporary sibling folder; every file and the folder are fsynced
before it is renamed into place, and ``latest`` (a one-line file) is written the same way and
renamed over the old pointer after that, so a crash or power loss mid-write never leaves a torn
checkpoint as "latest". A write that fails removes its temporary folder (the previous checkpoint stays
the latest); a full disk raises :class:`CheckpointSpaceError`, naming the folder, "no space left" and
the free space.

A resume checks the checkpoint first (:func:`check_checkpoint`: its state parses, every file has the
size and the content hash the manifest recorded, so bytes changed in place are caught, not only a torn
write): a damaged one raises :class:`CorruptCheckpointError` naming the file and the intact checkpoint
before it (a manifest of an older ulorl has sizes only: it still loads, with a warning);
``--resume RUN_DIR/checkpoints/step_N`` continues from that one (:func:`select_checkpoint` moves the
newer ones aside to ``checkpoints/set_aside/``, kept, not loaded).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

log = logging.getLogger(__name__)

LATEST = "latest"
STATE_FILE = "trainer_state.json"
MANIFEST = "manifest.json"
SET_ASIDE = "set_aside"   # newer checkpoints moved out of the way of a resume from an older one
# Below this much free space a failed write is put down to a full disk: torch's zip writer reports the
# failed write as "unexpected pos" without the errno; after ENOSPC a file system has ~0 bytes left.
LOW_SPACE_BYTES = 1 << 20
HASH_CHUNK_BYTES = 1 << 20   # files are hashed in pieces: a multi-GB weights file never sits in memory whole


class CheckpointSpaceError(RuntimeError):
    """A checkpoint could not be written for lack of disk space; the message names the folder and the fix.
    ``kept`` is the intact checkpoint the run can continue from (None: no checkpoint exists yet)."""

    def __init__(self, message: str, root: Path, kept: Optional[Path] = None) -> None:
        super().__init__(message)
        self.root = root
        self.kept = kept


class CorruptCheckpointError(ValueError):
    """A checkpoint a resume would load is damaged (a torn or changed file). ``checkpoint`` is the damaged
    one, ``previous`` the newest intact checkpoint before it (None: there is none)."""

    def __init__(self, message: str, checkpoint: Path, previous: Optional[Path]) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint
        self.previous = previous


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


def _fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder's entry list: a rename in it is durable once this returns)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    """fsync every file and folder under ``folder``, deepest first, ``folder`` itself last."""
    for d, _, files in os.walk(folder, topdown=False):
        for name in files:
            _fsync_path(Path(d) / name)
        _fsync_path(Path(d))


def file_sizes(folder: Path) -> dict[str, int]:
    """``{relative path: bytes}`` of every file under ``folder`` but the manifest itself."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != MANIFEST}


def file_sha256(path: Path) -> str:
    """Hex sha256 of ``path``'s bytes, read :data:`HASH_CHUNK_BYTES` at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(folder: Path, names: list[str]) -> dict[str, str]:
    """``{relative path: sha256}`` of ``names`` (paths relative to ``folder``)."""
    return {rel: file_sha256(folder / rel) for rel in names}


def build_manifest(folder: Path, step: int) -> dict[str, Any]:
    """What ``manifest.json`` records of checkpoint ``folder``: the step, every other file's size
    (``files``: a torn write, found without reading) and sha256 (``sha256``: bytes changed in place)."""
    sizes = file_sizes(folder)
    return {"step": step, "files": sizes, "sha256": file_hashes(folder, list(sizes))}


def write_checkpoint(
    output_dir: str | os.PathLike,
    step: int,
    trainer_state: dict[str, Any],
    save_payload: Callable[[Path], None],
    keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` atomically and durably; ``save_payload(dir)`` saves model/optimizer files.

    Order: payload, RNG, trainer state, manifest; fsync of every file and of the folder; rename into
    place; fsync of ``checkpoints/``; then the ``latest`` pointer the same way. On any failure the
    temporary folder (and a half-written ``latest`` pointer) is removed before the error propagates; a
    full disk becomes :class:`CheckpointSpaceError`.
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
        with open(tmp / STATE_FILE, "w", encoding="utf-8") as f:
            json.dump(trainer_state, f)
        (tmp / MANIFEST).write_text(json.dumps(build_manifest(tmp, step)), encoding="utf-8")
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_path(root)
        with open(latest_tmp, "w", encoding="utf-8") as f:
            f.write(final.name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(latest_tmp, root / LATEST)
        _fsync_path(root)
    except BaseException as exc:
        free = free_bytes(root)  # before the clean-up gives space back
        shutil.rmtree(tmp, ignore_errors=True)
        latest_tmp.unlink(missing_ok=True)
        if isinstance(exc, Exception) and out_of_space(exc, free):
            pointer = root / LATEST
            kept = root / pointer.read_text().strip() if pointer.is_file() else None
            raise CheckpointSpaceError(
                f"checkpoint of step {step} not written: no space left on the device holding {root} "
                f"({(free or 0) / 2**20:.1f} MiB free); its temporary folder was removed and "
                + (f"the last checkpoint {kept} is intact; free space there, then continue the run with --resume"
                   if kept else "no earlier checkpoint exists, so there is nothing to resume; free space there, "
                   "then start the run again (its folder and MLflow run are reused)"), root, kept) from exc
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
    """The checkpoint ``latest`` names (None when the run has none); :class:`CorruptCheckpointError` when
    the pointer names a checkpoint without its state file."""
    root = checkpoint_root(output_dir)
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    if not (path / STATE_FILE).is_file():
        raise corrupt_checkpoint_error(path, f"{path / STATE_FILE} is missing")
    return path


def is_checkpoint_dir(path: Path) -> bool:
    """True for a ``<run>/checkpoints/step_N`` folder (a resume may name one instead of the run)."""
    return path.parent.name == "checkpoints" and path.name.startswith("step_") and path.is_dir()


def checkpoint_problem(ckpt: Path) -> Optional[str]:
    """What is wrong with checkpoint ``ckpt`` (None when it is intact): its state file missing, not
    JSON or without a step; a file the manifest lists missing, of another size (a torn write) or, when
    the manifest has hashes, of other content (bytes changed in place: sizes first, so a torn write is
    named without reading every file)."""
    state_file = ckpt / STATE_FILE
    if not state_file.is_file():
        return f"{state_file} is missing"
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"{state_file} is not readable JSON ({exc}), as a write cut short leaves it"
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        return f"{state_file} holds no step number"
    manifest = ckpt / MANIFEST
    if not manifest.is_file():   # written by an older ulorl: the state file is all there is to check
        return None
    try:
        written = json.loads(manifest.read_text(encoding="utf-8"))
        recorded = written["files"]
        hashes = written.get("sha256", {})
        if not isinstance(recorded, dict) or not isinstance(hashes, dict):
            raise TypeError
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return f"{manifest} is not readable"
    for rel, size in recorded.items():
        f = ckpt / rel
        if not f.is_file():
            return f"{f} is missing"
        if f.stat().st_size != size:
            return f"{f} has {f.stat().st_size} bytes, {size} when it was written"
    for rel, digest in hashes.items():
        f = ckpt / rel
        if not f.is_file():
            return f"{f} is missing"
        actual = file_sha256(f)
        if actual != digest:
            return (f"{f} does not hold the bytes written (sha256 {actual[:16]}..., {digest[:16]}... when it was "
                    "written): changed on disk since, its size unchanged")
    return None


def has_hashes(ckpt: Path) -> bool:
    """True when ``ckpt``'s manifest records content hashes (False: an older ulorl wrote sizes only, or
    there is no manifest)."""
    try:
        return bool(json.loads((ckpt / MANIFEST).read_text(encoding="utf-8")).get("sha256"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return False


def intact_before(ckpt: Path) -> Optional[Path]:
    """The newest intact checkpoint of ``ckpt``'s run older than ``ckpt`` (None: there is none)."""
    older = sorted((p for p in ckpt.parent.glob("step_*") if p.is_dir() and p.name < ckpt.name), reverse=True)
    return next((p for p in older if checkpoint_problem(p) is None), None)


def corrupt_checkpoint_error(ckpt: Path, problem: str) -> CorruptCheckpointError:
    prev = intact_before(ckpt)
    then = (f"the checkpoint before it, {prev.name}, is intact: continue from it with --resume {prev} (its later "
            "steps run again, each logged once to MLflow)" if prev is not None
            else "no intact checkpoint before it exists: start the run again")
    return CorruptCheckpointError(f"checkpoint {ckpt} is damaged: {problem}; {then}", ckpt, prev)


def check_checkpoint(ckpt: Path) -> Path:
    """``ckpt`` when it is intact; else :class:`CorruptCheckpointError` naming the file and the checkpoint
    before it."""
    problem = checkpoint_problem(ckpt)
    if problem:
        raise corrupt_checkpoint_error(ckpt, problem)
    if not has_hashes(ckpt):
        log.warning("checkpoint %s has no content hashes (written by an older ulorl): its files are checked for "
                    "their size only, so bytes changed in place would go unnoticed; it loads as it is, and the next "
                    "checkpoint this run writes records them", ckpt)
    return ckpt


def select_checkpoint(ckpt: Path) -> list[Path]:
    """Make ``ckpt`` (an intact ``step_N`` folder) its run's ``latest``, for a resume from it: newer
    checkpoints of the run move to ``checkpoints/set_aside/`` (kept for inspection, never loaded or
    pruned), so they cannot shadow the steps run again. Returns where they went."""
    root = ckpt.parent
    moved = []
    for newer in sorted(p for p in root.glob("step_*") if p.is_dir() and p.name > ckpt.name):
        dest = root / SET_ASIDE / newer.name
        n = 1
        while dest.exists():
            dest = root / SET_ASIDE / f"{newer.name}.{n}"
            n += 1
        dest.parent.mkdir(exist_ok=True)
        os.replace(newer, dest)
        moved.append(dest)
    latest_tmp = root / f".{LATEST}.tmp"
    with open(latest_tmp, "w", encoding="utf-8") as f:
        f.write(ckpt.name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(latest_tmp, root / LATEST)
    _fsync_path(root)
    return moved


def read_trainer_state(ckpt: Path) -> dict[str, Any]:
    with open(ckpt / STATE_FILE, encoding="utf-8") as f:
        return json.load(f)


def load_rng(ckpt: Path) -> None:
    restore_rng_state(torch.load(ckpt / "rng.pt", weights_only=False))
