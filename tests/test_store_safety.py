"""Tracking stores: several processes starting together on a new SQLite store all succeed (its tables are
created once, under a lock), and a read-only store is refused up front with its path and the fix."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ulorl.tracking import TrackingStoreError, require_store_folder

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "quickstart.yaml"
TINY = ["train.max_steps=1", "rollout.prompts_per_step=1", "rollout.group_size=2", "rollout.max_response_len=16",
        "rollout.segments=1", "algo.dynamic_sampling=false", "eval.every=0", "train.checkpoint_every=1"]

# Each racer imports everything first, waits for the start file, then opens the store and writes a run.
RACER = r'''
import sys, time
from pathlib import Path
from mlflow.tracking import MlflowClient
from ulorl.tracking import prepare_store
import alembic, sqlalchemy  # noqa: F401  (imported before the start, as in a real run)
uri, go, name = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
Path(f"{go}.ready.{name}").touch()
while not go.exists():
    time.sleep(0.005)
prepare_store(uri)
client = MlflowClient(uri)
try:
    exp = client.create_experiment("race")
except Exception:   # created by another racer
    exp = client.get_experiment_by_name("race").experiment_id
run = client.create_run(exp, run_name=name)
client.log_metric(run.info.run_id, "x", 1.0, step=1)
client.set_terminated(run.info.run_id)
print("ok", run.info.run_id)
'''


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "platform"), "OMP_NUM_THREADS": "1"}


def test_three_processes_opening_a_new_store_together_all_write_their_run(tmp_path):
    """Without the lock, 0 to 1 of 3 such racers survived (``duplicate column name: step``)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", RACER, uri, str(go), f"r{i}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env()) for i in range(3)]
    deadline = time.time() + 180
    while len(list(tmp_path.glob("go.ready.*"))) < 3 and time.time() < deadline:
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
        time.sleep(0.1)
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(err[-1500:] for _, err in outs)
    runs = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("race").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["r0", "r1", "r2"]
    assert all(r.info.status == "FINISHED" and r.data.metrics["x"] == 1.0 for r in runs)


@pytest.mark.slow
def test_three_train_runs_started_together_on_a_new_store_all_complete(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    procs = [subprocess.Popen([sys.executable, "-m", "ulorl.cli.train", str(QUICK), *TINY, "--tracking-uri", uri,
                               "--run-dir", str(tmp_path / f"run{i}"), "--no-progress", "train.threads=1"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
             for i in range(3)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(err[-2000:] for _, err in outs)
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("ulorl").experiment_id])
    assert len(runs) == 3 and all(r.info.status == "FINISHED" for r in runs)
    assert sorted(r.data.tags["ulorl.run_dir"] for r in runs) == [str(tmp_path / f"run{i}") for i in range(3)]
    for i in range(3):
        assert (tmp_path / f"run{i}" / "checkpoints" / "latest").read_text().strip() == "step_000001"


def read_only_command(folder: Path, cmd: list[str]) -> list[str]:
    """``cmd`` run with ``folder`` read-only for it. Root ignores permission bits: a read-only bind mount in a
    private mount namespace (gone when the command ends); a normal user: the fixture's chmod does it."""
    if os.geteuid() != 0:
        return cmd
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(folder), *cmd]


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_missing_and_read_only_folders_are_named(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="missing does not exist"):
        require_store_folder(f"sqlite:///{tmp_path / 'missing' / 'x.db'}")
    require_store_folder(f"sqlite:///{tmp_path / 'x.db'}")  # writable: fine
    require_store_folder("http://127.0.0.1:5000")           # a server: its own business
    assert issubclass(TrackingStoreError, ValueError)        # the CLIs' "bad input" exit 2
    from ulorl.cli import train as train_cli

    # checked before --ray starts anything (the trainer's actor would fail with a Ray traceback)
    assert train_cli.main([str(QUICK), "--ray", "--tracking-uri", f"sqlite:///{tmp_path / 'missing' / 'x.db'}"]) == 2
    assert "missing does not exist" in capsys.readouterr().err


@pytest.fixture()
def read_only_store(tmp_path):
    """A store with one finished run, in a folder the commands of ``read_only_command`` see read-only."""
    folder = tmp_path / "store"
    folder.mkdir()
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("kept"))
    client.log_metric(run.info.run_id, "x", 3.0, step=1)
    client.set_terminated(run.info.run_id)
    if os.geteuid() != 0:
        for p in [*folder.rglob("*"), folder]:
            p.chmod(0o555 if p.is_dir() else 0o444)
    yield folder, uri, run.info.run_id
    for p in [folder, *folder.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


def test_read_only_store_is_refused_by_train_and_sweep_at_once(read_only_store, tmp_path):
    folder, uri, run_id = read_only_store
    before = _digest(folder)
    t0 = time.perf_counter()
    train = subprocess.run(read_only_command(folder, [sys.executable, "-m", "ulorl.cli.train", str(QUICK), *TINY,
                                                       "--tracking-uri", uri, "--run-dir", str(tmp_path / "run")]),
                           capture_output=True, text=True, env=_env(), timeout=300)
    assert train.returncode == 2, train.stderr[-3000:]
    lines = [x for x in train.stderr.splitlines() if x.strip()]
    assert lines == [f"ulorl-train: tracking URI {uri}: the folder {folder} is on a read-only file system, so no run "
                     f"can be recorded; make it writable (chmod u+w {folder}, or remount it read-write) or give "
                     "another --tracking-uri"], train.stderr[-3000:]
    assert not (tmp_path / "run").exists()
    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: s\nbase: {QUICK}\nspace:\n  algo.mpt.tau: {{grid: [0.9, 0.99]}}\n"
                    "search: {algorithm: grid}\nmetric: rollout/reward_mean\nnum_samples: 1\nmax_concurrent: 2\n")
    sweep = subprocess.run(read_only_command(folder, [sys.executable, "-m", "ulorl.cli.sweep", str(spec),
                                                       "--tracking-uri", uri, "--output-dir", str(tmp_path / "out")]),
                           capture_output=True, text=True, env=_env(), timeout=300)
    assert sweep.returncode == 2, sweep.stderr[-3000:]
    assert sweep.stderr.strip().splitlines()[-1] == lines[0].replace("ulorl-train", "ulorl-sweep")
    assert "Traceback" not in sweep.stderr and "Traceback" not in train.stderr
    assert time.perf_counter() - t0 < 240   # no minutes of MLflow retries
    assert _digest(folder) == before        # nothing in the store changed
    assert MlflowClient(uri).get_run(run_id).data.metrics["x"] == 3.0
