"""End-to-end trainer runs on the embedded model: what MLflow holds, exact resume, IS-mode ratios, bad input.

These use the real embedded tiny Qwen3, real math-verify rewards, the real HF engine and a real
SQLite MLflow store; settings are shrunk so each run takes seconds on 2 cores.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from ulorl.config import load_experiment
from ulorl.tracking import schema
from ulorl.train.checkpoint import latest_checkpoint, read_trainer_state
from ulorl.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "quickstart.yaml"
SMALL = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.max_response_len=96",
    "rollout.segments=4",
    "train.threads=1",
    "eval.every=0",
    "tracking.sample_every=1",
    "train.lr=1e-4",
]


def _cfg(tmp_path: Path, *extra: str):
    return load_experiment(QUICK, SMALL + [f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", *extra])


def _history(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def test_run_logs_every_metric_at_every_updating_step(tmp_path):
    cfg = _cfg(tmp_path, "train.max_steps=4", "train.checkpoint_every=2", "eval.every=2", "eval.num_problems=4", "eval.k=1")
    res = Trainer(cfg, run_dir=tmp_path / "run", progress=False).run()
    client = MlflowClient(res.tracking_uri)
    run = client.get_run(res.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["rollout.segments"] == "4"
    assert run.data.tags[schema.KIND_TAG] == "train"
    assert run.data.tags[schema.EXPERIMENT_TAG] == "quickstart"
    assert "ulorl.hw.cpu" in run.data.tags and "ulorl.version.torch" in run.data.tags
    skipped = _history(client, res.run_id, schema.SKIPPED_METRIC)
    assert sorted(skipped) == [1, 2, 3, 4]
    for key in schema.EVERY_STEP_METRICS:
        assert sorted(_history(client, res.run_id, key)) == [1, 2, 3, 4], key
    updated = [s for s, v in skipped.items() if v == 0.0]
    assert updated, "no step updated the model in 4 steps"
    for key in schema.UPDATE_STEP_METRICS:
        hist = _history(client, res.run_id, key)
        assert set(updated) <= set(hist), (key, updated, sorted(hist))
    assert set(_history(client, res.run_id, "eval/heldout/avg_at_k")) >= {2, 4}
    # S = 4: the cohort admitted at step 1 has completed by step 4 and is logged at step 1
    cohort = _history(client, res.run_id, schema.COHORT_REWARD_METRIC)
    assert 1 in cohort and set(cohort) <= {1, 2, 3, 4}
    assert all(0.0 <= v <= 1.0 for v in cohort.values())
    assert set(_history(client, res.run_id, schema.COHORT_LEN_METRIC)) == set(cohort)
    arts = {a.path for a in client.list_artifacts(res.run_id)}
    assert {"config", "checkpoints"} <= arts
    samples = [a.path for a in client.list_artifacts(res.run_id, "samples")]
    assert samples, "no sampled responses logged"
    evals = {a.path for a in client.list_artifacts(res.run_id, "eval")}
    assert {"eval/heldout_per_problem_step_000002.csv", "eval/heldout_per_problem_step_000004.csv"} <= evals


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _pools(trainer: Trainer) -> dict:
    state = trainer.scheduler.state_dict()
    return state


def test_exact_resume_matches_straight_run(tmp_path):
    n = 4
    straight = Trainer(_cfg(tmp_path, f"train.max_steps={n}", "train.checkpoint_every=1"),
                       run_dir=tmp_path / "a", progress=False)
    straight.run()
    half = Trainer(_cfg(tmp_path, f"train.max_steps={n // 2}", "train.checkpoint_every=1"),
                   run_dir=tmp_path / "b", progress=False)
    half.run()
    resumed = Trainer(_cfg(tmp_path, f"train.max_steps={n}", "train.checkpoint_every=1"),
                      resume=str(tmp_path / "b"), progress=False)
    res = resumed.run()
    assert res.steps == n
    pa, pb = _params(straight.model), _params(resumed.model)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k
    assert _pools(straight) == _pools(resumed)
    assert straight.policy_version == resumed.policy_version
    # the resumed run continued the same MLflow run with one point per step
    client = MlflowClient(res.tracking_uri)
    assert res.run_id == half.run_id
    steps = [m.step for m in client.get_metric_history(res.run_id, "time/step_s")]
    assert sorted(steps) == list(range(1, n + 1))
    # cohorts straddling the stop were checkpointed: the same cohort points as the straight run
    cohort = _history(client, straight.run_id, schema.COHORT_REWARD_METRIC)
    assert cohort and _history(client, res.run_id, schema.COHORT_REWARD_METRIC) == cohort


def test_resume_after_kill_9(tmp_path):
    """SIGKILL after a checkpoint, then --resume: same parameters as a straight run."""
    n = 4
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [sys.executable, "-m", "ulorl.cli.train", str(QUICK), *SMALL, f"tracking.uri={uri}",
            "train.checkpoint_every=1", "--no-progress"]
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(args + [f"train.max_steps={n}", "--run-dir", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline:
        ck = latest_checkpoint(run_dir) if (run_dir / "checkpoints" / "latest").exists() else None
        if ck is not None and read_trainer_state(ck)["step"] >= 2:
            break
        if proc.poll() is not None:
            pytest.fail("trainer exited before it could be killed:\n" + proc.stdout.read().decode()[-2000:])
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = read_trainer_state(latest_checkpoint(run_dir))["step"]
    assert 2 <= killed_at < n
    out = subprocess.run(args + [f"train.max_steps={n}", "--resume", str(run_dir)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    straight = Trainer(load_experiment(QUICK, SMALL + [f"tracking.uri={uri}", f"train.max_steps={n}",
                                                       "train.checkpoint_every=1"]),
                       run_dir=tmp_path / "straight", progress=False)
    straight.run()
    from safetensors.torch import load_file

    final = latest_checkpoint(run_dir)
    assert read_trainer_state(final)["step"] == n
    weights = load_file(str(final / "model" / "model.safetensors"))
    ref = straight.model.state_dict()
    for k, v in weights.items():
        assert torch.equal(v, ref[k]), k
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    steps = [m.step for m in MlflowClient(uri).get_metric_history(run_id, "time/step_s")]
    assert sorted(steps) == list(range(1, n + 1)), steps


def _first_update_metrics(tmp_path: Path, *extra: str) -> dict[str, float]:
    t = Trainer(_cfg(tmp_path, "train.max_steps=1", *extra), run_dir=tmp_path / "r", progress=False)
    t.setup()
    try:
        for _ in range(20):
            out = t.train_step()
            if out.update is not None and out.update.updated:
                multi = any(len(s.segments) > 1 for s in out.update.kept_samples)
                return {**out.update.metrics, "multi_segment": float(multi)}
            # advance the policy version so later segments come from a newer policy (SAIS)
            for p in t.model.parameters():
                p.data.add_(torch.randn_like(p) * 1e-3)
            t.policy_version += 1
            t.engine.update_weights(t.backend.state_dict_for_rollout(), t.policy_version)
        pytest.fail("no trainable group in 20 rollout steps")
    finally:
        t.close()


def test_pois_ratio_is_one_on_a_single_update(tmp_path):
    m = _first_update_metrics(tmp_path, "algo.is_mode=pois")
    assert abs(m["train/ratio_mean"] - 1.0) < 1e-5
    assert m["train/clip_frac"] == 0.0


def test_sais_ratios_differ_from_one_on_multi_segment_samples(tmp_path):
    m = _first_update_metrics(tmp_path, "algo.is_mode=sais", "rollout.max_response_len=64", "rollout.segments=8")
    assert m["multi_segment"] == 1.0
    assert abs(m["train/ratio_mean"] - 1.0) > 1e-4


def test_nonfinite_loss_refuses_the_update(tmp_path):
    from ulorl.train.update import UpdateContext, policy_update

    t = Trainer(_cfg(tmp_path, "train.max_steps=1", "algo.is_mode=sais", "algo.dynamic_sampling=false"),
                run_dir=tmp_path / "r", progress=False)
    t.setup()
    try:
        samples = []
        for _ in range(20):
            out = t.train_step()
            samples = [s for g in out.rollout.groups for s in g]
            if samples:
                break
        assert samples
        for s in samples:
            s.old_logprobs = [float("nan")] * len(s.response_ids)
        before = _params(t.model)
        upd = policy_update(samples, UpdateContext.of_run(t.backend, t.cfg, t.pad_id, t.device))
        assert not upd.updated and "non-finite" in upd.reason
        assert upd.metrics["train/nonfinite"] == 1.0
        after = _params(t.model)
        assert all(torch.equal(before[k], after[k]) for k in before)
        assert all(p.grad is None for p in t.model.parameters())
    finally:
        t.close()


def test_cli_bad_inputs_give_clear_messages(tmp_path):
    exe = [sys.executable, "-m", "ulorl.cli.train", str(QUICK)]
    out = subprocess.run(exe + ["algo.mpt.taux=0.9"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "algo.mpt.taux: unknown key" in out.stderr
    missing = tmp_path / "nope.jsonl"
    out = subprocess.run(exe + [f"data.train={missing}", f"tracking.uri=sqlite:///{tmp_path}/m.db"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and str(missing) in out.stderr, out.stderr[-1500:]
