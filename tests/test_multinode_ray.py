"""A real 2-node Ray cluster on 127.0.0.1 (token auth on) running a sweep of a placed trial.

Each node is its own ``ray start`` process with one logical GPU, so a trial's trainer bundle and
engine bundle (1 GPU each) must land on different nodes while the work itself runs on CPU. The
trial logs through the driver's MLflow server (basic auth forced on) at its HTTP address; it fails
once and is retried from its checkpoint into the same child run. (One trial: a second one on the same
nodes repeated every check at the cost of another placed start.)
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from leaks import files_holding
from raycluster import LocalRayCluster

ROOT = Path(__file__).resolve().parents[1]
QUICK = (ROOT / "experiments" / "quickstart.yaml").as_posix()

SWEEP = """name: twonode
base: {base}
overrides:
  rollout.prompts_per_step: 2
  rollout.group_size: 4
  rollout.max_response_len: 32
  rollout.segments: 2
  algo.dynamic_sampling: false
  eval.every: 0
  train.checkpoint_every: 1
  resources.trainer_workers: 1
  resources.rollout_engines: 1
  resources.gpus_per_trainer_worker: 1
  resources.gpus_per_engine: 1
  resources.cpus_per_trainer_worker: 1
  resources.cpus_per_engine: 1
  resources.nodes: 2
  tracking.server_auth: true
space:
  algo.mpt.tau: {{grid: [0.9]}}
search: {{algorithm: grid}}
metric: rollout/reward_mean
mode: max
num_samples: 1
max_concurrent: 1
resources: {{cpu: 1}}
stop: {{steps: 3}}
max_failures: 2
"""


def _rss_mb(pid: int) -> float:
    """RSS of ``pid`` and all its descendants."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,rss="], capture_output=True, text=True).stdout
    kids: dict[int, list[tuple[int, int]]] = {}
    rss = {}
    for line in out.splitlines():
        p, pp, r = (int(x) for x in line.split())
        kids.setdefault(pp, []).append((p, r))
        rss[p] = r
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        stack.extend(c for c, _ in kids.get(p, []))
    return total / 1024


@pytest.mark.slow
def test_two_node_sweep_places_trainer_and_engine_on_different_nodes(tmp_path):
    t0 = time.perf_counter()
    sweep = tmp_path / "twonode.yaml"
    sweep.write_text(SWEEP.format(base=QUICK))
    store = f"sqlite:///{tmp_path}/mlflow.db"
    cluster = LocalRayCluster([{"CPU": 2, "GPU": 1}, {"CPU": 2, "GPU": 1}]).start()
    peak = 0.0
    try:
        node_ids = set()
        out = subprocess.run([sys.executable, "-c", "import ray, json; ray.init(address='%s', log_to_driver=False); "
                              "print(json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive']]))" % cluster.address],
                             capture_output=True, text=True, timeout=90, env={**os.environ, **cluster.env()})
        node_ids = set(json.loads(out.stdout.strip().splitlines()[-1]))
        assert len(node_ids) == 2

        # a client without the token is refused by the cluster
        no_token = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        no_token.update({"HOME": str(tmp_path / "home"), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"})
        refused = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address='{cluster.address}')"],
                                 capture_output=True, text=True, timeout=120, env=no_token)
        assert refused.returncode != 0
        assert "Authentication token is missing or incorrect" in refused.stderr

        password = secrets.token_urlsafe(24)
        env = {**os.environ, **cluster.env(), "ULORL_INJECT_FAILURE": f"2:{tmp_path / 'failed-once'}",
               "OMP_NUM_THREADS": "1", "ULORL_MLFLOW_PASSWORD": password}
        # the driver's output goes to files: a pipe nobody drains while we poll fills up and blocks it
        out_path, err_path = tmp_path / "sweep.out", tmp_path / "sweep.err"
        with open(out_path, "w") as out_f, open(err_path, "w") as err_f:
            proc = subprocess.Popen([sys.executable, "-m", "ulorl.cli.sweep", str(sweep), "--address", cluster.address,
                                     "--tracking-uri", store, "--output-dir", str(tmp_path / "runs"), "--json"],
                                    stdout=out_f, stderr=err_f, text=True, env=env, cwd=tmp_path)
            while proc.poll() is None:
                peak = max(peak, cluster.rss_mb() + _rss_mb(proc.pid))
                time.sleep(2)
        stdout, stderr = out_path.read_text(), err_path.read_text()
        assert proc.returncode == 0, stdout[-3000:] + stderr[-6000:]
        assert "MLFLOW_TRACKING_PASSWORD" not in stdout + stderr and password not in stdout + stderr
        summary = json.loads(stdout)  # exactly one JSON document on stdout
        # the password reached the trials (they wrote through the authenticated server) but no file: not the
        # nodes' Ray session folders and logs, not the run directory, not the store, its artifacts or server log
        assert files_holding(password, cluster.temp, tmp_path) == []
    finally:
        cluster.stop()
    assert cluster.pids() == []  # the cluster is torn down

    client = MlflowClient(store)
    parent = client.get_run(summary["parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.params["sweep.tracking_auth"] == "basic"  # tracking.server_auth=true took effect
    assert parent.data.params["sweep.tracking_server"].startswith("http://127.0.0.1:")
    exp = client.get_experiment(parent.info.experiment_id)
    assert exp.artifact_location.startswith("mlflow-artifacts:")  # created through the server, artifacts proxied
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 1
    for run in children:
        p = run.data.params
        assert run.info.status == "FINISHED"
        trainer, engine = p["placement.trainer.0.node_id"], p["placement.engine.0.node_id"]
        assert {trainer, engine} == node_ids  # one logical GPU per node: the roles sit on different nodes
        assert p["placement.nodes_used"] == "2" and p["placement.strategy"] == "PACK"
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "time/step_s"))
        assert steps == [1, 2, 3]  # the retried trial resumed into the same run, no step twice
        assert run.info.artifact_uri.startswith("mlflow-artifacts:")  # uploaded through the server
    # the server stored the trials' artifacts beside the store (the trials never wrote there themselves)
    assert len(list((tmp_path / "mlflow-artifacts").rglob("resolved.yaml"))) == 1
    resumed = [r for r in children if "ulorl.resumed_at_step" in r.data.tags]
    assert len(resumed) == 1 and resumed[0].data.tags["ulorl.resumed_at_step"] == "1"
    print(f"\ntwo-node sweep: {time.perf_counter() - t0:.0f} s, peak RSS (cluster + driver) {peak:.0f} MB")


