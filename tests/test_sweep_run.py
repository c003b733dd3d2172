"""Real sweeps (Ray Tune + Optuna/grid + MLflow): parent/child runs, trial retry from checkpoint, driver --resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ulorl.sweep.launch import SweepRunner
from ulorl.sweep.trial import FAIL_ENV

ROOT = Path(__file__).resolve().parents[1]
QUICK = (ROOT / "experiments" / "quickstart.yaml").as_posix()


def _sweep(tmp_path: Path, steps: int = 4, baseline: str = "") -> Path:
    p = tmp_path / "tiny_sweep.yaml"
    p.write_text(f"""name: tiny
base: {QUICK}
overrides:
  rollout.prompts_per_step: 2
  rollout.group_size: 4
  rollout.max_response_len: 96
  train.checkpoint_every: 1
  eval.every: 2
  eval.num_problems: 4
  eval.k: 1
space:
  algo.mpt.tau: {{grid: [0.9, 0.99]}}
search: {{algorithm: grid}}
metric: eval/heldout/avg_at_k
mode: max
num_samples: 1
max_concurrent: 1
resources: {{cpu: 2}}
stop: {{steps: {steps}}}
max_failures: 2
{baseline}""")
    return p


def _children(uri: str, parent: str) -> list:
    c = MlflowClient(uri)
    exp = c.get_run(parent).info.experiment_id
    return c.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent}'")


def test_failed_trial_resumes_into_same_child_run(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    marker = tmp_path / "failed_once"
    monkeypatch.setenv(FAIL_ENV, f"3:{marker}")
    baseline = "baseline: {name: masking_off, overrides: {algo.mpt.mode: 'off'}, seeds: 1}\n"
    summary = SweepRunner(_sweep(tmp_path, baseline=baseline), tracking_uri=uri, output_dir=tmp_path / "out").run()
    assert marker.exists(), "the injected failure never fired"
    assert summary["errors"] == []
    all_kids = _children(uri, summary["parent_run_id"])
    base = [k for k in all_kids if k.data.tags.get("ulorl.trial_role") == "baseline"]
    assert len(base) == 1 and base[0].data.params["algo.mpt.mode"] == "off"
    assert " baseline " in base[0].info.run_name and base[0].info.run_name.startswith("tiny-")
    kids = [k for k in all_kids if k.data.tags.get("ulorl.trial_role") == "search"]
    assert len(kids) == 2, [k.info.run_id for k in all_kids]
    names = [k.info.run_name for k in all_kids]
    assert len(set(names)) == 3 and all(n.startswith("tiny-") and "tau=" in n for n in names if n not in
                                         {base[0].info.run_name}), names
    client0 = MlflowClient(uri)
    header = client0.download_artifacts(summary["parent_run_id"], "sweep/ranking.csv", str(tmp_path))
    cols = Path(header).read_text().splitlines()[0].split(",")
    assert {"heldout_ci_low", "heldout_ci_high", "diff_vs_baseline", "diff_ci_low", "diff_ci_high"} <= set(cols)
    assert summary["command"].startswith("ulorl-train ") and "algo.mpt.tau=" in summary["command"]
    assert summary["verdict"].startswith("verdict: best trial ")
    client = MlflowClient(uri)
    failed_trial = marker.read_text().strip()
    retried = [k for k in kids if k.data.tags["ulorl.trial_id"] == failed_trial]
    assert len(retried) == 1
    run = retried[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags.get("ulorl.resumed_at_step") == "2"   # checkpoint of step 2, failure at step 3
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "time/step_s"))
    assert steps == [1, 2, 3, 4]
    ranked = [r["run_id"] for r in summary["ranking"] if r["role"] == "search"]
    assert sorted(ranked) == sorted(k.info.run_id for k in kids)
    best = max(kids, key=lambda k: k.data.metrics["eval/heldout/avg_at_k"])
    assert summary["ranking"][0]["objective"] == best.data.metrics["eval/heldout/avg_at_k"]


@pytest.mark.slow
def test_driver_killed_then_resume_has_no_duplicate_runs(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    spec = _sweep(tmp_path, steps=6)
    cmd = [sys.executable, "-m", "ulorl.cli.sweep", str(spec), "--tracking-uri", uri, "--output-dir", str(tmp_path / "out")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    trials = tmp_path / "out" / "sweeps" / "tiny" / "trials"
    deadline = time.time() + 600
    while time.time() < deadline:  # kill once the first trial has a checkpoint
        if any((d / "checkpoints" / "latest").exists() for d in trials.glob("*")):
            break
        assert proc.poll() is None, "sweep ended before it could be killed"
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything in its session (Ray, mlflow server)
    proc.wait()
    out = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    state = (tmp_path / "out" / "sweeps" / "tiny" / "sweep_state.json").read_text()
    import json

    parent = json.loads(state)["parent_run_id"]
    kids = _children(uri, parent)
    assert len(kids) == 2 and all(k.info.status == "FINISHED" for k in kids)
    assert len({k.data.tags["ulorl.trial_id"] for k in kids}) == 2
    sweeps = MlflowClient(uri).search_runs([kids[0].info.experiment_id], filter_string="tags.`ulorl.kind` = 'sweep'")
    assert len(sweeps) == 1
