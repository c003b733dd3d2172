"""A rollout correction on two DeepSpeed ranks (CPU, gloo) equals it in one torch process: the engine's
log-probs reach rank 1 with the released samples (``ulorl.train.transport``) and every rank weighs and
rejects the same tokens. Run as a script under ``torch.distributed.run`` by the test (as
tests/test_deepspeed_backend.py does), rank 0 driving ``policy_update`` and rank 1 in ``worker_loop``.

The engine log-probs are the model's own (temperature 0.85) shifted per token by 0, +0.3 or -1.0 nats, so
under ``token_mis`` (C = 2) the ratio pi_old / mu is 1, exp(-0.3) or e = 2.72: a third of the tokens are
rejected and the rest weighted.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ds_fixtures import build_random_model, experiment, released_groups

ROOT = Path(__file__).resolve().parents[1]
SHIFTS = (0.0, 0.3, -1.0)
STEPS = 2


def _samples(model_dir: Path):
    """Released groups whose engine log-probs are the model's own shifted by SHIFTS (round-robin)."""
    from ulorl.models.loading import load_policy
    from ulorl.train.batch import build_train_batch
    from ulorl.train.forward import current_token_stats

    model, tok = load_policy(str(model_dir))
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    samples = released_groups(vocab, groups=4)
    batch = build_train_batch(samples, tok.pad_token_id)
    lp, _ = current_token_stats(model, batch, 0.85, 4096, torch.device("cpu"))
    for b, s in enumerate(samples):
        p, t = len(s.prompt_ids), len(s.response_ids)
        s.sampling_logprobs = [float(x) + SHIFTS[j % 3] for j, x in enumerate(lp[b, p - 1:p - 1 + t].tolist())]
    return samples, tok.pad_token_id


def _cfg(model_dir: Path, backend: str):
    cfg = experiment(model_dir, backend=backend)
    rc = cfg.algo.rollout_correction.model_copy(update={"mode": "token_mis"})
    return cfg.model_copy(update={"algo": cfg.algo.model_copy(update={"rollout_correction": rc})})


def _script(argv: list[str]) -> None:
    from ulorl.models.loading import load_policy
    from ulorl.train.deepspeed_backend import DeepSpeedBackend
    from ulorl.train.update import UpdateContext, policy_update
    from ulorl.train.worker import worker_loop

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = _cfg(a.model, "deepspeed")
    samples, pad = _samples(a.model)
    model, _ = load_policy(str(a.model))
    backend = DeepSpeedBackend(model, cfg.train)
    device = torch.device("cpu")
    if int(os.environ["RANK"]) != 0:
        worker_loop(backend, cfg, pad, device)
        return
    metrics = []
    for _ in range(STEPS):
        res = policy_update(copy.deepcopy(samples), UpdateContext(backend, cfg.algo, cfg.train, 0.85, pad, device), 0)
        assert res.updated, res.reason
        metrics.append(res.metrics)
    torch.save({k: v.detach().float().clone() for k, v in backend.state_dict_for_rollout().items()}, a.out / "ds.pt")
    backend.close()
    (a.out / "metrics.json").write_text(json.dumps(metrics))


@pytest.mark.slow
def test_two_ranks_apply_the_correction_as_one_process(tmp_path):
    from ulorl.models.loading import load_policy
    from ulorl.train.backend import TorchBackend
    from ulorl.train.update import UpdateContext, policy_update

    model_dir = build_random_model(tmp_path / "model")
    cfg = _cfg(model_dir, "torch")
    samples, pad = _samples(model_dir)
    model, _ = load_policy(str(model_dir))
    initial = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    backend = TorchBackend(model, cfg.train)
    ref_metrics = []
    for _ in range(STEPS):
        res = policy_update(copy.deepcopy(samples), UpdateContext(backend, cfg.algo, cfg.train, 0.85, pad,
                                                                   torch.device("cpu")), 0)
        ref_metrics.append(res.metrics)
    # a third of the tokens (shift -1: ratio e > C) rejected, every step, on both sides
    assert ref_metrics[0]["correction/rejected_frac"] == pytest.approx(1 / 3, abs=0.05)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(Path(__file__).resolve()), "--model", str(model_dir), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    ds = torch.load(tmp_path / "ds.pt")
    ref = {k: v.detach().float() for k, v in model.state_dict().items()}
    diff = max(float((ds[k] - ref[k]).abs().max()) for k in ds)
    moved = max(float((initial[k] - ref[k]).abs().max()) for k in ref)
    assert moved > 1e-4, "the updates did not move the parameters: the comparison would be vacuous"
    assert diff <= 1e-5, f"max |ds - torch| = {diff:.3e}"
    for m_ds, m_t in zip(json.loads((tmp_path / "metrics.json").read_text()), ref_metrics):
        assert m_ds["train/grad_norm"] == pytest.approx(m_t["train/grad_norm"], rel=1e-4)
        for key in ("correction/rejected_frac", "correction/weight_mean", "mismatch/abs_mean"):
            assert m_ds[key] == pytest.approx(m_t[key], rel=1e-5), key


if __name__ == "__main__":
    _script(sys.argv[1:])
