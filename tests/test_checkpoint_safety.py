"""Checkpoints a crash cannot tear, damaged ones named with the command that gets past them, and the
commands printed after a stop or a failure that work pasted as printed.

* A checkpoint's files and folder are fsynced before it is renamed into place, ``latest`` after that.
* A damaged checkpoint (torn file, half-written state) is named with its file and the intact one before
  it; the printed command resumes from that one and every MLflow metric keeps one point per step.
* A full disk at the first checkpoint does not offer a resume (there is none) but the command that
  starts the run again in the same folder and MLflow run.
* SIGTERM stops a run with exit 143 and prints the resume command with the run's overrides.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ulorl.cli import train as train_cli
from ulorl.train import checkpoint as ckpt_io
from ulorl.train.checkpoint import CorruptCheckpointError, check_checkpoint, write_checkpoint

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "quickstart.yaml"
TINY = ["rollout.prompts_per_step=1", "rollout.group_size=2", "rollout.max_response_len=16", "rollout.segments=1",
        "algo.dynamic_sampling=false", "eval.every=0", "train.checkpoint_every=1", "train.threads=1"]


def _payload(d: Path) -> None:
    (d / "model").mkdir()
    (d / "model" / "weights.bin").write_bytes(b"w" * 1000)


def _run_state(run_dir: Path, uri: str) -> dict:
    """Everything a refused command must leave as it was: the run folder's files and sizes, the run's
    status and every metric's points."""
    files = {str(p.relative_to(run_dir)): p.stat().st_size for p in sorted(run_dir.rglob("*")) if p.is_file()}
    client = MlflowClient(uri)
    rid = (run_dir / "mlflow_run_id").read_text().strip()
    run = client.get_run(rid)
    points = {k: sorted((m.step, m.value) for m in client.get_metric_history(rid, k)) for k in run.data.metrics}
    return {"files": files, "status": run.info.status, "points": points}


def _one_point_per_step(uri: str, rid: str) -> dict[str, list[int]]:
    client = MlflowClient(uri)
    steps = {k: [m.step for m in client.get_metric_history(rid, k)] for k in client.get_run(rid).data.metrics}
    twice = {k: s for k, s in steps.items() if len(s) != len(set(s))}
    assert not twice, f"steps logged twice: {twice}"
    return steps


