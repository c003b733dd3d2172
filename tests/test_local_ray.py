"""A Ray the product starts on one machine listens on 127.0.0.1 only, and SIGTERM stays the command's own.

Every test here runs without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER in the environment (the suite no longer
exports it): a Ray that binds every interface, or a SIGTERM that Ray's C++ handler turns into an abort
(exit 134), fails them. The listening sockets are read from the process tree of the command
(psutil: the driver, GCS, raylet, agents, workers). The slow tests drive a real ``ulorl-sweep`` and a real
``ulorl-train --ray`` and read the MLflow store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from ulorl.scale.interrupt import DriverSignals
from ulorl.scale.local_ray import CLUSTER_SWITCH, LOOPBACK, loopback_only, sigterm_kept

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "quickstart.yaml"
LOOPBACKS = {LOOPBACK, "::ffff:127.0.0.1", "::1"}


def _env() -> dict[str, str]:
    """This process's environment without the variable that would keep a careless Ray on loopback."""
    env = {k: v for k, v in os.environ.items() if k != CLUSTER_SWITCH}
    env.update({"OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"})
    return env


def _listeners(pid: int) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every listening TCP socket of ``pid`` and its descendants."""
    out = []
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for p in procs:
        try:
            out += [(c.laddr.ip, c.laddr.port, p.name()) for c in p.net_connections("inet") if c.status == "LISTEN"]
        except psutil.Error:   # gone meanwhile
            pass
    return out


def _assert_loopback_only(pid: int) -> list[tuple[str, int, str]]:
    seen = _listeners(pid)
    names = " ".join(n for _, _, n in seen)
    assert "gcs_server" in names and "raylet" in names, seen        # Ray's own servers were looked at
    assert [s for s in seen if s[0] not in LOOPBACKS] == [], seen    # none on 0.0.0.0 / :: / an outward IP
    return seen


def _wait_for(cond, proc: subprocess.Popen, what: str, timeout_s: float = 900) -> None:
    deadline = time.time() + timeout_s
    while not cond():
        assert proc.poll() is None, f"ended before {what}: rc {proc.returncode}"
        assert time.time() < deadline, f"no {what} within {timeout_s:.0f} s"
        time.sleep(0.5)


def _default_sigint() -> None:
    """A child started from a shell's background job inherits SIGINT ignored: give it Ctrl-C back."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# ----------------------------------------------------------------------------- the pieces
def test_loopback_only_sets_the_switch_for_ray_and_puts_back_what_was_there(monkeypatch):
    import ray._private.ray_constants as constants

    monkeypatch.setenv(CLUSTER_SWITCH, "1")
    monkeypatch.setattr(constants, "ENABLE_RAY_CLUSTER", True)      # what Ray read when it was imported
    with loopback_only():
        assert os.environ[CLUSTER_SWITCH] == "0"                     # Ray's processes started now read this
        assert constants.ENABLE_RAY_CLUSTER is False                 # and this process's Ray too
    assert os.environ[CLUSTER_SWITCH] == "1" and constants.ENABLE_RAY_CLUSTER is True


def test_sigterm_kept_puts_back_the_callers_handler_and_hands_it_a_sigterm_ray_swallowed():
    seen: list[int] = []

    def mine(signum, frame):
        seen.append(signum)
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, mine)
    try:
        with sigterm_kept():
            signal.signal(signal.SIGTERM, lambda s, f: sys.exit(s))  # what ray.init installs at its start
        assert signal.getsignal(signal.SIGTERM) is mine
        with pytest.raises(KeyboardInterrupt):
            with sigterm_kept():
                raise SystemExit(signal.SIGTERM)                     # Ray's handler ran while Ray started
        assert seen == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)


def test_driver_signals_stop_at_once_before_training_and_hand_the_first_one_on_after():
    sig = DriverSignals()
    with pytest.raises(KeyboardInterrupt):
        sig.receive(signal.SIGTERM)                                  # setup: nothing to finish
    assert sig.hard and sig.signum == signal.SIGTERM
    sig = DriverSignals()
    sig.training = True
    sig.receive(signal.SIGTERM)                                      # the trainer finishes its step
    assert sig.received == signal.SIGTERM and not sig.hard
    with pytest.raises(KeyboardInterrupt):
        sig.receive(signal.SIGINT)                                   # a second one: at once
    assert sig.hard and sig.signum == signal.SIGTERM                 # the first one names the exit code


CHILD = textwrap.dedent("""
    import signal, sys, time
    import ray                                     # imported before: Ray has read its settings already
    from ulorl.scale.local_ray import init_ray

    def stop(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)            # the command's own SIGTERM handling
    init_ray(num_cpus=1, log_to_driver=False)
    print(ray.get(ray.remote(lambda: "worker up").remote()), flush=True)
    try:
        while True:
            time.sleep(0.2)
    except KeyboardInterrupt:
        ray.shutdown()
        print("stopped by its own handler", flush=True)
        sys.exit(143)
""")


