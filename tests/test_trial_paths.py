"""A sweep trial gets the driver's relative local paths as absolute ones (Tune runs it in another folder)."""

from __future__ import annotations

from pathlib import Path

from ulorl.sweep.trial import absolute_local_paths


def test_relative_local_paths_become_absolute_against_the_driver_folder(tmp_path: Path) -> None:
    (tmp_path / "runs" / "shapes" / "wide").mkdir(parents=True)
    (tmp_path / "train.jsonl").write_text("{}\n")
    config = {"model": {"name_or_path": "runs/shapes/wide"},
              "data": {"train": "train.jsonl", "heldout": "aime2025"}}
    out = absolute_local_paths(config, tmp_path)
    assert out == {"model.name_or_path": str((tmp_path / "runs/shapes/wide").resolve()),
                   "data.train": str((tmp_path / "train.jsonl").resolve())}


def test_names_that_are_not_local_paths_are_left_alone(tmp_path: Path) -> None:
    (tmp_path / "embedded:choice").mkdir()  # even a folder of that name: embedded ids are not paths
    config = {"model": {"name_or_path": "embedded:choice"},
              "data": {"train": "/abs/train.jsonl", "heldout": "Qwen/Qwen3-4B"}}
    assert absolute_local_paths(config, tmp_path) == {}
    assert absolute_local_paths({}, tmp_path) == {}
