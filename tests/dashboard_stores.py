"""MLflow stores for the dashboard tests (imported by tests/test_dashboard_*.py and tests/browser/).

- ``build_written_store``: runs written with the real MLflow client following
  ``ulorl.tracking.schema`` exactly, with hand-chosen values so that tests can derive the expected
  tables by hand (speedup, benchmark deltas, samples).
- ``build_real_store``: REAL short runs: two tiny ``ulorl.train.trainer.train`` runs (3 steps,
  different ``algo.mpt.mode``) that share the run name ``quickstart`` (runs are identities, names
  are labels), one ``ulorl-eval`` run of the first run's checkpoint, and two sweep parent runs of
  ONE sweep name (``mpt_threshold``, as two runs of ``ulorl-sweep`` write them, each with its own
  Optuna study) whose trial runs are all named ``quickstart`` too (``add_shared_name_sweeps``); the
  newer one also has the headline sweep's non-segmented reference trial (S = 1, masking off), so the
  Speedup page compares S = 4 against S = 1 inside the sweep group.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param

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


_TEMPLATE_DIR = Path(tempfile.gettempdir()) / f"ulorl-dashboard-tests-{os.getpid()}"


def fresh_db(root: Path) -> str:
    """A new, empty MLflow SQLite store at ``root/mlflow.db``, copied from a template created once
    per process (creating the schema takes ~8 s; a file copy is instant)."""
    template = _TEMPLATE_DIR / "template.db"
    if not template.is_file():
        _TEMPLATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = _TEMPLATE_DIR / f"building-{os.getpid()}.db"
        MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments()
        tmp.replace(template)
        atexit.register(shutil.rmtree, _TEMPLATE_DIR, True)
    root.mkdir(parents=True, exist_ok=True)
    db = root / "mlflow.db"
    shutil.copyfile(template, db)
    return f"sqlite:///{db}"


def new_store(tmp_path_factory: Any, name: str) -> str:
    return fresh_db(Path(tmp_path_factory.mktemp(name)))


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
             metrics: list[Metric], status: str = "FINISHED", start_time: int = 1_700_000_000_000) -> str:
    run = client.create_run(exp_id, run_name=name, tags=tags, start_time=start_time)
    rid = run.info.run_id
    client.log_batch(rid, metrics=metrics, params=[Param(k, v) for k, v in params.items()])
    client.set_terminated(rid, status=status, end_time=start_time + 10_000)
    return rid


def build_written_store(root: Path) -> dict[str, Any]:
    """Write the hand-valued store under ``root``; returns uri and the run ids by role."""
    uri = fresh_db(root)
    client = MlflowClient(tracking_uri=uri)
    exp_id = get_or_create_experiment(client, EXPERIMENT, uri)
    ids: dict[str, Any] = {"uri": uri, "trials": {}}

    # The sweep parent as ulorl-sweep writes it: search space, objective, and its Optuna study.
    sweep_dir = root / "sweep"
    parent = client.create_run(exp_id, run_name="segments-sweep",
                               tags={schema.KIND_TAG: "sweep", schema.SWEEP_TAG: "segments",
                                     "ulorl.sweep_dir": str(sweep_dir)})
    ids["sweep"] = parent.info.run_id
    client.log_batch(ids["sweep"], params=[
        Param("space.rollout.segments", '{"values": [1, 2, 4]}'), Param("space.rollout.batching", '{"values": ["compact", "static"]}'),
        Param("sweep.metric", "eval/heldout/avg_at_k"), Param("sweep.mode", "max")])
    client.set_terminated(ids["sweep"], "FINISHED")
    _optuna_study(sweep_dir / "optuna.db", "segments")
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


def _optuna_study(db: Path, name: str) -> None:
    """An Optuna study with the sweep's trials (segments, batching -> objective)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db.parent.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{db}", direction="maximize")
    dists = {"rollout.segments": optuna.distributions.CategoricalDistribution([1, 2, 4]),
             "rollout.batching": optuna.distributions.CategoricalDistribution(["compact", "static"])}
    for (segs, batching), value in SPEED_OBJECTIVE.items():
        study.add_trial(optuna.trial.create_trial(
            params={"rollout.segments": segs, "rollout.batching": batching}, distributions=dists, value=value))


def _cumsum(xs: list[float]) -> list[float]:
    total, out = 0.0, []
    for x in xs:
        total += x
        out.append(total)
    return out


# The two real training runs: (algo.mpt.mode, rollout.segments). They also differ in segment
# count so that the Speedup page has an S = 1 baseline from real runs.
REAL_RUNS: tuple[tuple[str, int], ...] = (("dynamic", 4), ("off", 1))


