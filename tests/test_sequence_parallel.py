"""Sequence parallelism (``train.sequence_parallel``): SP = 2 over 2 gloo ranks == SP = 1.

The 2-rank part runs this file as a script under ``torch.distributed.run``: both ranks build the
same tiny Qwen3 (seeded), compute the SP = 1 reference (whole row, chunked log-probs, Eq. 10 loss,
backward), then the SP = 2 path (``sharded_token_stats`` through DeepSpeed's Ulysses attention on
an SP group from ``make_process_groups``; loss parts over the global token count; per-rank
gradients summed over the SP group), once without and once with activation checkpointing.
Rank 0 writes the differences. The row length is odd, so the last shard carries padding.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ulorl.config import TrainConfig
from ulorl.rollout.types import Sample, SegmentSpan
from ulorl.train.batch import build_train_batch
from ulorl.train.distributed import parallel_layout, sp_micro_batches
from ulorl.train.forward import IGNORE, response_labels
from ulorl.train.sequence_parallel import (
    SequenceParallelUnavailable,
    check_sequence_parallel,
    check_sp_loss_agg,
    shard_row,
)

ROOT = Path(__file__).resolve().parents[1]
PROMPT, ROW = 37, 513   # tokens in the prompt, in the whole row
TOL = 1e-5


def long_row(vocab: int, seed: int = 0) -> Sample:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (ROW,), generator=g).tolist()
    return row(ids[:PROMPT], ids[PROMPT:])


def row(prompt: list[int], response: list[int]) -> Sample:
    return Sample(sample_id=0, group_id=0, prompt_ids=prompt, response_ids=response, reward=1.0,
                  segments=[SegmentSpan(0, len(response), 0)])


# ----------------------------------------------------------------------------- pure parts


def test_layout_blocks_sp_groups_and_strides_dp_groups():
    lay = parallel_layout(8, 2)
    assert lay.dp == 4
    assert lay.sp_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert lay.dp_groups() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert [lay.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [lay.sp_rank(r) for r in range(8)] == [0, 1, 0, 1, 0, 1, 0, 1]
    with pytest.raises(ValueError, match="train.sequence_parallel=3 does not divide the 8"):
        parallel_layout(8, 3)


def test_degree_check_names_the_key():
    check_sequence_parallel(TrainConfig())
    check_sequence_parallel(TrainConfig(sequence_parallel=2, backend="deepspeed"), world_size=4)
    with pytest.raises(SequenceParallelUnavailable, match="train.sequence_parallel=2 needs train.backend=deepspeed"):
        check_sequence_parallel(TrainConfig(sequence_parallel=2))
    with pytest.raises(SequenceParallelUnavailable, match="train.sequence_parallel=4 does not divide the 6"):
        check_sequence_parallel(TrainConfig(sequence_parallel=4, backend="deepspeed"), world_size=6)
    with pytest.raises(SequenceParallelUnavailable, match="loss_agg"):
        check_sp_loss_agg("seq_mean", 2)


def test_shards_carry_global_positions_and_the_next_shards_first_token_as_last_label():
    batch = build_train_batch([row([5, 6, 7], [8, 9, 10, 11])], 0)
    # row of 7 tokens -> padded to 8 -> shards of 4; targets (len 6) at positions 0..5
    s0, s1 = shard_row(batch, 0, 2), shard_row(batch, 1, 2)
    assert s0.position_ids.tolist() == [[0, 1, 2, 3]] and s1.position_ids.tolist() == [[4, 5, 6, 7]]
    assert s0.input_ids.tolist() == [[5, 6, 7, 8]] and s1.input_ids.tolist()[0][:3] == [9, 10, 11]
    # position t predicts token t+1; prompt targets (t < 2) are ignored
    assert s0.labels.tolist() == [[IGNORE, IGNORE, 8, 9]]          # last label = shard 1's first token
    assert s1.labels.tolist() == [[10, 11, IGNORE, IGNORE]]        # t = 6 has no target, t = 7 is padding
    assert (s0.lo, s0.n_targets, s1.lo, s1.n_targets) == (0, 4, 4, 2)
    joined = torch.cat([s0.labels[:, :s0.n_targets], s1.labels[:, :s1.n_targets]], 1)
    assert torch.equal(joined, response_labels(batch).long())


def test_sp_passes_share_long_rows_deal_short_ones_and_pad_the_world():
    # rows 0..3: lengths 10, 60, 12, 70 (cap 32): rows 1 and 3 are over the cap
    rows = [row([5] * 4, [6] * n) for n in (6, 56, 8, 66)]
    for i, s in enumerate(rows):
        s.group_id = i
    batch = build_train_batch(rows, 0)
    shards = [[0, 1, 2, 3]]                      # one data-parallel rank, SP = 2
    a = sp_micro_batches(batch, shards, 0, 0, 2, 32)
    b = sp_micro_batches(batch, shards, 0, 1, 2, 32)
    long_a = [(mb, w) for mb, w in a if w and len(mb) == 1 and mb[0] in (1, 3)]
    assert long_a == [([1], 1.0), ([3], 1.0)] and a[:2] == b[:2]   # both SP ranks, same order, first
    short = [mb for mb, w in a[2:] + b[2:] if w]
    assert sorted(r for mb in short for r in mb) == [0, 2]         # each short row trained once
    assert len(a) == len(b)
    # two dp ranks x SP 2: every rank of the world gets the same pass count, fillers weigh 0
    world = [sp_micro_batches(batch, [[0, 1], [2, 3]], d, s, 2, 32) for d in (0, 1) for s in (0, 1)]
    assert len({len(p) for p in world}) == 1
    assert world[0] == [([1], 1.0), ([0], 1.0)] and world[2] == [([3], 1.0), ([2], 1.0)]
    assert world[1] == [([1], 1.0), ([0], 0.0)] and world[3] == [([3], 1.0), ([0], 0.0)]  # filler: shortest row


# ----------------------------------------------------------------------------- the 2-rank run


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _script(argv: list[str]) -> None:
    import torch.distributed as td
    from ulorl.algo import policy_loss
    from ulorl.models.tiny import build_tiny_model
    from ulorl.models.tokenizer import build_tokenizer
    from ulorl.train.distributed import ensure_process_group, make_process_groups
    from ulorl.train.forward import token_stats
    from ulorl.train.sequence_parallel import sharded_token_stats

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    ensure_process_group("cpu")
    rank, world = td.get_rank(), td.get_world_size()
    groups = make_process_groups(parallel_layout(world, world), rank)
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=0).float()
    model.train()
    cpu = torch.device("cpu")
    batch = build_train_batch([long_row(model.config.vocab_size)], tok.pad_token_id)
    g = torch.Generator().manual_seed(1)
    old = (-torch.rand(batch.targets.shape, generator=g) * 6) * batch.response_mask
    loss_mask = (torch.rand(batch.targets.shape, generator=g) < 0.1) & batch.response_mask
    adv = torch.tensor([0.7])
    resp = batch.response_mask
    n_tokens = batch.num_response_tokens
    temp = 0.85

    def loss_of(lp: torch.Tensor, lo: int) -> torch.Tensor:
        w = lp.shape[1]
        loss, _ = policy_loss(lp, old[:, lo:lo + w], adv, resp[:, lo:lo + w], loss_mask=loss_mask[:, lo:lo + w],
                              eps_low=0.2, eps_high=0.28, num_tokens=n_tokens)
        return loss

    # SP = 1 reference: the whole row on this rank
    lp_ref, _ = token_stats(model, batch, temp, cpu, "chunked", with_entropy=False)
    with torch.no_grad():
        _, ent_ref = token_stats(model, batch, temp, cpu, "chunked")
    loss_ref = loss_of(lp_ref, 0)
    loss_ref.backward()
    g_ref = _grads(model)
    out: dict[str, object] = {"loss_ref": float(loss_ref)}

    for label, ckpt in (("plain", False), ("checkpointed", True)):
        if ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.zero_grad(set_to_none=True)
        lp, _, lo = sharded_token_stats(model, batch, temp, cpu, groups.sp_group, groups.sp_rank, world,
                                        with_entropy=False)
        loss = loss_of(lp, lo)
        loss.backward()
        with torch.no_grad():
            _lp_ng, ent, lo2 = sharded_token_stats(model, batch, temp, cpu, groups.sp_group, groups.sp_rank, world)
        assert lo2 == lo
        grads = _grads(model)
        for t in grads.values():
            td.all_reduce(t, group=groups.sp_group)
        total = loss.detach().clone()
        td.all_reduce(total, group=groups.sp_group)
        w = lp.shape[1]
        err_lp = torch.tensor([float((lp.detach() - lp_ref.detach()[:, lo:lo + w]).abs().max()),
                               float((ent - ent_ref[:, lo:lo + w]).abs().max())])
        td.all_reduce(err_lp, op=td.ReduceOp.MAX, group=groups.sp_group)
        assert grads.keys() == g_ref.keys()
        gmax = max(float(v.abs().max()) for v in g_ref.values())
        out[label] = {
            "loss_sp": float(total),
            "loss_abs_diff": abs(float(total) - float(loss_ref)),
            "lp_max_abs_diff": float(err_lp[0]),
            "entropy_max_abs_diff": float(err_lp[1]),
            "grad_max_abs_diff": max(float((grads[k] - g_ref[k]).abs().max()) for k in g_ref),
            "grad_max_abs": gmax,
            "targets_per_rank": w,
        }
    if rank == 0:
        (a.out / "result.json").write_text(json.dumps(out))
    td.barrier()
    td.destroy_process_group()


def test_sp2_over_two_gloo_ranks_equals_sp1(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "DS_ACCELERATOR": "cpu"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(Path(__file__).resolve()), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    res = json.loads((tmp_path / "result.json").read_text())
    for label in ("plain", "checkpointed"):
        r = res[label]
        assert r["targets_per_rank"] in (ROW // 2, ROW // 2 + 1)
        assert r["loss_abs_diff"] <= TOL, res
        assert r["lp_max_abs_diff"] <= TOL, res
        assert r["entropy_max_abs_diff"] <= TOL, res
        assert r["grad_max_abs_diff"] <= TOL * max(1.0, r["grad_max_abs"]), res
        assert r["grad_max_abs"] > 1e-4  # the gradients compared are not all zero


if __name__ == "__main__":
    _script(sys.argv[1:])
