"""Atomic checkpoints: model, optimizer, RNG, step, pools, data position, DMMPT state.

Layout: ``<output_dir>/checkpoints/step_000010/`` holds ``model/`` (save_pretrained), the backend's
optimizer state, ``trainer_state.json`` and ``rng.pt``. A checkpoint is built in a temporary sibling
folder and renamed into place, and ``latest`` (a one-line file) is replaced atomically after that, so
a crash mid-write never leaves a corrupt or half-written "latest".
"""

from __future__ import annotations

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
    """Write checkpoint ``step`` atomically; ``save_payload(dir)`` saves model/optimizer files."""
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
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
    latest_tmp = root / f".{LATEST}.tmp"
    latest_tmp.write_text(final.name + "\n")
    os.replace(latest_tmp, root / LATEST)
    _prune(root, keep)
    return final


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