def tiny_overrides(mode: str, segments: int, root: Path) -> list[str]:
    """Overrides that make ``experiments/quickstart.yaml`` a 3-step run on a 2-core CPU.
    (The mode is quoted: YAML reads a bare ``off`` as False.)"""
    return [
        "train.max_steps=3", f"algo.mpt.mode='{mode}'", f"rollout.segments={segments}",
        "rollout.max_response_len=128", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "tracking.sample_every=1", "tracking.samples_per_log=8", "eval.every=3", "eval.num_problems=4",
        "eval.k=2", "train.checkpoint_every=3", "train.threads=1", f"train.output_dir={root / 'runs'}",
    ]


def build_real_store(root: Path, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Two REAL tiny training runs (``ulorl.train.trainer.train``) and one REAL ``ulorl-eval`` run
    of the first run's final checkpoint, nested under it. ``extra``: more overrides for both
    training runs (e.g. ``model.name_or_path=...``)."""
    from ulorl.config import load_experiment
    from ulorl.train.trainer import train

    uri = fresh_db(root)
    out: dict[str, Any] = {"uri": uri}
    for mode, segments in REAL_RUNS:
        cfg = load_experiment(REPO / "experiments" / "quickstart.yaml", tiny_overrides(mode, segments, root) + list(extra))
        result = train(cfg, tracking_uri=uri, progress=False)
        assert result.run_id, f"training run ({mode}) returned no run id"
        out[f"train_{mode}"] = result.run_id
    rid = out["train_dynamic"]
    cmd = [sys.executable, "-m", "ulorl.cli.eval", "--benchmark", "heldout", "--k", "2", "--num-problems", "4",
           "--max-new-tokens", "64", "--threads", "1", "--model", f"runs:/{rid}/checkpoints/final",
           "--parent-run-id", rid, "--label", "quick-dynamic", "--tracking-uri", uri, "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    assert proc.returncode == 0, f"ulorl-eval failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    result = json.loads(proc.stdout)
    out["eval"] = result.get("run_id")
    out.update(add_shared_name_sweeps(uri, root))
    return out


# Two runs of the sweep ``mpt_threshold``: (tau, sigma, held-out accuracy per problem at the last
# eval) of each search trial, and the baseline's. Objectives tie on purpose (0.5 twice in sweep A).
SHARED_SWEEPS: dict[str, dict[str, Any]] = {
    "A": {"trials": [(0.9, 0.05, [1.0, 0.5, 0.5, 0.0]), (0.95, 0.10, [0.5, 0.5, 1.0, 0.0]),
                     (0.99, 0.12, [0.5, 0.5, 0.5, 0.5])],
          "baseline": [0.5, 0.0, 0.5, 0.0], "start": 1_700_000_000_000},
    "B": {"trials": [(0.9, 0.08, [1.0, 1.0, 0.5, 0.5]), (0.99, 0.04, [0.0, 0.5, 0.5, 0.0]),
                     (0.95, 0.14, [1.0, 0.5, 0.5, 1.0])],
          "reference": [0.5, 0.0, 0.5, 0.5], "baseline": [0.5, 0.5, 0.5, 0.0], "start": 1_700_000_100_000},
}
SHARED_NAME = "quickstart"
# Steady-window speed of the sweep trials (8 steps; S = 4 keeps steps 5-8, S = 1 steps 2-8): trial i of
# a sweep at S = 4 takes 1.0 + 0.1 i s per step, the S = 1 reference 0.8 s; all train 16 samples per
# step. Both sweeps share the name, hence one Speedup group: its 8 S = 4 runs take 1.0, 1.1, 1.2, 1.3
# (A) and 1.0, 1.1, 1.2, 1.4 (B) s -> median 1.15 s, so S = 4 vs S = 1 = 0.8 / 1.15 = 0.70x per step;
# trained samples/s: median of 16 / t = (16 / 1.1 + 16 / 1.2) / 2 = 13.94 vs 16 / 0.8 = 20 -> 0.70x.
SPEED_STEPS = 8
REFERENCE_STEP_S = 0.8
SPEEDUP_S4_VS_S1 = 0.8 / 1.15


def _per_problem_csv(scores: list[float], k: int = 2) -> str:
    rows = ["problem_id,answer,k,num_correct,accuracy"]
    rows += [f"heldout-{i},{i},{k},{int(round(s * k))},{s}" for i, s in enumerate(scores)]
    return "\n".join(rows) + "\n"


def add_shared_name_sweeps(uri: str, root: Path) -> dict[str, Any]:
    """Two parent runs named ``sweep-mpt_threshold`` (tag ulorl.sweep=mpt_threshold), each with its
    own sweep dir and Optuna study, and trial runs all named ``quickstart``: 3 search trials and a
    baseline (tag ulorl.trial_role=baseline, variant masking_off) per sweep, and in sweep B a
    reference (role reference, variant non_segmented, rollout.segments 1) before the baseline, each
    with held-out metrics at steps 0 / 10 / 20, curves, 8 steps of timing, and the per-problem CSV of
    its last eval. Returns ids by role (``sweep_<key>_trials``: every trial, the baseline last)."""
    import optuna

    client = MlflowClient(tracking_uri=uri)
    exp_id = get_or_create_experiment(client, EXPERIMENT, uri)
    out: dict[str, Any] = {}
    for key, sweep in SHARED_SWEEPS.items():
        t0 = sweep["start"]
        sweep_dir = root / f"sweep_{key}"
        parent = client.create_run(exp_id, run_name="sweep-mpt_threshold", start_time=t0, tags={
            schema.KIND_TAG: "sweep", schema.SWEEP_TAG: "mpt_threshold", "ulorl.sweep_dir": str(sweep_dir)})
        pid = parent.info.run_id
        client.log_batch(pid, params=[Param("space.algo.mpt.tau", '{"choice": [0.9, 0.95, 0.99]}'),
                                      Param("space.algo.mpt.sigma", '{"uniform": [0.03, 0.15]}'),
                                      Param("sweep.metric", "eval/heldout/avg_at_k"), Param("sweep.mode", "max")])
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        study = optuna.create_study(study_name="mpt_threshold", storage=f"sqlite:///{sweep_dir / 'optuna.db'}",
                                    direction="maximize")
        dists = {"algo.mpt.tau": optuna.distributions.CategoricalDistribution([0.9, 0.95, 0.99]),
                 "algo.mpt.sigma": optuna.distributions.FloatDistribution(0.03, 0.15)}
        kids = []
        entries = [(tau, sigma, scores, "search") for tau, sigma, scores in sweep["trials"]]
        if "reference" in sweep:
            entries.append((0.99, 0.08, sweep["reference"], "reference"))
        entries.append((0.99, 0.08, sweep["baseline"], "baseline"))
        for i, (tau, sigma, scores, role) in enumerate(entries):
            final = sum(scores) / len(scores)
            if role == "search":
                study.add_trial(optuna.trial.create_trial(params={"algo.mpt.tau": tau, "algo.mpt.sigma": sigma},
                                                          distributions=dists, value=final))
            heldout = schema.eval_metric("heldout", "avg_at_k")
            step_s = REFERENCE_STEP_S if role == "reference" else 1.0 + 0.1 * i
            metrics = _metrics({"train/entropy": [0.08 - 0.01 * i, 0.07 - 0.01 * i, 0.06 - 0.005 * i],
                                "time/step_s": [step_s] * SPEED_STEPS, "rollout/finished": [8.0] * SPEED_STEPS,
                                "train/samples": [16.0] * SPEED_STEPS}, t0)
            metrics += [Metric(heldout, v, t0 + 500 * (s + 1), s) for s, v in ((0, 0.25), (10, 0.3 + 0.02 * i), (20, final))]
            metrics += [Metric(schema.eval_metric("heldout", n), v, t0 + 20_000, 20)
                        for n, v in (("ci_low", max(0.0, final - 0.2)), ("ci_high", min(1.0, final + 0.2)))]
            params = _train_params(1 if role == "reference" else 4, "compact",
                                   "dynamic" if role == "search" else "off", sigma)
            params["algo.mpt.tau"] = str(tau)
            tags = {schema.KIND_TAG: "train", schema.EXPERIMENT_TAG: "quickstart", schema.PARENT_TAG: pid,
                    schema.TRIAL_TAG: f"{key.lower()}{i}", schema.ROLE_TAG: role, schema.SEED_TAG: "0"}
            if role != "search":
                tags[schema.VARIANT_TAG] = "non_segmented" if role == "reference" else "masking_off"
            rid = _log_run(client, exp_id, SHARED_NAME, tags, params, metrics, start_time=t0 + 1000 * i)
            client.log_text(rid, _per_problem_csv(scores), "eval/heldout_per_problem_step_000020.csv")
            kids.append(rid)
        client.set_terminated(pid, "FINISHED", end_time=t0 + 60_000)
        out[f"sweep_{key}"] = pid
        out[f"sweep_{key}_trials"] = kids
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
