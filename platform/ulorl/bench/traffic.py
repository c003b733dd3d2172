"""Bytes of control traffic per update step of a 2-rank DeepSpeed run (gloo on CPU).

    python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        platform/ulorl/bench/traffic.py --out OUT.json [--rows 32 --response 4096 --prompt 256]

Counts every byte handed to ``torch.distributed`` broadcast / all_reduce on rank 0 (the pickled
object-list broadcasts go through ``broadcast`` too) during ``--steps`` ``policy_update`` calls on
fixed random samples of the given shape; the random tiny model keeps compute small. Run by path so
the same script can measure another checkout (``PYTHONPATH=<checkout>/platform``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed.distributed_c10d as c10d


def _counting(fn, box: dict[str, int], kind: str, group: object):
    """``fn`` counting the bytes of tensors sent on ``group`` (the control group, not DeepSpeed's)."""
    def wrapped(tensor, *a, **k):
        if k.get("group") is group:
            box[kind] = box.get(kind, 0) + tensor.numel() * tensor.element_size()
        return fn(tensor, *a, **k)
    return wrapped


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--response", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(1)
    from ulorl.config import config_from_dict
    from ulorl.models.loading import load_policy
    from ulorl.models.tiny import build_tiny_model
    from ulorl.models.tokenizer import build_tokenizer
    from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan
    from ulorl.train.deepspeed_backend import DeepSpeedBackend
    try:
        from ulorl.train.worker import worker_loop
    except ImportError:  # a checkout from before train/worker.py
        worker_loop = importlib.import_module("ulorl.train.distributed").worker_loop
    update = importlib.import_module("ulorl.train.update")  # by name: older checkouts have another signature

    rank = int(os.environ["RANK"])
    model_dir = Path(tempfile.gettempdir()) / f"ulorl-traffic-model-{os.environ.get('MASTER_PORT', '0')}"
    if rank == 0:
        tok = build_tokenizer()
        m = build_tiny_model(tok, seed=0)
        m.save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
    cfg = config_from_dict({
        "model": {"name_or_path": str(model_dir)},
        "algo": {"dynamic_sampling": False},
        "train": {"backend": "deepspeed", "micro_batch_tokens": a.prompt + a.response, "lr": 1e-4,
                  "deepspeed": {"zero_stage": 2}},
    })
    backend = None
    # model files must exist before rank 1 loads them: the process group is the first barrier
    from ulorl.train.distributed import ensure_process_group
    ensure_process_group("cpu")
    torch.distributed.barrier()
    model, tok = load_policy(str(model_dir))
    backend = DeepSpeedBackend(model, cfg.train)
    vocab = model.config.vocab_size
    box: dict[str, int] = {}
    if backend.data_parallel is None:
        raise RuntimeError("the traffic bench needs 2 ranks (python -m torch.distributed.run --nproc_per_node=2)")
    grp = backend.data_parallel.group
    # object-list broadcasts call c10d's, the code calls torch.distributed's
    c10d.broadcast = _counting(c10d.broadcast, box, "broadcast", grp)
    c10d.all_reduce = _counting(c10d.all_reduce, box, "all_reduce", grp)
    torch.distributed.broadcast = _counting(torch.distributed.broadcast, box, "broadcast", grp)
    torch.distributed.all_reduce = _counting(torch.distributed.all_reduce, box, "all_reduce", grp)
    device = torch.device("cpu")
    if rank != 0:
        worker_loop(backend, cfg, tok.pad_token_id, device)
        return
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(a.rows):
        t = int(torch.randint(a.response // 2, a.response + 1, (1,), generator=g))
        samples.append(Sample(
            sample_id=i, group_id=i // a.group, prompt_ids=torch.randint(3, vocab, (a.prompt,), generator=g).tolist(),
            response_ids=torch.randint(3, vocab, (t,), generator=g).tolist(), sampling_logprobs=[-1.234567] * t,
            segments=[SegmentSpan(0, t, 0)], status=SampleStatus.FINISHED, reward=float(i % 2),
            prompt_text="x" * (4 * a.prompt),
        ))
    box.clear()
    for _ in range(a.steps):
        if hasattr(update, "UpdateContext"):
            res = update.policy_update(samples, update.UpdateContext(backend, cfg.algo, cfg.train, 1.0,
                                                                     tok.pad_token_id, device))
        else:  # a checkout from before UpdateContext
            res = update.policy_update(samples, backend, cfg.algo, cfg.train, 1.0, tok.pad_token_id, device)
        assert res.updated, res.reason
    per_step = {k: v // a.steps for k, v in box.items()}
    traffic = getattr(backend.data_parallel, "traffic", None)
    backend.close()
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    a.out.write_text(json.dumps({"rows": a.rows, "tokens": tokens, "bytes_per_step_rank0": per_step,
                                 "total_bytes_per_step": sum(per_step.values()),
                                 "traffic_by_kind": {k: v // a.steps for k, v in traffic.items()} if traffic else None},
                                indent=1))


if __name__ == "__main__":
    main()
    from ulorl.train.distributed import shutdown_process_group

    shutdown_process_group()
