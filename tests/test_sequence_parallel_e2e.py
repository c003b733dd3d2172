"""``policy_update`` with ``train.sequence_parallel: 2`` on 2 gloo ranks (DeepSpeed ZeRO-2) == one torch process.

The script part runs under ``torch.distributed.run``: rank 0 drives ``policy_update`` on released
groups whose longer rows exceed ``train.micro_batch_tokens`` (so they are split along the sequence
over the SP group of both ranks, through DeepSpeed's Ulysses attention), rank 1 follows in
``worker_loop``. The reference is ``TorchBackend`` in this pytest process on the same samples.
Tolerances as in ``test_deepspeed_backend.py`` (AdamW lr 1e-4, fp32).
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
STEPS = 2
CAP = 48           # train.micro_batch_tokens: rows of 49+ tokens go to sequence parallelism
PARAM_ATOL = 1e-5


def sp_experiment(model_dir: Path, **train: object):
    return experiment(model_dir, **{"micro_batch_tokens": CAP, "sequence_parallel": 2, **train})


def samples(vocab: int) -> list:
    return released_groups(vocab, groups=4, base_len=40, len_step=15)


def _params(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().clone() for k, v in sd.items()}


def _script(argv: list[str]) -> None:
    from ulorl.models.loading import load_policy
    from ulorl.train import sequence_parallel
    from ulorl.train.deepspeed_backend import DeepSpeedBackend
    from ulorl.train.update import UpdateContext, policy_update
    from ulorl.train.worker import worker_loop

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stage", type=int, default=2, help="ZeRO stage")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = sp_experiment(a.model, deepspeed={"zero_stage": a.stage})
    model, tok = load_policy(str(a.model))
    backend = DeepSpeedBackend(model, cfg.train)
    device = torch.device("cpu")
    if int(os.environ["RANK"]) != 0:
        worker_loop(backend, cfg, tok.pad_token_id, device)
        return
    data = samples(model.config.vocab_size)
    metrics = []
    for _ in range(STEPS):
        ctx = UpdateContext(backend, cfg.algo, cfg.train, 0.85, tok.pad_token_id, device)
        res = policy_update(copy.deepcopy(data), ctx)
        assert res.updated, res.reason
        metrics.append(res.metrics)
    torch.save(_params(backend.state_dict_for_rollout()), a.out / "sp.pt")
    used = sorted(sequence_parallel._INSTALLED)
    backend.close()
    (a.out / "result.json").write_text(json.dumps({"metrics": metrics, "ulysses_installed": used}))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_random_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def reference(model_dir) -> tuple[dict[str, torch.Tensor], list[dict], dict[str, torch.Tensor]]:
    """One torch process on the same samples, computed once for both ZeRO stages (read only):
    (final parameters, per-step metrics, initial parameters)."""
    from ulorl.models.loading import load_policy
    from ulorl.train.backend import TorchBackend
    from ulorl.train.update import UpdateContext, policy_update

    cfg = sp_experiment(model_dir, backend="torch", sequence_parallel=1)
    model, tok = load_policy(str(model_dir))
    initial = _params(model.state_dict())
    backend = TorchBackend(model, cfg.train)
    ref = []
    data = samples(model.config.vocab_size)
    for _ in range(STEPS):
        ctx = UpdateContext(backend, cfg.algo, cfg.train, 0.85, tok.pad_token_id, torch.device("cpu"))
        r = policy_update(copy.deepcopy(data), ctx)
        assert r.updated, r.reason
        ref.append(r.metrics)
    return _params(model.state_dict()), ref, initial


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_policy_update_sp2_on_two_ranks_matches_one_torch_process(tmp_path, model_dir, reference, stage):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(Path(__file__).resolve()), "--model", str(model_dir), "--out", str(tmp_path), "--stage", str(stage)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["ulysses_installed"] == ["sdpa"]

    want, ref, initial = reference
    got = torch.load(tmp_path / "sp.pt")
    assert got.keys() == want.keys()
    diff = max(float((got[k] - want[k]).abs().max()) for k in want)
    moved = max(float((want[k] - v).abs().max()) for k, v in initial.items())
    assert moved > 1e-4 and diff <= PARAM_ATOL, (diff, moved)
    for m_sp, m_ref in zip(res["metrics"], ref):
        assert m_sp["train/rows_over_cap"] == m_ref["train/rows_over_cap"] > 0
        for key in ("train/grad_norm", "train/pg_loss", "train/entropy", "train/tokens", "train/masked_frac"):
            assert m_sp[key] == pytest.approx(m_ref[key], rel=1e-4, abs=1e-6), key


if __name__ == "__main__":
    from ulorl.train.distributed import shutdown_process_group

    _script(sys.argv[1:])
    shutdown_process_group()
