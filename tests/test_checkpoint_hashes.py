"""A checkpoint file whose bytes changed in place (same size) is caught by its content hash on resume:
the damaged file and the intact checkpoint before it are named, with the command that resumes from it;
nothing of the run changes. A manifest of an older ulorl (sizes only) still loads, with a warning."""

from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path

import pytest
from test_checkpoint_safety import QUICK, TINY, _run_state

from ulorl.cli import train as train_cli
from ulorl.train import checkpoint as ckpt_io
from ulorl.train.checkpoint import CorruptCheckpointError, check_checkpoint, write_checkpoint

KIB4 = 4096


def _overwrite_middle(path: Path, n: int = KIB4) -> None:
    """Overwrite ``n`` bytes in the middle of ``path`` with their complement: same size, other content."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + n] = bytes(b ^ 0xFF for b in data[mid:mid + n])
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(mid)
        f.write(data[mid:mid + n])
    assert path.stat().st_size == size


def _payload(d: Path) -> None:
    (d / "model").mkdir()
    (d / "model" / "weights.bin").write_bytes(bytes(range(256)) * 64)   # 16 KiB


def test_the_manifest_records_a_sha256_of_every_file(tmp_path):
    ckpt = write_checkpoint(tmp_path, 1, {"step": 1}, _payload)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert set(manifest["sha256"]) == set(manifest["files"]) == {"model/weights.bin", "rng.pt", "trainer_state.json"}
    import hashlib
    assert manifest["sha256"]["model/weights.bin"] == hashlib.sha256(bytes(range(256)) * 64).hexdigest()


def test_bytes_changed_in_place_are_named_with_the_checkpoint_before(tmp_path):
    first = write_checkpoint(tmp_path, 1, {"step": 1}, _payload, keep=3)
    second = write_checkpoint(tmp_path, 2, {"step": 2}, _payload, keep=3)
    weights = second / "model" / "weights.bin"
    _overwrite_middle(weights)
    with pytest.raises(CorruptCheckpointError) as err:
        check_checkpoint(second)
    text = str(err.value)
    assert text.startswith(f"checkpoint {second} is damaged: {weights} does not hold the bytes written (sha256 ")
    assert text.endswith("changed on disk since, its size unchanged; the checkpoint before it, step_000001, is "
                         f"intact: continue from it with --resume {first} (its later steps run again, each logged "
                         "once to MLflow)")
    assert err.value.previous == first
    _overwrite_middle(first / "model" / "weights.bin")               # the one before changed too: none offered
    with pytest.raises(CorruptCheckpointError, match="no intact checkpoint before it exists"):
        check_checkpoint(second)


def test_a_manifest_without_hashes_still_loads_with_a_warning(tmp_path, caplog):
    ckpt = write_checkpoint(tmp_path, 1, {"step": 1}, _payload)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    del manifest["sha256"]                                           # as an older ulorl wrote it
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    _overwrite_middle(ckpt / "model" / "weights.bin")                 # undetectable without hashes
    with caplog.at_level(logging.WARNING, logger=ckpt_io.__name__):
        assert check_checkpoint(ckpt) == ckpt
    assert any(f"checkpoint {ckpt} has no content hashes (written by an older ulorl)" in r.getMessage()
               for r in caplog.records)
    (ckpt / "model" / "weights.bin").write_bytes(b"short")            # sizes are still checked
    with pytest.raises(CorruptCheckpointError, match="has 5 bytes, 16384 when it was written"):
        check_checkpoint(ckpt)


def test_resume_refuses_weights_changed_in_place_and_names_the_previous_checkpoint(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    over = [*TINY, "train.keep_checkpoints=3"]
    assert train_cli.main([str(QUICK), "train.max_steps=2", *over, "--tracking-uri", uri, "--run-dir", str(run_dir),
                           "--no-progress"]) == 0
    capsys.readouterr()
    ckpts = run_dir / "checkpoints"
    weights = ckpts / "step_000002" / "model" / "model.safetensors"
    _overwrite_middle(weights)
    before = _run_state(run_dir, uri)
    resume = [str(QUICK), "train.max_steps=3", *over, "--tracking-uri", uri, "--resume", str(run_dir), "--no-progress"]
    assert train_cli.main(resume) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"ulorl-train: checkpoint {ckpts / 'step_000002'} is damaged: {weights} does not hold "
                             "the bytes written (sha256 ")
    assert err[0].endswith(f"the checkpoint before it, step_000001, is intact: continue from it with --resume "
                           f"{ckpts / 'step_000001'} (its later steps run again, each logged once to MLflow):")
    assert shlex.split(err[1]) == ["ulorl-train", str(QUICK), "train.max_steps=3", *over, "--tracking-uri", uri,
                                   "--resume", str(ckpts / "step_000001")]
    assert _run_state(run_dir, uri) == before                         # refused: nothing trained, nothing lost
