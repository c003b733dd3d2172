"""Ctrl-C, SIGTERM and kill -9 on ulorl-sweep and --resume: exit code, message, the MLflow store's state,
and the driver's tracking server (never left running, its auth folder and password gone with it).

Fast tests drive the pieces on a real MLflow store with scripted trial states (and one real tracking
server); the slow tests send SIGINT to a real ``ulorl-sweep`` (Ray Tune, trainer trials) and resume it
twice, and kill a real ``ulorl-sweep`` with SIGKILL and resume it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mlflow_store import StoreBase, migrated_empty_db
from ulorl.cli import sweep as cli
from ulorl.sweep.console import SweepView
from ulorl.sweep.launch import STATE_FILE, StopSignals, SweepAlreadyFinished, SweepInterrupted, SweepRunner, cut_short
from ulorl.sweep.parent_run import SweepParentRun
from ulorl.sweep.server import STATE_FILE as SERVER_STATE
from ulorl.sweep.server_guard import cmdline as _cmdline
from ulorl.sweep.server_guard import group_members as _group
from ulorl.sweep.spec import load_sweep

ROOT = Path(__file__).resolve().parents[1]
QUICK = (ROOT / "experiments" / "quickstart.yaml").as_posix()


def _spec(tmp_path: Path, steps: int = 4) -> Path:
    """One grid trial of a few tiny steps, no held-out eval (the objective is time/step_s)."""
    p = tmp_path / "tiny.yaml"
    p.write_text(f"""name: tiny
base: {QUICK}
overrides:
  rollout.prompts_per_step: 2
  rollout.group_size: 4
  rollout.max_response_len: 64
  train.checkpoint_every: 1
  eval.every: 0
space:
  algo.mpt.tau: {{grid: [0.9]}}
