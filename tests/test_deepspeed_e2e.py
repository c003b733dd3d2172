"""``torchrun --nproc_per_node=2 -m ulorl.cli.train ... train.backend=deepspeed`` on CPU (gloo).

Rank 0 runs the rollout and MLflow, rank 1 follows (``ulorl.train.distributed``). These check the
launch plumbing end to end: one MLflow run (rank 0 only), both ranks' ZeRO shards in the trainer's
checkpoint, and (slow) an exact resume after a stop: the resumed run's weights, pools and logged
metrics equal a straight run's. The straight run is launched once and read by both tests.

Model: the shipped embedded (warm-started) model with real math-verify rewards; the numerics of
the data-parallel update against single-process torch are in test_deepspeed_backend.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from ulorl.models.loading import embedded_model_dir
from ulorl.train.checkpoint import latest_checkpoint, read_trainer_state

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "quickstart.yaml"
SMALL = [
    "train.backend=deepspeed",
    "train.deepspeed.zero_stage=2",
    "rollout.prompts_per_step=4",          # with these seeds step 3 has groups with mixed rewards
    "rollout.group_size=4",
    "rollout.max_response_len=96",
    "rollout.segments=4",
    "train.threads=1",
    "train.lr=1e-4",
    "train.micro_batch_tokens=160",
    "eval.every=0",
    "algo.dynamic_sampling=false",
    "train.checkpoint_every=1",
    "train.keep_checkpoints=3",
]


@pytest.fixture(scope="module")
def model_arg() -> str:
    return "model.name_or_path=embedded"


def torchrun_train(tmp_path: Path, model_arg: str, run_dir: Path, *extra: str, timeout: int = 600):
    """``extra``: overrides, then optionally ``--resume DIR`` (else the run goes to ``run_dir``)."""
    overrides = [e for e in extra if "=" in e]
    flags = [e for e in extra if "=" not in e] or ["--run-dir", str(run_dir)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "ulorl.cli.train", str(QUICK), *SMALL, model_arg, *overrides,
           f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", "--no-progress", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)
    print(f"torchrun {' '.join(extra)}: {time.perf_counter() - t0:.1f}s")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return out


STEPS = 3


@pytest.fixture(scope="module")
def straight(tmp_path_factory, model_arg) -> tuple[Path, Path, str]:
    """One 2-rank run of STEPS steps in a store of its own: (store folder, run folder, stdout). Both tests
    read it (one torchrun launch less): the first its logging and checkpoint, the second as the straight run."""
    store = tmp_path_factory.mktemp("ds_e2e_straight")
    run_dir = store / "run"
    out = torchrun_train(store, model_arg, run_dir, f"train.max_steps={STEPS}")
    return store, run_dir, out.stdout


@pytest.mark.slow  # ~40-65 s; the default suite covers the same driver/worker path in test_placement_ray.py
def test_two_ranks_train_log_once_and_checkpoint_both_shards(straight):
    store, run_dir, stdout = straight
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    # only rank 0 prints the run summary (ulorl.cli.train); rank 1 exits quietly with status 0
    assert stdout.count(f"run {run_id} finished after {STEPS} steps") == 1, stdout
    client = MlflowClient(f"sqlite:///{store}/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.run_id for r in runs] == [run_id], "only rank 0 may create an MLflow run"
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["train.backend"] == "deepspeed"
    steps = sorted(m.step for m in client.get_metric_history(run_id, "time/step_s"))
    assert steps == list(range(1, STEPS + 1))
    ckpt = latest_checkpoint(run_dir)
    assert read_trainer_state(ckpt)["step"] == STEPS
    shards = sorted(p.name for p in (ckpt / "deepspeed" / "state").glob("*optim_states.pt"))
    assert shards == ["zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert (ckpt / "model" / "model.safetensors").is_file()


@pytest.mark.slow
def test_two_ranks_resume_after_stop_is_exact(tmp_path, model_arg, straight):
    from safetensors.torch import load_file

    straight_store, straight_dir, _ = straight
    stopped_dir = tmp_path / "stopped"
    torchrun_train(tmp_path, model_arg, stopped_dir, "train.max_steps=1")
    torchrun_train(tmp_path, model_arg, stopped_dir, f"train.max_steps={STEPS}", "--resume", str(stopped_dir))

    a, b = latest_checkpoint(straight_dir), latest_checkpoint(stopped_dir)
    sa, sb = read_trainer_state(a), read_trainer_state(b)
    assert sa["step"] == sb["step"] == STEPS
    assert sa["policy_version"] == sb["policy_version"]
    assert json.dumps(sa["scheduler"], sort_keys=True) == json.dumps(sb["scheduler"], sort_keys=True)
    wa, wb = load_file(str(a / "model" / "model.safetensors")), load_file(str(b / "model" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    w0 = load_file(str(embedded_model_dir() / "model.safetensors"))
    assert max(float((wa[k].float() - w0[k].float()).abs().max()) for k in w0) > 0, "no update moved the weights"
    ra = (straight_dir / "mlflow_run_id").read_text().strip()
    rb = (stopped_dir / "mlflow_run_id").read_text().strip()
    ca, cb = MlflowClient(f"sqlite:///{straight_store}/mlflow.db"), MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    for key in ("train/tokens", "rollout/response_len_mean", "train/entropy", "train/grad_norm"):
        ha = {m.step: m.value for m in ca.get_metric_history(ra, key)}
        hb = {m.step: m.value for m in cb.get_metric_history(rb, key)}
        assert ha == hb, key