TRAIN_OVERRIDES = ["rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_response_len=32",
                   "rollout.segments=2", "algo.dynamic_sampling=false", "eval.every=0", "train.max_steps=1",
                   "train.checkpoint_every=1", "resources.trainer_workers=1", "resources.rollout_engines=1",
                   "resources.gpus_per_trainer_worker=1", "resources.gpus_per_engine=1",
                   "resources.cpus_per_trainer_worker=1", "resources.cpus_per_engine=1", "resources.nodes=2"]


@pytest.mark.slow
def test_ulorl_train_on_another_node_serves_its_store_and_refuses_a_run_dir_a_node_cannot_see(tmp_path):
    """``ulorl-train --ray --address`` on a 2-node cluster whose second node holds both GPU bundles (trainer
    rank 0 and the engine), the driver on the head: (1) a run directory under a path the second node has
    its own private tmpfs over is refused before step 1, naming that node and the path; (2) with a shared
    run directory, rank 0 logs through an MLflow server the driver starts on its store (the driver's
    SQLite file holds the step and the placement params, ``placement.tracking=server``). ~2-4 minutes."""
    t0 = time.perf_counter()
    private, shared = tmp_path / "private", tmp_path / "shared"
    private.mkdir()
    shared.mkdir()
    store = f"sqlite:///{tmp_path}/mlflow.db"
    cluster = LocalRayCluster([{"CPU": 2, "GPU": 0}, {"CPU": 2, "GPU": 2, "private_dir": str(private)}],
                              token_auth=False).start()
    try:
        out = subprocess.run([sys.executable, "-c", "import ray, json; ray.init(address='%s', log_to_driver=False); "
                              "print(json.dumps({n['NodeID']: n['Resources'].get('GPU', 0) for n in ray.nodes() "
                              "if n['Alive']}))" % cluster.address],
                             capture_output=True, text=True, timeout=120, env={**os.environ, **cluster.env()})
        gpus = json.loads(out.stdout.strip().splitlines()[-1])
        gpu_node = next(k for k, v in gpus.items() if v == 2)
        env = {**os.environ, **cluster.env(), "OMP_NUM_THREADS": "1"}
        base = [sys.executable, "-m", "ulorl.cli.train", QUICK, "--ray", "--address", cluster.address,
                "--tracking-uri", store, "--no-progress"]
        refused = subprocess.run([*base, "--run-dir", str(private / "run"), *TRAIN_OVERRIDES], capture_output=True,
                                 text=True, timeout=600, env=env, cwd=tmp_path)
        ran = subprocess.run([*base, "--run-dir", str(shared / "run"), *TRAIN_OVERRIDES], capture_output=True,
                             text=True, timeout=900, env=env, cwd=tmp_path)
    finally:
        cluster.stop()
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-4000:]
    msg = refused.stderr
    assert "does not see the run directory" in msg and str(private / "run") in msg and gpu_node[:12] in msg
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-4000:]
    client = MlflowClient(store)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1                                   # the refused run never started one
    p = runs[0].data.params
    assert p["placement.trainer.0.node_id"] == gpu_node     # rank 0 is not on the driver's node
    assert p["placement.tracking"] == "server" and p["placement.tracking_server"].startswith("http://127.0.0.1:")
    assert p["placement.tracking_auth"] == "none"           # loopback: one machine
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "time/step_s")] == [1]
    assert (shared / "run" / "checkpoints").is_dir() and not (shared / "run" / ".node-check").exists()
    print(f"\nulorl-train on 2 nodes: {time.perf_counter() - t0:.0f} s")
