"""MLflow stores for the dashboard tests (imported by tests/test_dashboard_*.py and tests/browser/).

- ``build_written_store``: runs written with the real MLflow client following
  ``ulorl.tracking.schema`` exactly, with hand-chosen values so that tests can derive the expected
  tables by hand (speedup, benchmark deltas, samples).
- ``build_real_store``: REAL short runs: two tiny ``ulorl.train.trainer.train`` runs (3 steps,
  different ``algo.mpt.mode``) and one ``ulorl-eval`` run of the first run's checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from ulorl.tracking import schema
from ulorl.tracking.run import get_or_create_experiment

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = "ulorl"

# The speedup sweep: (segments, batching) -> time/step_s per step and rollout/finished per step.
SPEED_TRIALS: dict[tuple[int, str], tuple[list[float], list[float]]] = {
    (1, "compact"): ([2.0, 2.0, 4.0], [4.0, 4.0, 4.0]),   # median 2.0 s, 12 / 8 s = 1.5 /s
    (2, "compact"): ([1.0, 1.0, 1.0], [4.0, 4.0, 4.0]),   # median 1.0 s, 12 / 3 s = 4.0 /s
    (4, "compact"): ([0.5, 0.5, 1.0], [2.0, 4.0, 6.0]),   # median 0.5 s, 12 / 2 s = 6.0 /s
    (1, "static"): ([3.0, 3.0, 3.0], [3.0, 3.0, 3.0]),    # median 3.0 s, 9 / 9 s = 1.0 /s
    (4, "static"): ([1.5, 1.5, 1.5], [3.0, 3.0, 3.0]),    # median 1.5 s, 9 / 4.5 s = 2.0 /s
}
# Final eval/heldout/avg_at_k of each sweep trial (for the Sweep page's importance).
SPEED_OBJECTIVE = {(1, "compact"): 0.30, (2, "compact"): 0.35, (4, "compact"): 0.45,
                   (1, "static"): 0.25, (4, "static"): 0.40}

SAMPLE_RECORDS: list[dict[str, Any]] = [
    {"step": 2, "sample_id": 7, "group_id": 3, "reward": 1.0, "status": "finished",
     "prompt_text": "Sum 1 2 3", "response_text": "1 3 6 <b>",
     "tokens": ["1", " 3", " 6", " <b>"],
     "segments": [{"start": 0, "end": 2, "version": 0}, {"start": 2, "end": 4, "version": 1}],
     "masked_positions": [0, 2]},
    {"step": 2, "sample_id": 8, "group_id": 3, "reward": 0.0, "status": "truncated",
     "prompt_text": "Sum 1 2 3", "response_text": "1 4", "tokens": ["1", " 4"],
     "segments": [{"start": 0, "end": 2, "version": 1}], "masked_positions": []},
]


def _metrics(values: dict[str, list[float]], t0: int = 1_700_000_000_000) -> list[Metric]:
    out = []
    for key, vals in values.items():
        for i, v in enumerate(vals):
            out.append(Metric(key, float(v), t0 + 1000 * (i + 1), i + 1))
    return out


def _train_params(segments: int, batching: str, mode: str = "dynamic", sigma: float = 0.2) -> dict[str, str]:
    return {"rollout.segments": str(segments), "rollout.max_response_len": "64", "rollout.batching": batching,
            "algo.mpt.tau": "0.99", "algo.mpt.sigma": str(sigma), "algo.mpt.mode": mode, "algo.is_mode": "pois"}


def _log_run(client: MlflowClient, exp_id: str, name: str, tags: dict[str, str], params: dict[str, str],
             metrics: list[Metric], status: str = "FINISHED") -> str:
    run = client.create_run(exp_id, run_name=name, tags=tags, start_time=1_700_000_000_000)
    rid = run.info.run_id
    client.log_batch(rid, metrics=metrics, params=[Param(k, v) for k, v in params.items()])
    client.set_terminated(rid, status=status, end_time=1_700_000_010_000)
    return rid


def build_written_store(root: Path) -> dict[str, Any]:
    """Write the hand-valued store under ``root``; returns uri and the run ids by role."""
    root.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp_id = get_or_create_experiment(client, EXPERIMENT, uri)
    ids: dict[str, Any] = {"uri": uri, "trials": {}}

    parent = client.create_run(exp_id, run_name="segments-sweep",
                               tags={schema.KIND_TAG: "sweep", schema.SWEEP_TAG: "segments"})
    ids["sweep"] = parent.info.run_id
    client.log_batch(ids["sweep"], params=[Param("rollout.segments", "[1, 2, 4]")])
    client.set_terminated(ids["sweep"], "FINISHED")
    for (segs, batching), (step_s, finished) in SPEED_TRIALS.items():
        n = len(step_s)
        m = {"time/step_s": step_s, "rollout/finished": finished, "time/wall_s": list(_cumsum(step_s)),
             "train/reward_mean": [0.1, 0.2, SPEED_OBJECTIVE[(segs, batching)]],
             "train/entropy": [0.5, 0.4, 0.3], "pool/unfinished": [segs * 2.0] * n,
             "pool/experience": [1.0] * n}
        metrics = _metrics(m) + [Metric(schema.eval_metric("heldout", "avg_at_k"), SPEED_OBJECTIVE[(segs, batching)],
                                        1_700_000_004_000, n)]
        tags = {schema.KIND_TAG: "train", schema.EXPERIMENT_TAG: "speed", schema.PARENT_TAG: ids["sweep"],
                schema.TRIAL_TAG: f"t{segs}{batching[0]}"}
        ids["trials"][f"{segs}-{batching}"] = _log_run(client, exp_id, f"S{segs}-{batching}", tags,
                                                   _train_params(segs, batching), metrics)

    for mode, entropy in (("dynamic", [0.30, 0.22, 0.21]), ("off", [0.30, 0.15, 0.08])):
        m = {"train/entropy": entropy, "train/reward_mean": [0.2, 0.3, 0.5], "train/masked_frac": [0.0, 0.1, 0.05],
             "train/mpt_frac": [0.2, 0.3, 0.3], "time/step_s": [1.0, 1.0, 1.0], "rollout/finished": [2.0, 2.0, 2.0],
             "pool/unfinished": [3.0, 2.0, 4.0], "pool/experience": [0.0, 1.0, 0.0]}
        tags = {schema.KIND_TAG: "train", schema.EXPERIMENT_TAG: "quickstart"}
        ids[f"mpt_{mode}"] = _log_run(client, exp_id, f"quick-{mode}", tags, _train_params(4, "compact", mode), _metrics(m))
    rid = ids["mpt_dynamic"]
    client.log_text(rid, "\n".join(json.dumps(r) for r in SAMPLE_RECORDS) + "\n", "samples/step_000002.jsonl")
    client.log_text(rid, "name: quickstart\n", "config/resolved.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text("{}")
        (Path(tmp) / "model.safetensors").write_bytes(b"0" * 2000)
        client.log_artifacts(rid, tmp, "checkpoints/final")

    for label, avg, pass_k, lo, hi in (("base", 0.40, 0.60, 0.30, 0.50), ("tuned", 0.55, 0.70, 0.45, 0.65)):
        metrics = [Metric(schema.eval_metric("aime2025", k), v, 1_700_000_001_000, 0)
                   for k, v in (("avg_at_k", avg), ("pass_at_k", pass_k), ("ci_low", lo), ("ci_high", hi))]
        tags = {schema.KIND_TAG: "eval", schema.BENCHMARK_TAG: "aime2025", "ulorl.k": "4",
                schema.MODEL_TAG: f"/models/{label}", schema.MODEL_LABEL_TAG: label}
        ids[f"eval_{label}"] = _log_run(client, exp_id, f"eval-{label}", tags, {"eval.k": "4"}, metrics)
    return ids


def _cumsum(xs: list[float]) -> list[float]:
    total, out = 0.0, []
    for x in xs:
        total += x
        out.append(total)
    return out


def tiny_overrides(mode: str) -> list[str]:
    """Overrides that make ``experiments/quickstart.yaml`` a ~3-step run on a 2-core CPU."""
    return [
        "train.max_steps=3", f"algo.mpt.mode={mode}", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "tracking.sample_every=1", "tracking.samples_per_log=2", "eval.every=3", "eval.num_problems=8",
        "eval.k=2", "train.checkpoint_every=3", "train.threads=1",
    ]


def build_real_store(root: Path) -> dict[str, Any]:
    """Two REAL tiny training runs (different ``algo.mpt.mode``) and one real eval run."""
    from ulorl.config import load_experiment
    from ulorl.train.trainer import train

    root.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    out: dict[str, Any] = {"uri": uri}
    for mode in ("dynamic", "off"):
        cfg = load_experiment(REPO / "experiments" / "quickstart.yaml",
                              tiny_overrides(mode) + [f"train.output_dir={root / 'runs'}",
                                                      f"tracking.run_name=quick-{mode}"])
        result = train(cfg, tracking_uri=uri, progress=False)
        out[f"train_{mode}"] = result.run_id
        out[f"run_dir_{mode}"] = str(result.run_dir)
    ckpt = Path(out["run_dir_dynamic"]) / "checkpoints"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    cmd = [sys.executable, "-m", "ulorl.cli.eval", "--json", "--tracking-uri", uri]
    proc = subprocess.run(cmd + ["--help"], capture_output=True, text=True, env=env, timeout=120)
    out["eval_help"] = proc.stdout
    out["checkpoints"] = str(ckpt)
    return out


def cached_store(tmp_path_factory: Any, name: str, builder: Any) -> dict[str, Any]:
    """Build a store once per pytest session (shared by every test module that asks for it)."""
    root = Path(tmp_path_factory.getbasetemp()) / f"dashboard_{name}"
    done = root / "ids.json"
    if done.is_file():
        return json.loads(done.read_text())
    ids = builder(root)
    done.write_text(json.dumps(ids))
    return ids