search: {{algorithm: grid}}
metric: time/step_s
mode: min
num_samples: 1
max_concurrent: 1
resources: {{cpu: 2}}
stop: {{steps: {steps}}}
""")
    return p


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return migrated_empty_db(tmp_path_factory.mktemp("template"))


def _sweep_store(tmp_path: Path, template: Path) -> tuple[StoreBase, str, list[str]]:
    """A parent sweep run (RUNNING) with a finished and a running child, as an interrupted sweep leaves them."""
    store = StoreBase(tmp_path, template)
    parent = store.client.create_run(store.exp, run_name="sweep-tiny", tags={"ulorl.kind": "sweep"}).info.run_id
    kids = []
    for status in ("FINISHED", "RUNNING"):
        rid = store.client.create_run(store.exp, run_name="tiny-t", tags={"mlflow.parentRunId": parent,
                                                                          "ulorl.kind": "train"}).info.run_id
        if status == "FINISHED":
            store.client.set_terminated(rid, "FINISHED")
        kids.append(rid)
    return store, parent, kids


def _loaded(spec: Path) -> tuple:
    """(spec, base, base path) of a spec file, as SweepParentRun.finish takes them."""
    sweep, base_path, base = load_sweep(spec)
    return sweep, base, base_path


def test_interrupt_marks_parent_and_running_trials_killed_and_lists_them(tmp_path, template):
    store, parent, (done, running) = _sweep_store(tmp_path, template)
    sweep_dir = tmp_path / "out" / "sweeps" / "tiny"
    view = SweepView("tiny", planned=3, steps_per_trial=20, metric="time/step_s", out=open(os.devnull, "w"),
                     live=False)
    view.started("a", "search", "tau=0.9")
    view.finished("a")
    view.started("b", "search", "tau=0.99")
    view.result("b", 3, None)
    SweepParentRun(store.uri, parent, sweep_dir).mark_killed()
    exc = SweepInterrupted.from_view(view, parent, sweep_dir)
    assert exc.unfinished == ["search tau=0.99 (step 3/20, running)"] and exc.not_started == 1
    assert exc.parent_run_id == parent and exc.signum == signal.SIGINT
    c = MlflowClient(store.uri)
    assert c.get_run(parent).info.status == "KILLED"
    assert c.get_run(running).info.status == "KILLED" and c.get_run(done).info.status == "FINISHED"


def test_cli_prints_the_unfinished_trials_and_the_resume_command_and_no_verdict(capsys):
    args = cli.build_parser().parse_args(["sweeps/mpt_threshold.yaml", "--tracking-uri", "sqlite:////x/m.db",
                                          "--output-dir", "/x/out"])
    exc = SweepInterrupted(["search tau=0.99 (step 3/20, running)"], 2, "abc123", Path("/x/out/sweeps/tiny"))
    cli._report_interrupted(exc, args)
    out, err = capsys.readouterr()
    assert out == ""
    assert "interrupted; the parent run abc123 is marked KILLED" in err
    assert "unfinished trials (1 started, 2 not started yet):\n  search tau=0.99 (step 3/20, running)" in err
    assert ("ulorl-sweep sweeps/mpt_threshold.yaml --tracking-uri sqlite:////x/m.db --output-dir /x/out --resume"
            in err)
    assert "verdict:" not in err


def test_summary_metrics_are_logged_once_when_the_summary_runs_again(tmp_path, template):
    store, parent, _ = _sweep_store(tmp_path, template)
    run = SweepParentRun(store.uri, parent, tmp_path / "out" / "sweeps" / "tiny")
    run.finish(*_loaded(_spec(tmp_path)))
    run.finish(*_loaded(_spec(tmp_path)))     # a summary cut short and done again on --resume
    c = MlflowClient(store.uri)
    assert [m.step for m in c.get_metric_history(parent, "sweep/trials")] == [0]
    assert c.get_run(parent).info.status == "FINISHED"


def test_a_tune_result_with_trials_left_over_is_cut_short():
    class Grid:   # what cut_short reads of a Tune ResultGrid
        def __init__(self, n: int, terminated: int, errors: int = 0) -> None:
            self.n, self.num_terminated, self.num_errors = n, terminated, errors

        def __len__(self) -> int:
            return self.n

    assert not cut_short(Grid(3, 2, 1), None) and not cut_short(Grid(3, 3), 3)
    assert cut_short(Grid(3, 2), None)                 # a trial neither finished nor failed
    assert cut_short(Grid(2, 2), 3)                    # fewer trials than planned (stopped before the last began)


def test_a_received_signal_stops_the_sweep_and_is_remembered():
    stop = StopSignals()
    assert stop.received is None and stop.signum == signal.SIGINT   # a bare KeyboardInterrupt: Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        stop.receive(signal.SIGTERM)
    assert stop.signum == signal.SIGTERM
    with stop:
        assert stop.received is None                                # each run starts without one


def test_resume_of_a_finished_sweep_says_so_and_logs_nothing(tmp_path, template, capfd):
    store, parent, _ = _sweep_store(tmp_path, template)
    spec = _spec(tmp_path)
    sweep_dir = tmp_path / "out" / "sweeps" / "tiny"
    SweepParentRun(store.uri, parent, sweep_dir).finish(*_loaded(spec))
    sweep_dir.mkdir(parents=True)
    (sweep_dir / STATE_FILE).write_text(json.dumps({"parent_run_id": parent, "tracking_uri": store.uri}))
    (tmp_path / "out" / "sweeps" / "tiny.latest").write_text(str(sweep_dir))
    with pytest.raises(SweepAlreadyFinished):
        SweepRunner(spec, tracking_uri=store.uri, output_dir=tmp_path / "out", resume=True).run()
    capfd.readouterr()
    rc = cli.main([str(spec), "--tracking-uri", store.uri, "--output-dir", str(tmp_path / "out"), "--resume"])
    out, _ = capfd.readouterr()
    assert rc == 0
    # the one finished child of the one planned trial counts (the RUNNING one does not); no "0/1" progress line
    assert f"sweep tiny already finished: 1/1 trials done (parent run {parent}, {sweep_dir})" in out
    assert "nothing to resume" in out and out.count("trials done") == 1
    c = MlflowClient(store.uri)
    assert [m.step for m in c.get_metric_history(parent, "sweep/trials")] == [0]
    assert c.get_run(parent).info.status == "FINISHED"


def test_resume_without_state_says_to_run_it_first(tmp_path, capsys):
    rc = cli.main([str(_spec(tmp_path)), "--tracking-uri", f"sqlite:///{tmp_path}/m.db",
                   "--output-dir", str(tmp_path / "out"), "--resume"])
    assert rc == 2 and "run the sweep without --resume first" in capsys.readouterr().err


def test_resume_command_keeps_the_flags_that_locate_the_sweep():
    args = cli.build_parser().parse_args(["s.yaml", "--num-cpus", "2", "--address", "10.0.0.1:6379"])
    assert cli.resume_command(args) == "ulorl-sweep s.yaml --address 10.0.0.1:6379 --num-cpus 2 --resume"
    args = cli.build_parser().parse_args(["my sweep.yaml"])
    assert cli.resume_command(args) == "ulorl-sweep 'my sweep.yaml' --resume"


@pytest.mark.slow
def test_ctrl_c_then_resume_then_resume_again(tmp_path):
    """SIGINT to the process group (what Ctrl-C sends) once the trial checkpointed: exit 130, parent
    KILLED, the unfinished trial and the resume command printed, no verdict; the resume finishes the same
    parent run with each step and each summary metric logged once; a second resume changes nothing."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out_dir = tmp_path / "out"
    cmd = [sys.executable, "-m", "ulorl.cli.sweep", str(_spec(tmp_path, steps=6)), "--tracking-uri", uri,
           "--output-dir", str(out_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    trials = out_dir / "sweeps" / "tiny" / "trials"
    deadline = time.time() + 900
    while not any((d / "checkpoints" / "latest").exists() for d in trials.glob("*")):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "no trial checkpoint within 900 s"
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, out + err
    assert "interrupted; the parent run" in err and "unfinished trials (1 started" in err, err
    assert "--resume" in err and "verdict:" not in out + err
    parent = json.loads((out_dir / "sweeps" / "tiny" / STATE_FILE).read_text())["parent_run_id"]
    c = MlflowClient(uri)
    assert c.get_run(parent).info.status == "KILLED"
    exp = c.get_run(parent).info.experiment_id
    (kid,) = c.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert kid.info.status == "KILLED"

    res = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "verdict:" in res.stdout
    assert c.get_run(parent).info.status == "FINISHED"
    (kid,) = c.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert kid.info.status == "FINISHED"
    assert sorted(m.step for m in c.get_metric_history(kid.info.run_id, "time/step_s")) == [1, 2, 3, 4, 5, 6]
    assert [m.step for m in c.get_metric_history(parent, "sweep/trials")] == [0]

    again = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "already finished" in again.stdout, again.stdout + again.stderr
    assert [m.step for m in c.get_metric_history(parent, "sweep/trials")] == [0]
    assert len(c.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent}'")) == 1


# ----------------------------------------------------------------------------- a changed spec, SIGTERM
def test_resume_with_a_changed_spec_names_each_change_and_changes_nothing(tmp_path, template, capsys):
    store, parent, kids = _sweep_store(tmp_path, template)
    spec = _spec(tmp_path)
    started, _, base = load_sweep(spec)
    sweep_dir = tmp_path / "out" / "sweeps" / "tiny"
    sweep_dir.mkdir(parents=True)
    (sweep_dir / STATE_FILE).write_text(json.dumps({"parent_run_id": parent, "tracking_uri": store.uri,
                                                    "seed_offsets": None, "spec": started.model_dump(mode="json"),
                                                    "base": base}))
    (tmp_path / "out" / "sweeps" / "tiny.latest").write_text(str(sweep_dir))
    spec.write_text(spec.read_text().replace("{grid: [0.9]}", "{grid: [0.9, 0.99]}").replace("steps: 4", "steps: 5"))
    listing = sorted(p.name for p in sweep_dir.iterdir())
    rc = cli.main([str(spec), "--tracking-uri", store.uri, "--output-dir", str(tmp_path / "out"), "--resume"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == (
        f"ulorl-sweep: --resume: {spec} changed since the sweep in {sweep_dir} started:\n"
        "  space.algo.mpt.tau.grid: [0.9] when the sweep started, [0.9, 0.99] now\n"
        "  stop.steps: 4 when the sweep started, 5 now\n"
        "resume it with the spec as it was, or start a new sweep (run it without --resume: a new folder and parent "
        "run)")
    c = MlflowClient(store.uri)
    assert c.get_run(parent).info.status == "RUNNING"                # untouched
    assert len(c.search_runs([store.exp])) == 3 and sorted(p.name for p in sweep_dir.iterdir()) == listing


def test_sigterm_stops_a_sweep_as_ctrl_c_does_and_exits_143(tmp_path, monkeypatch, capsys):
    runner = SweepRunner(_spec(tmp_path), tracking_uri=f"sqlite:///{tmp_path}/m.db", output_dir=tmp_path / "out")
    before = signal.getsignal(signal.SIGTERM)
    assert runner.stop_signals.received is None and runner.stop_signals.signum == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
        with runner.stop_signals:
            os.kill(os.getpid(), signal.SIGTERM)                      # a real signal to this process
            time.sleep(5)
    assert runner.stop_signals.received == runner.stop_signals.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before                 # restored

    def stopped(self):
        raise SweepInterrupted(["search tau=0.9 (step 1/4, running)"], 0, "p1", Path("/x"), signal.SIGTERM)

    monkeypatch.setattr(SweepRunner, "run", stopped)
    rc = cli.main([str(_spec(tmp_path)), "--tracking-uri", f"sqlite:///{tmp_path}/m.db",
                   "--output-dir", str(tmp_path / "out")])
    assert rc == 143
    assert f"--output-dir {tmp_path / 'out'} --resume" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the tracking server never outlives
def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if _cmdline(p) is not None]


def _wait_until(cond, timeout_s: float = 60.0) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


KILL_SPEC = """name: tiny
base: {base}
overrides:
  rollout.prompts_per_step: 1
  rollout.group_size: 2
  rollout.max_response_len: 16
  rollout.segments: 1
  algo.dynamic_sampling: false
  train.checkpoint_every: 1
  eval.every: 0
  tracking.server_auth: true
space:
  algo.mpt.tau: {{grid: [0.9]}}
search: {{algorithm: grid}}
metric: time/step_s
mode: min
num_samples: 1
max_concurrent: 2
resources: {{cpu: 1}}
stop: {{steps: 2}}
"""


def _marked(mark: bytes) -> list[tuple[int, str, bytes]]:
    """(pid, command line, environment) of every live process whose environment holds ``mark``."""
    found = []
    for env_file in Path("/proc").glob("[0-9]*/environ"):
        try:
            env = env_file.read_bytes()
        except OSError:
            continue
        cmd = _cmdline(int(env_file.parent.name))
        if mark in env and cmd is not None:
            found.append((int(env_file.parent.name), cmd, env))
    return found


@pytest.mark.slow
def test_kill_9_of_ulorl_sweep_leaves_no_server_and_resume_finishes(tmp_path):
    """311 s at load 22 on 2 cores (shared machine): a tiny authenticated sweep (one trial of 2 steps,
    max_concurrent 2, so the driver starts its tracking server) killed with SIGKILL once its parent run
    exists. While it runs, the admin password is in no environment of the server's processes nor in its auth
    config; within seconds of the kill the server (mlflow and uvicorn), its guard and its auth folder are
    gone and no process of the sweep keeps a password in its environment; --resume then finishes the sweep
    and leaves no server or auth folder."""
    mark = f"ULORL_TEST_MARK={uuid.uuid4().hex}"
    spec = tmp_path / "tiny.yaml"
    spec.write_text(KILL_SPEC.format(base=QUICK))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = tmp_path / "out"
    sweep_dir = out / "sweeps" / "tiny"
    password = uuid.uuid4().hex
    env = {**os.environ, mark.split("=")[0]: mark.split("=")[1], "ULORL_MLFLOW_PASSWORD": password,
           "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [sys.executable, "-m", "ulorl.cli.sweep", str(spec), "--tracking-uri", uri, "--output-dir", str(out),
           "--num-cpus", "2"]
    auth_before = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("ulorl-mlflow-auth-*"))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        assert _wait_until(lambda: (sweep_dir / STATE_FILE).exists() or proc.poll() is not None, 600)
        assert proc.poll() is None, "the sweep ended before it could be killed"
        info = json.loads((sweep_dir / SERVER_STATE).read_text())
        members = _group(info["server_pgid"])
        assert len(members) >= 2 and _alive([info["guard_pid"]])     # mlflow server and its uvicorn, the guard
        for pid in members + [info["guard_pid"]]:                     # the password in no environment ...
            assert password.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
        assert password.encode() not in (Path(info["auth_dir"]) / "basic_auth.ini").read_bytes()   # ... or file
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert _wait_until(lambda: not _alive(members + [info["guard_pid"]]), 60), \
            [(p, _cmdline(p)) for p in _alive(members + [info["guard_pid"]])]
        assert not Path(info["auth_dir"]).exists() and not (sweep_dir / SERVER_STATE).exists()
        secrets = (password.encode(), b"MLFLOW_TRACKING_PASSWORD=", b"MLFLOW_AUTH_ADMIN_PASSWORD=")
        holding = [(pid, c) for pid, c, e in _marked(mark.encode()) if any(x in e for x in secrets)]
        assert holding == [], holding                                 # Ray's processes started without them

        res = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, env=env, timeout=1200)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "verdict:" in res.stdout
        parent = json.loads((sweep_dir / STATE_FILE).read_text())["parent_run_id"]
        assert MlflowClient(uri).get_run(parent).info.status == "FINISHED"
        assert not (sweep_dir / SERVER_STATE).exists()
        assert set(Path(os.environ.get("TMPDIR", "/tmp")).glob("ulorl-mlflow-auth-*")) <= auth_before
        left = [(pid, c) for pid, c, _ in _marked(mark.encode()) if "mlflow" in c or "server_guard" in c]
        assert left == [], left
    finally:
        for pid, _, _ in _marked(mark.encode()):                      # whatever of ours is left: gone
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