# ----------------------------------------------------------------------------- writing
def test_a_checkpoint_is_durable_before_it_becomes_latest(tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append(("replace", f"{src} -> {dst}"))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    final = write_checkpoint(tmp_path, 1, {"step": 1}, _payload)
    root = final.parent
    i_move = next(i for i, (kind, what) in enumerate(events) if kind == "replace" and what.endswith(f"-> {final}"))
    tmp = events[i_move][1].split(" -> ")[0]
    synced_before = {Path(p) for kind, p in events[:i_move] if kind == "fsync"}
    written = [p.relative_to(final) for p in final.rglob("*")]
    assert {Path(tmp) / rel for rel in written} | {Path(tmp)} <= synced_before   # every file and folder
    assert {"manifest.json", "trainer_state.json", "rng.pt", "model/weights.bin"} <= {str(r) for r in written}
    i_latest = next(i for i, (kind, what) in enumerate(events) if kind == "replace" and what.endswith("latest"))
    assert i_move < i_latest
    assert ("fsync", str(root)) in events[i_move:i_latest]           # the rename itself is on disk first
    assert ("fsync", str(root / ".latest.tmp")) in events[i_move:i_latest]
    assert events[-1] == ("fsync", str(root))


def test_a_torn_or_half_written_checkpoint_is_named_with_the_one_before(tmp_path):
    first = write_checkpoint(tmp_path, 1, {"step": 1}, _payload, keep=3)
    second = write_checkpoint(tmp_path, 2, {"step": 2}, _payload, keep=3)
    assert check_checkpoint(second) == second
    weights = second / "model" / "weights.bin"
    weights.write_bytes(b"w" * 400)                                  # a write cut short
    with pytest.raises(CorruptCheckpointError) as err:
        check_checkpoint(second)
    assert str(err.value) == (
        f"checkpoint {second} is damaged: {weights} has 400 bytes, 1000 when it was written; the checkpoint before "
        f"it, step_000001, is intact: continue from it with --resume {first} (its later steps run again, each logged "
        "once to MLflow)")
    assert err.value.previous == first and err.value.checkpoint == second
    (first / "trainer_state.json").write_text('{"step": 1, "pools": [1, 2')
    with pytest.raises(CorruptCheckpointError) as err:
        check_checkpoint(first)
    assert str(err.value).startswith(f"checkpoint {first} is damaged: {first / 'trainer_state.json'} is not "
                                     "readable JSON (")
    assert str(err.value).endswith("as a write cut short leaves it; no intact checkpoint before it exists: start the "
                                   "run again")
    with pytest.raises(CorruptCheckpointError, match="no intact checkpoint before it"):
        check_checkpoint(second)                                    # the one before is damaged too


# ----------------------------------------------------------------------------- resuming past a damaged one
def test_a_damaged_latest_checkpoint_is_named_and_the_printed_command_resumes_without_a_duplicate_step(
        tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    over = [*TINY, "train.keep_checkpoints=3"]
    assert train_cli.main([str(QUICK), "train.max_steps=2", *over, "--tracking-uri", uri, "--run-dir", str(run_dir),
                           "--no-progress"]) == 0
    capsys.readouterr()
    ckpts = run_dir / "checkpoints"
    state = ckpts / "step_000002" / "trainer_state.json"
    state.write_text(state.read_text()[:200])                        # half written
    before = _run_state(run_dir, uri)
    resume = [str(QUICK), "train.max_steps=3", *over, "--tracking-uri", uri, "--resume", str(run_dir), "--no-progress"]
    assert train_cli.main(resume) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"ulorl-train: checkpoint {ckpts / 'step_000002'} is damaged: {state} is not readable "
                             "JSON (")
    assert err[0].endswith(f"as a write cut short leaves it; the checkpoint before it, step_000001, is intact: "
                           f"continue from it with --resume {ckpts / 'step_000001'} (its later steps run again, each "
                           "logged once to MLflow):")
    cmd = shlex.split(err[1])
    assert cmd == ["ulorl-train", str(QUICK), "train.max_steps=3", *over, "--tracking-uri", uri, "--resume",
                   str(ckpts / "step_000001")]                       # the run's overrides kept
    assert _run_state(run_dir, uri) == before                         # refused: nothing changed or lost

    assert train_cli.main(cmd[1:]) == 0                               # pasted as printed
    rid = (run_dir / "mlflow_run_id").read_text().strip()
    steps = _one_point_per_step(uri, rid)
    assert sorted(steps["time/step_s"]) == [1, 2, 3]
    assert MlflowClient(uri).get_run(rid).info.status == "FINISHED"
    # the damaged checkpoint is kept aside as it was, not loaded
    assert len((ckpts / "set_aside" / "step_000002" / "trainer_state.json").read_text()) == 200
    assert (ckpts / "latest").read_text().strip() == "step_000003" and check_checkpoint(ckpts / "step_000003")


# ----------------------------------------------------------------------------- a full disk at the first checkpoint
def _fill_the_disk(*args, **kwargs):
    with open("/dev/full", "wb") as f:   # a real ENOSPC from the kernel
        f.write(b"x" * 65536)
        f.flush()


def test_a_full_disk_at_the_first_checkpoint_offers_no_resume_but_the_command_that_starts_again(
        tmp_path, capsys, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    monkeypatch.setattr(ckpt_io, "capture_rng_state", _fill_the_disk)
    argv = [str(QUICK), "train.max_steps=1", *TINY, "--tracking-uri", uri, "--run-dir", str(run_dir), "--no-progress"]
    assert train_cli.main(argv) == 1
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    root = run_dir / "checkpoints"
    assert err[-2].startswith(f"ulorl-train: checkpoint of step 1 not written: no space left on the device holding "
                              f"{root} (")
    assert err[-2].endswith("its temporary folder was removed and no earlier checkpoint exists, so there is nothing "
                            "to resume; free space there, then start the run again (its folder and MLflow run are "
                            "reused):")
    assert "--resume" not in err[-2] + err[-1]
    cmd = shlex.split(err[-1])
    assert cmd == ["ulorl-train", str(QUICK), "train.max_steps=1", *TINY, "--tracking-uri", uri, "--run-dir",
                   str(run_dir)]
    assert sorted(p.name for p in root.iterdir()) == []               # no temporary folder left
    monkeypatch.undo()                                                # space freed
    assert train_cli.main(cmd[1:]) == 0
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("ulorl").experiment_id])   # the same run
    assert run.info.run_id == (run_dir / "mlflow_run_id").read_text().strip()
    assert run.info.status == "FINISHED"
    assert _one_point_per_step(uri, run.info.run_id)["time/step_s"] == [1]


def test_the_library_message_of_a_first_checkpoint_on_a_full_disk(tmp_path):
    def fills(d: Path) -> None:
        _payload(d)
        _fill_the_disk()

    with pytest.raises(ckpt_io.CheckpointSpaceError) as err:
        write_checkpoint(tmp_path, 1, {"step": 1}, fills)
    assert err.value.kept is None and "continue the run with --resume" not in str(err.value)
    assert err.value.__cause__.errno == errno.ENOSPC


# ----------------------------------------------------------------------------- SIGTERM
def test_sigterm_exits_143_and_prints_a_resume_command_that_works_as_printed(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    argv = [str(QUICK), "train.max_steps=4", *TINY, "--tracking-uri", uri, "--run-dir", str(run_dir), "--no-progress"]

    def terminate_after_the_first_checkpoint() -> None:
        deadline = time.time() + 600
        while not (run_dir / "checkpoints" / "latest").exists() and time.time() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)   # what a scheduler's kill sends

    threading.Thread(target=terminate_after_the_first_checkpoint, daemon=True).start()
    assert train_cli.main(argv) == 143
    out = capsys.readouterr().out.splitlines()
    rid = (run_dir / "mlflow_run_id").read_text().strip()
    stopped = json.loads((run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
                          / "trainer_state.json").read_text())["step"]
    assert 1 <= stopped < 4
    assert out[0] == f"run {rid} interrupted after {stopped} steps (checkpoint saved); continue with:"
    cmd = shlex.split(out[1])
    assert cmd == ["ulorl-train", str(QUICK), "train.max_steps=4", *TINY, "--tracking-uri", uri, "--resume",
                   str(run_dir)]
    assert MlflowClient(uri).get_run(rid).info.status == "KILLED"
    assert train_cli.main(cmd[1:]) == 0                               # pasted as printed: not refused
    assert sorted(_one_point_per_step(uri, rid)["time/step_s"]) == [1, 2, 3, 4]
    assert MlflowClient(uri).get_run(rid).info.status == "FINISHED"
