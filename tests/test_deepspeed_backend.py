"""DeepSpeed backend on CPU (gloo): 2-process data parallel == single-process torch, exact resume.

The multi-process part runs this file as a script under ``torch.distributed.run`` (2 ranks): rank 0
drives ``policy_update`` / ``save`` / ``load`` on a fixed set of released groups, rank 1 follows in
``worker_loop`` — the same driver/worker split a ``ulorl-train`` run uses. The reference is the
single-process ``TorchBackend`` on the same samples, in this pytest process.

Tolerance (fp32, lr = 1e-4, 3 rollout steps x 2 mini-batch updates, parameters move by up to 6e-4):
every parameter within ``PARAM_ATOL`` = 1e-5 (a tenth of one lr step) of the torch one, and 99.99 %
of them within ``BULK_ATOL`` = 1e-7. Sources of difference: float summation order (per-rank partial
gradients summed by the all-reduce, sharded no-grad pass with other padding); AdamW normalises each
gradient element, so the few elements whose gradient is ~1e-9 move by a visible fraction of lr when
the rounding changes. Measured on a 2-core CPU: max |delta| 9.98e-7, 99.99th percentile 1.9e-8,
median 0. Gradient scale errors (e.g. a missing x world-size) would hide behind AdamW and clipping,
so the pre-clip gradient norms are compared too (relative 1e-4).
Resume is exact: 3 straight steps == 1 step + save + load into a fresh engine + 2 steps, bit for bit.
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
PARAM_ATOL = 1e-5
BULK_ATOL = 1e-7
STEPS = 3
SAVE_AT = 1


# ----------------------------------------------------------------------------- shared helpers


def fixed_samples(vocab: int, seed: int = 0, groups: int = 5, group_size: int = 4):
    return released_groups(vocab, seed, groups, group_size)


def poisoned_samples(samples: list) -> list:
    """``samples`` with a first group of long rows whose rewards are NaN: its loss is NaN in the first
    mini-batch but only after shorter rows' micro-batches ran backward (rows go by length), and on
    one rank only. An update on these must be refused on every rank with no optimizer step and no
    gradient left behind, so a run that starts with it still matches the torch reference."""
    from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan

    bad = [Sample(sample_id=1000 + k, group_id=1000, prompt_ids=[5, 6, 7], response_ids=[9] * (70 + k),
                  sampling_logprobs=[-1.0] * (70 + k), segments=[SegmentSpan(0, 70 + k, 0)],
                  status=SampleStatus.FINISHED, reward=float("nan")) for k in range(4)]
    return bad + copy.deepcopy(samples)


def _vocab(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


def _params(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().clone() for k, v in sd.items()}


# ----------------------------------------------------------------------------- script mode (ranks)


def _param_memory(backend) -> dict[str, float]:
    """This rank's parameter bytes after init: ZeRO-3 partitions (``ds_tensor``) vs the full model."""
    params = list(backend.module.parameters())
    full = sum(int(getattr(p, "ds_numel", p.numel())) * p.element_size() for p in params)
    local = sum((p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel()) * p.element_size() for p in params)
    copy_bytes = 0 if backend.rollout_model is backend.module else sum(
        p.numel() * p.element_size() for p in backend.rollout_model.parameters())
    return {"full_mb": full / 2**20, "partition_mb": local / 2**20, "rollout_copy_mb": copy_bytes / 2**20}