def test_a_local_ray_listens_on_loopback_only_and_leaves_sigterm_to_the_command(tmp_path):
    """The smallest path: ``init_ray`` in a process that imported ray first, without the variable. Every
    listening socket of its tree is on loopback; a SIGTERM reaches the process's own handler (exit 143
    after a clean shutdown) instead of Ray's C++ one (``*** SIGTERM received``, exit 134)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(), cwd=tmp_path, start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "worker up", proc.communicate(timeout=60)
        _assert_loopback_only(proc.pid)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 143, err[-3000:]
        assert "stopped by its own handler" in out and "SIGTERM received" not in err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


# ----------------------------------------------------------------------------- ulorl-sweep
SWEEP = """name: tiny
base: {base}
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
stop: {{steps: 200}}
"""


@pytest.mark.slow
def test_sigterm_stops_a_real_sweep_like_ctrl_c_and_its_ray_is_on_loopback_only(tmp_path):
    """~2 min at load 16 on 2 cores: a real ``ulorl-sweep`` (one trainer trial) without the variable in its
    environment. Once its trial checkpointed, no socket of its tree listens beyond loopback; a SIGTERM to
    the driver then ends it as Ctrl-C does: exit 143, the --resume command, parent and trial KILLED."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SWEEP.format(base=QUICK.as_posix()))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out_dir = tmp_path / "out"
    cmd = [sys.executable, "-m", "ulorl.cli.sweep", str(spec), "--tracking-uri", uri, "--output-dir", str(out_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)
    try:
        trials = out_dir / "sweeps" / "tiny" / "trials"
        _wait_for(lambda: any((d / "checkpoints" / "latest").exists() for d in trials.glob("*")), proc,
                  "trial checkpoint")
        seen = _assert_loopback_only(proc.pid)
        assert any("ImplicitFunc" in n for _, _, n in seen), seen      # the trial's worker was looked at too
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, out[-2000:] + err[-3000:]
    assert "SIGTERM received" not in err
    assert "interrupted; the parent run" in err and "unfinished trials (1 started" in err, err
    assert f"continue with:\n  {' '.join(['ulorl-sweep', str(spec), '--tracking-uri', uri])}" in err
    assert f"--output-dir {out_dir} --resume" in err
    parent = json.loads((out_dir / "sweeps" / "tiny" / "sweep_state.json").read_text())["parent_run_id"]
    c = MlflowClient(uri)
    assert c.get_run(parent).info.status == "KILLED"
    kids = c.search_runs([c.get_run(parent).info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert [k.info.status for k in kids] == ["KILLED"]


# ----------------------------------------------------------------------------- ulorl-train --ray
PLACED = ["rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_response_len=32", "rollout.segments=2",
          "eval.every=0", "algo.dynamic_sampling=false", "train.max_steps=1000", "train.checkpoint_every=1",
          "resources.trainer_workers=1", "resources.rollout_engines=1", "resources.cpus_per_trainer_worker=0.5",
          "resources.cpus_per_engine=0.5", "model.name_or_path=embedded"]


@pytest.mark.slow
@pytest.mark.parametrize("sig,to_group", [(signal.SIGTERM, False), (signal.SIGINT, True)], ids=["sigterm", "ctrl-c"])
def test_an_interrupted_ray_training_run_checkpoints_is_killed_and_prints_its_resume_command(tmp_path, sig, to_group):
    """~2 min each at load 16 on 2 cores: ``ulorl-train --ray`` (a trainer actor and an engine actor) is
    stopped after its second step by SIGTERM to the driver, or by Ctrl-C (SIGINT to its process group, as a
    terminal sends it). Its Ray listens on loopback only; the trainer finishes its step, the run is KILLED in
    MLflow with its checkpoint, the command exits 128 + the signal and prints the --resume command."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_dir = tmp_path / "run"
    log = tmp_path / "stderr.txt"
    cmd = [sys.executable, "-m", "ulorl.cli.train", str(QUICK), *PLACED, "--tracking-uri", uri,
           "--run-dir", str(run_dir), "--ray"]
    with open(log, "w") as err_file:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_file, text=True, env=_env(), cwd=tmp_path,
                                start_new_session=True, preexec_fn=_default_sigint)
        try:
            _wait_for(lambda: "\nstep 2:" in log.read_text(), proc, "step 2")
            _assert_loopback_only(proc.pid)
            if to_group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
            out, _ = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    err = log.read_text()
    assert proc.returncode == 128 + sig, out[-2000:] + err[-3000:]
    assert "SIGTERM received" not in err and "Traceback" not in err, err[-3000:]
    assert "interrupted after" in out and "(checkpoint saved); continue with:" in out, out
    assert f"--tracking-uri {uri} --ray --resume {run_dir}" in out
    c = MlflowClient(uri)
    (run,) = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert run.info.status == "KILLED"
    steps = sorted(m.step for m in c.get_metric_history(run.info.run_id, "time/step_s"))
    assert steps and steps == list(range(1, steps[-1] + 1))
    assert (run_dir / "checkpoints" / f"step_{steps[-1]:06d}").is_dir()
