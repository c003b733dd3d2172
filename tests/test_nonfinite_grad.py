"""A NaN gradient on one rank skips the optimizer step on every rank (DeepSpeed backend, CPU, gloo).

Two processes under ``torch.distributed.run``, the trainer's driver / worker split (rank 0 drives
``policy_update``, rank 1 follows in ``worker_loop``). Rank 1 alone poisons one element of the
gradient of the final hidden states in the first training backward of the first update (a hook on
the final norm; the loss stays finite, so only the gradient guard can catch it). Rank 0's own
gradients are finite: it must still skip, as DeepSpeed reduces the gradients (and their norm) over
both ranks.

Per configuration (ZeRO-3 bf16, ZeRO-3 fp32, ZeRO-2 fp32):
* the poisoned update is refused with ``train/nonfinite_grad_steps`` = 1 and the weights are
  bit-identical to those before it (no optimizer step, no partial step on any partition);
* the next, clean update trains (metric 0) and gives bit-identical weights to the same clean update
  on a freshly built backend: the skipped step left no gradient, Adam moment or step count behind.

This file runs itself under ``torch.distributed.run`` (``--nproc_per_node`` 2).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ds_fixtures import build_random_model, experiment, released_groups

ROOT = Path(__file__).resolve().parents[1]
CONFIGS: dict[str, tuple[int, bool]] = {"zero3_bf16": (3, True), "zero3_fp32": (3, False), "zero2_fp32": (2, False)}


def _arm_nan_gradient(module: torch.nn.Module) -> dict[str, int]:
    """Make the first gradient flowing into ``module``'s output (under grad mode) NaN at one element."""
    state = {"armed": 1, "fired": 0}

    def poison(grad: torch.Tensor) -> torch.Tensor:
        state["fired"] += 1
        grad = grad.clone()
        grad.view(-1)[0] = float("nan")
        return grad

    def hook(_mod: torch.nn.Module, _inputs: object, out: torch.Tensor) -> None:
        if state["armed"] and torch.is_grad_enabled() and out.requires_grad:
            state["armed"] = 0
            out.register_hook(poison)

    module.register_forward_hook(hook)
    return state


def _weights(backend) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().clone() for k, v in backend.state_dict_for_rollout().items()}


def _script(argv: list[str]) -> None:
    from ulorl.models.loading import load_policy
    from ulorl.tracking.schema import NONFINITE_GRAD_METRIC
    from ulorl.train.deepspeed_backend import DeepSpeedBackend
    from ulorl.train.update import UpdateContext, policy_update
    from ulorl.train.worker import load_train_model, worker_loop

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--config", choices=sorted(CONFIGS), required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    stage, bf16 = CONFIGS[a.config]
    rank = int(os.environ["RANK"])
    device = torch.device("cpu")
    cfg = experiment(a.model, bf16=bf16, deepspeed={"zero_stage": stage})

    def new_backend() -> tuple[DeepSpeedBackend, int]:
        model, tok = load_train_model(cfg, device) if stage == 3 else load_policy(str(a.model))
        return DeepSpeedBackend(model, cfg.train), tok.pad_token_id

    backend, pad = new_backend()
    samples = released_groups(backend.module.config.vocab_size, groups=4)
    if rank != 0:
        state = _arm_nan_gradient(backend.module.model.norm)
        first = worker_loop(backend, cfg, pad, device)
        fresh, _ = new_backend()
        second = worker_loop(fresh, cfg, pad, device)
        (a.out / "worker.json").write_text(json.dumps({"fired": state["fired"], "updates": first["updates"],
                                                       "fresh_updates": second["updates"]}))
        return

    def update(b: DeepSpeedBackend):
        return policy_update(copy.deepcopy(samples), UpdateContext(b, cfg.algo, cfg.train, 0.85, pad, device))

    before = _weights(backend)
    poisoned = update(backend)
    after_poisoned = _weights(backend)
    clean = update(backend)
    after_clean = _weights(backend)
    backend.close()
    fresh, _ = new_backend()
    reference = update(fresh)
    after_reference = _weights(fresh)
    fresh.close()
    torch.save({"before": before, "after_poisoned": after_poisoned, "after_clean": after_clean,
                "after_reference": after_reference}, a.out / "weights.pt")
    keys = ("train/grad_norm", "train/nonfinite", NONFINITE_GRAD_METRIC, "train/updates")
    (a.out / "driver.json").write_text(json.dumps({
        "poisoned": {"updated": poisoned.updated, "reason": poisoned.reason,
                     **{k: poisoned.metrics.get(k) for k in keys}},
        "clean": {"updated": clean.updated, **{k: clean.metrics.get(k) for k in keys}},
        "reference": {"updated": reference.updated, **{k: reference.metrics.get(k) for k in keys}},
    }))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_random_model(tmp_path_factory.mktemp("randmodel"))


def run_config(model_dir: Path, out: Path, config: str, timeout: int = 600) -> tuple[dict, dict, dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(Path(__file__).resolve()), "--model", str(model_dir), "--out", str(out), "--config", config]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    print(f"{config}: {time.perf_counter() - t0:.1f} s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return (json.loads((out / "driver.json").read_text()), json.loads((out / "worker.json").read_text()),
            torch.load(out / "weights.pt"))


def _check(model_dir: Path, out: Path, config: str) -> None:
    from ulorl.tracking.schema import NONFINITE_GRAD_METRIC

    driver, worker, w = run_config(model_dir, out, config)
    assert worker["fired"] == 1, "the NaN hook never fired on rank 1: the test would prove nothing"
    bad = driver["poisoned"]
    assert not bad["updated"] and "non-finite gradient norm" in bad["reason"], bad
    assert bad[NONFINITE_GRAD_METRIC] == 1.0 and bad["train/nonfinite"] == 1.0
    for k in w["before"]:
        assert torch.equal(w["after_poisoned"][k], w["before"][k]), f"{config}: {k} changed by the skipped step"
    assert worker["updates"] == 1 and worker["fresh_updates"] == 1   # rank 1 refused the poisoned update too
    for key in ("clean", "reference"):
        assert driver[key]["updated"] and driver[key][NONFINITE_GRAD_METRIC] == 0.0, driver[key]
    moved = max(float((w["after_clean"][k] - w["before"][k]).abs().max()) for k in w["before"])
    assert moved > 0, "the clean update did not move the weights"
    for k in w["before"]:
        assert torch.equal(w["after_clean"][k], w["after_reference"][k]), f"{config}: {k}: state left by the skip"
    assert driver["clean"]["train/grad_norm"] == driver["reference"]["train/grad_norm"]


@pytest.mark.parametrize("config", ["zero2_fp32", pytest.param("zero3_fp32", marks=pytest.mark.slow),
                                    pytest.param("zero3_bf16", marks=pytest.mark.slow)])
def test_nan_gradient_on_one_rank_skips_the_step_on_every_rank(model_dir, tmp_path, config):
    _check(model_dir, tmp_path, config)


if __name__ == "__main__":
    from ulorl.train.distributed import shutdown_process_group

    _script(sys.argv[1:])
    shutdown_process_group()