def _script(argv: list[str]) -> None:
    from ulorl.models.loading import load_policy
    from ulorl.train.deepspeed_backend import DeepSpeedBackend
    from ulorl.train.update import UpdateContext, policy_update
    from ulorl.train.worker import load_train_model, worker_loop

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stage", type=int, default=2)
    ap.add_argument("--bf16", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = experiment(a.model, bf16=a.bf16, deepspeed={"zero_stage": a.stage})
    samples = fixed_samples(_vocab(a.model))
    rank = int(os.environ["RANK"])
    device = torch.device("cpu")
    timing: dict[str, float] = {}

    def new_backend() -> DeepSpeedBackend:
        # ZeRO-3: the trainer's load (partitioned while loading), then the rank-0 copy gathered from it
        model, tok = load_train_model(cfg, device) if a.stage == 3 else load_policy(str(a.model))
        t0 = time.perf_counter()
        b = DeepSpeedBackend(model, cfg.train)
        b.export_bucket_bytes = 64 << 10   # ZeRO-3 export in many buckets on the tiny model (same on every rank)
        timing.setdefault("init_s", time.perf_counter() - t0)
        return b, tok.pad_token_id

    backend, pad = new_backend()
    (a.out / f"mem_rank{rank}.json").write_text(json.dumps(_param_memory(backend)))
    if rank != 0:
        worker_loop(backend, cfg, pad, device)
        backend2, _ = new_backend()
        worker_loop(backend2, cfg, pad, device)
        return
    ckpt = a.out / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    refused = policy_update(poisoned_samples(samples), UpdateContext(backend, cfg.algo, cfg.train, 0.85, pad, device))
    assert not refused.updated
    metrics = []
    step_s = []
    for step in range(1, STEPS + 1):
        t0 = time.perf_counter()
        res = policy_update(copy.deepcopy(samples), UpdateContext(backend, cfg.algo, cfg.train, 0.85, pad, device))
        step_s.append(time.perf_counter() - t0)
        assert res.updated, res.reason
        metrics.append(res.metrics)
        if step == SAVE_AT:
            t0 = time.perf_counter()
            backend.save(ckpt)
            timing["save_s"] = time.perf_counter() - t0
    straight_sd = _params(backend.state_dict_for_rollout())
    torch.save(straight_sd, a.out / "straight.pt")
    if a.stage == 3:   # the streamed export (gathered per bucket, every rank joins) gives the same weights
        from ulorl.bench.weight_sync import PeakSampler

        with PeakSampler([os.getpid()], 0.002) as sampler:
            streamed = _params(dict(backend.named_weights_for_rollout()))
        timing["export_peak_extra_mb"] = sampler.extra()[os.getpid()] / 2**20
        timing["streamed_equal"] = streamed.keys() == straight_sd.keys() and all(
            torch.equal(streamed[k], straight_sd[k]) for k in straight_sd)
    backend.close()
    backend2, _ = new_backend()
    t0 = time.perf_counter()
    backend2.load(ckpt)
    timing["load_s"] = time.perf_counter() - t0
    for step in range(SAVE_AT + 1, STEPS + 1):
        res = policy_update(copy.deepcopy(samples), UpdateContext(backend2, cfg.algo, cfg.train, 0.85, pad, device))
        assert res.updated, res.reason
    torch.save(_params(backend2.state_dict_for_rollout()), a.out / "resumed.pt")
    backend2.close()
    timing["step_s"] = step_s
    (a.out / "result.json").write_text(json.dumps({"metrics": metrics, "timing": timing, "refused": refused.reason}))


# ----------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_random_model(tmp_path_factory.mktemp("randmodel"))


def torch_reference(model_dir: Path, **train: object) -> tuple[dict[str, torch.Tensor], list[dict]]:
    from ulorl.models.loading import load_policy
    from ulorl.train.backend import TorchBackend
    from ulorl.train.update import UpdateContext, policy_update

    cfg = experiment(model_dir, backend="torch", **train)
    model, tok = load_policy(str(model_dir))
    backend = TorchBackend(model, cfg.train)
    samples = fixed_samples(_vocab(model_dir))
    metrics = []
    for _ in range(STEPS):
        ctx = UpdateContext(backend, cfg.algo, cfg.train, 0.85, tok.pad_token_id, torch.device("cpu"))
        res = policy_update(copy.deepcopy(samples), ctx)
        assert res.updated, res.reason
        metrics.append(res.metrics)
    return _params(model.state_dict()), metrics


@pytest.fixture(scope="module")
def reference(model_dir) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The single-process torch run every 2-rank run here is compared with (computed once, read only)."""
    return torch_reference(model_dir)


def run_ranks(model_dir: Path, out: Path, *extra: str, nproc: int = 2, timeout: int = 600) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(Path(__file__).resolve()), "--model", str(model_dir), "--out", str(out), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads((out / "result.json").read_text())
    result["timing"]["wall_s"] = wall
    return result


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_two_rank_zero2_matches_torch_and_resumes_exactly(model_dir, reference, tmp_path):
    ref, ref_metrics = reference
    initial = _params(__import__("ulorl.models.loading", fromlist=["x"]).load_policy(str(model_dir))[0].state_dict())
    result = run_ranks(model_dir, tmp_path)
    straight = torch.load(tmp_path / "straight.pt")
    resumed = torch.load(tmp_path / "resumed.pt")
    moved = max_abs_diff(ref, initial)
    diff = max_abs_diff(ref, straight)
    print(f"timing {result['timing']}; max|param moved| {moved:.3e}; max|ds - torch| {diff:.3e}")
    assert moved > 10 * PARAM_ATOL, "the updates did not move the parameters: the comparison would be vacuous"
    assert "non-finite loss" in result["refused"]
    assert diff <= PARAM_ATOL, f"max |ds - torch| = {diff:.3e} > {PARAM_ATOL}"
    bulk = float(torch.cat([(ref[k] - straight[k]).abs().flatten() for k in ref]).quantile(0.9999))
    assert bulk <= BULK_ATOL, f"99.99th percentile of |ds - torch| = {bulk:.3e} > {BULK_ATOL}"
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), f"resume not exact at {k}"
    for m_ds, m_t in zip(result["metrics"], ref_metrics):
        assert m_ds["train/grad_norm"] == pytest.approx(m_t["train/grad_norm"], rel=1e-4)
        assert m_ds["train/pg_loss"] == pytest.approx(m_t["train/pg_loss"], rel=1e-4, abs=1e-7)
        for key in ("train/entropy", "train/masked_frac", "train/tokens", "train/updates"):
            assert m_ds[key] == pytest.approx(m_t[key], rel=1e-5), key


@pytest.mark.slow
def test_two_rank_zero3_matches_torch_and_resumes_exactly(model_dir, reference, tmp_path):
    ref, ref_metrics = reference
    result = run_ranks(model_dir, tmp_path, "--stage", "3")
    straight = torch.load(tmp_path / "straight.pt")
    resumed = torch.load(tmp_path / "resumed.pt")
    diff = max_abs_diff(ref, straight)
    mem = {r: json.loads((tmp_path / f"mem_rank{r}.json").read_text()) for r in (0, 1)}
    print(f"zero-3 timing {result['timing']}; max|ds - torch| {diff:.3e}; parameter memory per rank {mem}")
    assert result["timing"]["streamed_equal"], "streamed ZeRO-3 export differs from the gathered state dict"
    for r in (0, 1):   # ZeRO-3: each rank holds about half of the parameters after init
        assert mem[r]["partition_mb"] <= 0.5 * mem[r]["full_mb"] * 1.05 + 0.01
    assert diff <= PARAM_ATOL, f"max |ds - torch| = {diff:.3e} > {PARAM_ATOL}"
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    for m_ds, m_t in zip(result["metrics"], ref_metrics):
        assert m_ds["train/grad_norm"] == pytest.approx(m_t["train/grad_norm"], rel=1e-4)


@pytest.mark.slow
def test_two_rank_zero2_bf16_trains_and_resumes_exactly(model_dir, reference, tmp_path):
    """bf16 keeps bf16 weights (fp32 master copy in the optimizer): compared with fp32 torch only
    through the gradient norms (1%), and the parameters must have moved; resume stays exact."""
    ref, ref_metrics = reference
    result = run_ranks(model_dir, tmp_path, "--bf16")
    straight = torch.load(tmp_path / "straight.pt")
    resumed = torch.load(tmp_path / "resumed.pt")
    initial = _params(__import__("ulorl.models.loading", fromlist=["x"]).load_policy(str(model_dir))[0].state_dict())
    assert max_abs_diff(straight, initial) > 1e-4
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    for m_ds, m_t in zip(result["metrics"], ref_metrics):
        assert m_ds["train/grad_norm"] == pytest.approx(m_t["train/grad_norm"], rel=1e-2)


def test_gpu_check_without_cuda_exits_2_with_a_clear_message():
    out = subprocess.run([sys.executable, "-m", "ulorl.bench.gpu_check", "--json"], capture_output=True, text=True,
                         timeout=120)
    if torch.cuda.is_available():  # on a GPU machine the full check runs instead
        assert out.returncode == 0, out.stdout + out.stderr
        return
    assert out.returncode == 2
    assert "no CUDA device visible" in out.stderr
    assert json.loads(out.stdout)["ok"] is False


def test_scale_modules_do_not_import_deepspeed_or_ray():
    code = ("import sys, ulorl, ulorl.train.trainer, ulorl.train.distributed, ulorl.train.deepspeed_backend, "
            "ulorl.scale.layout, ulorl.scale.placement, ulorl.bench.gpu_check; "
            "bad = [m for m in ('deepspeed', 'ray') if m in sys.modules]; assert not bad, bad")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


# ----------------------------------------------------------------------------- pure helpers


def test_shard_groups_keeps_groups_whole_and_balances_cost():
    from ulorl.train.distributed import shard_groups

    # groups: 0 -> rows 0,1 (cost 10+10), 1 -> rows 2,3 (cost 1+1), 2 -> rows 4,5 (cost 6+6)
    shards = shard_groups([0, 0, 1, 1, 2, 2], [10, 10, 1, 1, 6, 6], 2)
    assert shards == [[0, 1], [2, 3, 4, 5]]          # 20 vs 2 + 12
    assert shard_groups([7, 7], [3, 3], 3) == [[0, 1], [], []]
    assert shard_groups([1, 2, 1], [1, 1, 1], 1) == [[0, 1, 2]]


def test_padded_micro_batches_give_every_rank_the_same_pass_count():
    from ulorl.rollout.types import Sample, SegmentSpan
    from ulorl.train.batch import build_train_batch
    from ulorl.train.distributed import padded_micro_batches

    lens = [2, 2, 8, 8]
    samples = [Sample(sample_id=i, group_id=i // 2, prompt_ids=[1, 2], response_ids=[5] * t, reward=1.0,
                      segments=[SegmentSpan(0, t, 0)]) for i, t in enumerate(lens)]
    batch = build_train_batch(samples, 0)
    shards = [[0, 1], [2, 3]]                 # sequence lengths 4, 4 | 10, 10
    r0 = padded_micro_batches(batch, shards, 0, token_budget=10)
    r1 = padded_micro_batches(batch, shards, 1, token_budget=10)
    assert r1 == [([2], 1.0), ([3], 1.0)]     # 2 x 10 > 10: one row per pass
    assert r0 == [([0, 1], 1.0), ([0], 0.0)]  # padded with a weight-0 pass over the shortest row
    assert padded_micro_batches(batch, [[0, 1, 2, 3], []], 1, 100) == [([0], 0.0)]


if __name__ == "__main__":
    from ulorl.train.distributed import shutdown_process_group

    _script(sys.argv[1:])
    shutdown_process_group()
