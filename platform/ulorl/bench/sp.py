"""Per-rank activation memory of one training micro-step on a long row, SP = 1 vs SP = N (CPU, gloo).

Run under the launcher, one process per SP rank (``--nproc_per_node=1`` measures SP = 1)::

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m ulorl.bench.sp --seq-len 8192

Every rank builds the same random Qwen3 (``--hidden``, ``--layers``, ``--vocab``), runs forward,
chunked log-probs, the Eq. 10 loss and backward on one row of ``--seq-len`` tokens (its shard of it
under SP), and reports: ``saved_mb`` (bytes autograd saved for backward, counted by a
``saved_tensors_hooks`` pack hook, each storage once), ``peak_rss_extra_mb`` (process max RSS after
the step minus RSS before it) and ``seconds``. Rank 0 prints one JSON object with every rank's numbers.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch
import torch.distributed as td

from ulorl.algo import policy_loss
from ulorl.rollout.types import Sample, SegmentSpan
from ulorl.train.batch import build_train_batch
from ulorl.train.distributed import (
    ensure_process_group,
    make_process_groups,
    parallel_layout,
)
from ulorl.train.forward import token_stats
from ulorl.train.sequence_parallel import sharded_token_stats


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build_model(hidden: int, layers: int, vocab: int, heads: int, kv_heads: int) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                      max_position_embeddings=1 << 18, tie_word_embeddings=True, attn_implementation="sdpa")  # type: ignore[call-arg]
    return Qwen3ForCausalLM(cfg).float()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m ulorl.bench.sp", description=__doc__.split("\n")[0])
    ap.add_argument("--seq-len", type=int, default=8192, help="tokens of the row (prompt 64 + response)")
    ap.add_argument("--hidden", type=int, default=128, help="model hidden size")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers")
    ap.add_argument("--vocab", type=int, default=512, help="vocabulary size")
    ap.add_argument("--heads", type=int, default=4, help="attention heads (divisible by the SP degree)")
    ap.add_argument("--kv-heads", type=int, default=2, help="key/value heads")
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing on")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    ensure_process_group("cpu")
    rank, world = td.get_rank(), td.get_world_size()
    groups = make_process_groups(parallel_layout(world, world), rank)
    model = build_model(a.hidden, a.layers, a.vocab, a.heads, a.kv_heads)
    if a.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]
    model.train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, a.vocab, (a.seq_len,), generator=g).tolist()
    resp = ids[64:]
    batch = build_train_batch([Sample(sample_id=0, group_id=0, prompt_ids=ids[:64], response_ids=resp, reward=1.0,
                                      segments=[SegmentSpan(0, len(resp), 0)])], 0)
    old = -torch.rand(batch.targets.shape, generator=g) * batch.response_mask
    seen: set[int] = set()
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            saved[0] += t.untyped_storage().nbytes()
        return t

    cpu = torch.device("cpu")
    td.barrier()
    rss0 = _rss_mb()
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if world == 1:
            lp, _ = token_stats(model, batch, 1.0, cpu, "chunked", with_entropy=False)
            lo = 0
        else:
            lp, _, lo = sharded_token_stats(model, batch, 1.0, cpu, groups.sp_group, groups.sp_rank, world,
                                            with_entropy=False)
        w = lp.shape[1]
        loss, _ = policy_loss(lp, old[:, lo:lo + w], torch.tensor([1.0]), batch.response_mask[:, lo:lo + w],
                              num_tokens=batch.num_response_tokens)
    loss.backward()
    secs = time.perf_counter() - t0
    mine = torch.tensor([saved[0] / 2**20, _max_rss_mb() - rss0, secs], dtype=torch.float64)
    every = [torch.zeros_like(mine) for _ in range(world)]
    td.all_gather(every, mine)
    if rank == 0:
        print(json.dumps({"seq_len": a.seq_len, "sp": world, "checkpointing": a.checkpointing,
                          "ranks": [{"saved_mb": round(float(r[0]), 1), "peak_rss_extra_mb": round(float(r[1]), 1),
                                     "seconds": round(float(r[2]), 2)} for r in every]}))
    td.barrier()
    td.destroy_process_group()


if __name__ == "__main__":
    main()
