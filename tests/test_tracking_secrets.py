"""The tracking password never reaches a file: an authenticated sweep with a random password and a fresh
Ray temp directory, then every file under Ray's session folder, the run directory and the store searched
for it (Ray logs a job's runtime environment, so credentials must not travel in it)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from leaks import files_holding

ROOT = Path(__file__).resolve().parents[1]
QUICK = (ROOT / "experiments" / "quickstart.yaml").as_posix()

SWEEP = """name: secret
base: {base}
overrides:
  rollout.prompts_per_step: 2
  rollout.group_size: 2
  rollout.max_response_len: 32
  rollout.segments: 2
  algo.dynamic_sampling: false
  eval.every: 0
  train.checkpoint_every: 1
  tracking.server_auth: true
space:
  algo.mpt.tau: {{grid: [0.9]}}
search: {{algorithm: grid}}
metric: rollout/reward_mean
mode: max
num_samples: 1
max_concurrent: 2
resources: {{cpu: 1}}
stop: {{steps: 2}}
"""


def test_files_holding_finds_a_planted_secret(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.log").write_bytes(b"... token=s3cr3t-Value ...")
    (tmp_path / "a" / "y.log").write_text("nothing here")
    assert files_holding("s3cr3t-Value", tmp_path) == [str(tmp_path / "a" / "b" / "x.log")]


@pytest.mark.slow
def test_authenticated_sweep_leaves_the_password_in_no_file(tmp_path):
    password = secrets.token_urlsafe(24)
    ray_tmp = Path(tempfile.mkdtemp(prefix="ulr-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    sweep = tmp_path / "secret.yaml"
    sweep.write_text(SWEEP.format(base=QUICK))
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    store = f"sqlite:///{store_dir / 'mlflow.db'}"
    env = {**os.environ, "ULORL_MLFLOW_PASSWORD": password, "RAY_TMPDIR": str(ray_tmp), "OMP_NUM_THREADS": "1",
           "RAY_USAGE_STATS_ENABLED": "0"}
    try:
        out = subprocess.run([sys.executable, "-m", "ulorl.cli.sweep", str(sweep), "--tracking-uri", store,
                              "--output-dir", str(tmp_path / "runs"), "--num-cpus", "2", "--json"],
                             capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
        summary = json.loads(out.stdout)  # exactly one JSON document on stdout
        sessions = list((ray_tmp / "ray").glob("session_*"))
        assert sessions and any((s / "logs").is_dir() for s in sessions)  # Ray wrote its session where we said
        assert password not in out.stdout + out.stderr
        assert files_holding(password, ray_tmp, tmp_path / "runs", store_dir) == []
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    client = MlflowClient(store)
    parent = client.get_run(summary["parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.params["sweep.tracking_auth"] == "basic"  # the trials wrote through the authenticated server
    assert password not in json.dumps(parent.data.params) + json.dumps(parent.data.tags)
    kids = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(kids) == 1 and all(k.info.status == "FINISHED" for k in kids)
    for k in kids:
        assert password not in json.dumps(k.data.params) + json.dumps(k.data.tags)
