"""Failures that explain themselves: one message naming the file, key or path and the fix, a non-zero exit
code, and nothing in the store or run folder lost or left half-written. Non-UTF-8 data, an empty
experiment, a sweep whose space is empty, a full disk during a checkpoint (the read-only store and
concurrent new stores: test_store_safety.py; --json: test_json_stdout.py)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from ulorl.cli import clean as clean_cli
from ulorl.cli import sweep as sweep_cli
from ulorl.cli import train as train_cli
from ulorl.train.checkpoint import (
    LATEST,
    CheckpointSpaceError,
    latest_checkpoint,
    out_of_space,
    write_checkpoint,
)

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "quickstart.yaml"
TINY = ["rollout.prompts_per_step=1", "rollout.group_size=2", "rollout.max_response_len=16", "rollout.segments=1",
        "algo.dynamic_sampling=false", "eval.every=0", "train.checkpoint_every=1", "train.threads=1"]


def _latin1_jsonl(path: Path) -> Path:
    path.write_bytes(json.dumps({"problem": "What is 1+1?", "answer": "2"}).encode() + b"\n"
                     + '{"problem": "Combien font 2+2, café?", "answer": "4"}\n'.encode("latin-1"))
    return path


# ----------------------------------------------------------------------------- non-UTF-8 data
def test_non_utf8_data_is_named_with_file_and_line_by_clean_and_train(tmp_path, capsys):
    bad = _latin1_jsonl(tmp_path / "raw.jsonl")
    want = (f"{bad}:2: not UTF-8 text (byte 0xe9 at byte 35 of the line); JSONL files must be UTF-8: convert it, "
            f"e.g. iconv -f latin1 -t utf-8 {bad} > {tmp_path / 'raw.utf8.jsonl'}")
    out = tmp_path / "clean" / "out.jsonl"
    assert clean_cli.main([str(bad), "--out", str(out), "--json"]) == 2
    cap = capsys.readouterr()
    assert cap.err.strip() == f"ulorl-clean: error: {want}" and cap.out == ""
    assert not out.parent.exists()                       # no output, no half-written report

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rc = train_cli.main([str(QUICK), f"data.train={bad}", "train.max_steps=1", *TINY, "--tracking-uri", uri,
                         "--run-dir", str(tmp_path / "run"), "--no-progress"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == f"ulorl-train: {want}"
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlflow.db").exists()   # it failed before both


# ----------------------------------------------------------------------------- empty inputs
def test_empty_experiment_yaml_is_refused(tmp_path, capsys):
    for text in ("", "# only a comment\n", "{}\n"):
        empty = tmp_path / "empty.yaml"
        empty.write_text(text)
        rc = train_cli.main([str(empty), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                             "--run-dir", str(tmp_path / "run"), "--no-progress"])
        assert rc == 2
        assert capsys.readouterr().err.strip() == (
            f"ulorl-train: {empty}: the experiment file is empty (no section, no key), so every setting would be a "
            "default; start from experiments/quickstart.yaml, or list the keys it changes (ulorl-train --explain "
            "shows them all)")
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlflow.db").exists()


def test_sweep_with_empty_space_is_refused(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    for body in ("space: {}\n", "space: {}\nsearch: {algorithm: grid}\nnum_samples: 3\n"):
        spec.write_text(f"name: s\nbase: {QUICK}\n{body}")
        rc = sweep_cli.main([str(spec), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                             "--output-dir", str(tmp_path / "out")])
        assert rc == 2
        assert capsys.readouterr().err.strip() == (
            f"ulorl-sweep: {spec}: space is empty, so every trial would run the same configuration; add a key to "
            "space (e.g. algo.mpt.tau: {choice: [0.9, 0.99]}), or with search: {algorithm: grid} list variants or "
            "set repeats > 1")
    assert not (tmp_path / "out").exists() and not (tmp_path / "mlflow.db").exists()
    # a grid that varies through variants or repeats is still a sweep
    spec.write_text(f"name: s\nbase: {QUICK}\nsearch: {{algorithm: grid}}\nrepeats: 2\n")
    assert sweep_cli.main([str(spec), "--dry-run"]) == 0


# ----------------------------------------------------------------------------- a full disk
def _torch_error_of_a_full_disk() -> RuntimeError:
    """What torch.save raises when the disk fills up: writes to /dev/full fail with ENOSPC."""
    try:
        torch.save({"w": torch.zeros(100_000)}, "/dev/full")
    except RuntimeError as exc:
        return exc
    raise AssertionError("writing to /dev/full did not fail")


def test_out_of_space_is_recognised_from_errno_words_or_free_space():
    torch_err = _torch_error_of_a_full_disk()
    assert "unexpected pos" in str(torch_err) and "space" not in str(torch_err)  # no errno, no words
    assert out_of_space(torch_err, free=0)
    assert not out_of_space(torch_err, free=10 << 30)          # the same error with room left: something else
    assert out_of_space(OSError(errno.ENOSPC, "No space left on device"), free=10 << 30)
    assert out_of_space(RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
                        free=None)
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "full")
    assert out_of_space(wrapped, free=None)
    assert not out_of_space(ValueError("bad value"), free=None)


def _state(step: int) -> dict:
    return {"step": step}


def _payload(d: Path) -> None:
    (d / "model").mkdir()
    (d / "model" / "weights.bin").write_bytes(b"w" * 1000)


def test_a_checkpoint_that_fills_the_disk_removes_its_temporary_folder(tmp_path):
    first = write_checkpoint(tmp_path, 1, _state(1), _payload)

    def fills_the_disk(d: Path) -> None:
        _payload(d)
        with open("/dev/full", "wb") as f:   # a real ENOSPC from the kernel
            f.write(b"x" * 65536)
            f.flush()

    with pytest.raises(CheckpointSpaceError) as err:
        write_checkpoint(tmp_path, 2, _state(2), fills_the_disk)
    root = tmp_path / "checkpoints"
    msg = str(err.value)
    assert msg.startswith(f"checkpoint of step 2 not written: no space left on the device holding {root} (")
    assert msg.endswith(f"its temporary folder was removed and the last checkpoint {first} is intact; free space "
                        "there, then continue the run with --resume")
    assert err.value.root == root
    assert sorted(p.name for p in root.iterdir()) == [LATEST, "step_000001"]   # no .tmp_step_*, no .latest.tmp
    assert latest_checkpoint(tmp_path) == first and (first / "model" / "weights.bin").stat().st_size == 1000

    def breaks(d: Path) -> None:
        _payload(d)
        raise ValueError("not a disk problem")

    with pytest.raises(ValueError, match="not a disk problem"):   # other errors pass through, cleaned up too
        write_checkpoint(tmp_path, 2, _state(2), breaks)
    assert sorted(p.name for p in root.iterdir()) == [LATEST, "step_000001"]


DISK_DRIVER = r'''
import json, os, subprocess, sys
runroot, out, quick, uri = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
tiny = json.loads(sys.argv[5])
def listing():
    return sorted(os.path.relpath(os.path.join(d, n), runroot) for d, ds, fs in os.walk(runroot) for n in ds + fs)
cmd = [sys.executable, "-m", "ulorl.cli.train", quick, "train.max_steps=2", *tiny, "--tracking-uri", uri,
       "--no-progress"]
full = subprocess.run(cmd + ["--run-dir", os.path.join(runroot, "run")], capture_output=True, text=True)
after_full = listing()
latest = open(os.path.join(runroot, "run", "checkpoints", "latest")).read().strip()
subprocess.run(["mount", "-o", "remount,size=64m", runroot], check=True)
resumed = subprocess.run(cmd + ["--resume", os.path.join(runroot, "run")], capture_output=True, text=True)
json.dump({"rc": full.returncode, "err": full.stderr, "after_full": after_full, "latest": latest,
           "resume_rc": resumed.returncode, "resume_err": resumed.stderr[-3000:], "after_resume": listing()},
          open(out, "w"))
'''


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="a private tmpfs mount needs root; the /dev/full tests cover the rest")
def test_full_disk_during_training_explains_itself_and_the_run_resumes(tmp_path):
    """The run folder on a 20 MiB tmpfs (a quickstart checkpoint is ~12.3 MiB): step 1's checkpoint fits,
    step 2's fills the disk inside torch.save. Then the tmpfs grows and the run resumes."""
    runroot = tmp_path / "small"
    runroot.mkdir()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    report = tmp_path / "report.json"
    script = 'mount -t tmpfs -o size=20m tmpfs "$0" && exec "$@"'
    subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(runroot),
                    sys.executable, "-c", DISK_DRIVER, str(runroot), str(report), str(QUICK), uri, json.dumps(TINY)],
                   check=True, timeout=1500, env={**os.environ, "PYTHONPATH": str(ROOT / "platform")})
    r = json.loads(report.read_text())
    ckpts = runroot / "run" / "checkpoints"
    assert r["rc"] == 1, r["err"][-3000:]
    lines = [x for x in r["err"].splitlines() if x.strip()]
    assert "Traceback" not in r["err"]
    assert lines[-2].startswith(f"ulorl-train: checkpoint of step 2 not written: no space left on the device "
                                f"holding {ckpts} (0.0 MiB free); its temporary folder was removed and the last "
                                f"checkpoint {ckpts / 'step_000001'} is intact; free space there, then continue "
                                "the run with --resume:"), lines[-3:]
    assert lines[-1] == (f"  ulorl-train {QUICK} train.max_steps=2 {' '.join(TINY)} --tracking-uri {uri} "
                         f"--resume {runroot / 'run'}")   # the run's overrides kept: pasted as printed, it resumes
    assert not [p for p in r["after_full"] if ".tmp" in p], r["after_full"]   # no temporary folder left
    assert r["latest"] == "step_000001"
    assert r["resume_rc"] == 0, r["resume_err"]
    assert "run/checkpoints/step_000002/optimizer.pt" in r["after_resume"]
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("ulorl").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["ulorl.resumed_at_step"] == "1"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "time/step_s")) == [1, 2]
