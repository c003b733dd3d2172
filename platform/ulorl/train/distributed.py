"""Data-parallel plumbing for multi-process training (``torchrun``, the ``deepspeed`` launcher, Ray actors).

Design (one driver, N-1 workers):

* Rank 0 is the **driver**: it runs the whole ``Trainer`` (rollout engine, segment scheduler, reward
  scorer, MLflow, the trainer checkpoint files). Ranks >= 1 are **workers**: they hold a DeepSpeed
  replica (ZeRO shard) of the policy and execute the commands the driver broadcasts over a gloo
  control group (``torch.distributed.broadcast_object_list``)::

      ("update", None)     policy_update on the released samples, which follow once as packed
                           token tensors (``ulorl.train.transport``, not a pickled list); each rank
                           trains on its shard of whole groups (``shard_groups``), the Eq. 10
                           denominator is the global response-token count of the mini-batch
      ("gather", None)     take part in a ZeRO-3 parameter gather (weights for the rollout engine)
      ("save", dir)        engine.save_checkpoint into dir/deepspeed (all ranks write their shards)
      ("load", dir)        engine.load_checkpoint from dir/deepspeed
      ("stop", None)       leave the loop

  Every collective after DeepSpeed's ``initialize`` is thus entered by all ranks in the same order.
* ZeRO-2/3 reduce gradients inside every backward pass (and ZeRO-3 gathers parameters inside every
  forward), so all ranks must run the same number of forward/backward passes:
  ``padded_micro_batches`` pads a rank's micro-batch list with weight-0 passes over one real row.
* The no-grad pass (current log-probs, entropies) is sharded the same way and all-reduced over the
  response positions only (Float32[2, response tokens], not the padded [2, B, L-1]), so masks,
  advantages and the logged metrics are computed from the full batch on every rank (exactly what a
  single process computes, up to float summation order).
* Sequence parallelism (``train.sequence_parallel`` = sp > 1): the world is dp x sp ranks
  (``ParallelLayout``: SP groups are blocks of sp consecutive ranks). Groups are sharded over the dp
  data-parallel ranks; the sp ranks of one SP group share those rows: a row over
  ``train.micro_batch_tokens`` is trained by all of them at once, split along the sequence
  (``ulorl.train.sequence_parallel``), shorter micro-batches are dealt round robin among them
  (``sp_micro_batches``). Gradients still sum over every rank (each rank's loss is its part of Eq. 10).
* ``traffic`` counts the bytes each kind of control message put on the wire from this rank.

The worker-rank entry point lives in ``ulorl.train.worker``; this module imports nothing above the
math it shards (``ulorl.train.forward.current_token_stats``). deepspeed is imported only when a
process group is made.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as td

from ulorl.config import ExperimentConfig
from ulorl.rollout.types import Sample
from ulorl.train.batch import TrainBatch, micro_batches, scatter_rows
from ulorl.train.forward import autocast_ctx, current_token_stats
from ulorl.train.sequence_parallel import sharded_token_stats
from ulorl.train.transport import empty_packed, pack_samples, unpack_samples

log = logging.getLogger("ulorl.train.distributed")

# How long a worker waits for the driver's next command (a whole rollout at paper scale can take
# hours). Override with ULORL_DIST_TIMEOUT_S.
DEFAULT_CONTROL_TIMEOUT_S = 24 * 3600


@dataclass(frozen=True)
class DistEnv:
    """What the launcher put in the environment (torchrun / deepspeed / Ray actors)."""

    rank: int
    world_size: int
    local_rank: int


def dist_env() -> DistEnv:
    """Rank, world size and local rank from ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` (defaults 0, 1, 0)."""

    def _int(name: str, default: int) -> int:
        raw = os.environ.get(name, "")
        try:
            return int(raw) if raw != "" else default
        except ValueError:
            raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None

    return DistEnv(_int("RANK", 0), _int("WORLD_SIZE", 1), _int("LOCAL_RANK", 0))


def launch_role(cfg: ExperimentConfig) -> str:
    """``"single"``, ``"driver"`` (rank 0 of several) or ``"worker"`` (rank >= 1).

    Raises ``ValueError`` when several processes were launched for a backend that cannot use them.
    """
    env = dist_env()
    if env.world_size <= 1:
        return "single"
    if cfg.train.backend != "deepspeed":
        raise ValueError(
            f"{env.world_size} processes were launched (WORLD_SIZE={env.world_size}) but train.backend="
            f"{cfg.train.backend!r} trains in one process; set train.backend=deepspeed"
        )
    return "driver" if env.rank == 0 else "worker"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def control_timeout() -> timedelta:
    return timedelta(seconds=float(os.environ.get("ULORL_DIST_TIMEOUT_S", DEFAULT_CONTROL_TIMEOUT_S)))


def ensure_process_group(device_type: str) -> None:
    """Initialise torch.distributed through DeepSpeed once: gloo on CPU, nccl on CUDA.

    A single process without launcher variables gets RANK=0, WORLD_SIZE=1 and a free local port.
    """
    if td.is_available() and td.is_initialized():
        return
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("LOCAL_RANK", "0")
    if device_type != "cuda":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # what DeepSpeed detects anyway, minus a warning per rank
    import deepspeed
    import deepspeed.ops

    if device_type != "cuda":
        # DeepSpeed's CPU backend compiles a shared-memory extension (37 s to minutes on first use)
        # that only serves inference_all_reduce; training collectives go through torch.distributed.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="nccl" if device_type == "cuda" else "gloo")



def shutdown_process_group() -> None:
    """Destroy the default process group (and the groups made from it) when a rank ends normally.

    Without it a rank can die with SIGABRT ("terminate called without an active exception") after
    its work is done: gloo's worker threads still hold finished work while the interpreter tears
    down (PyTorch documents destroy_process_group at the end of every rank's main). Success path
    only: a rank that stops on an error while others wait in a collective could block here. A group
    made by ``ensure_process_group`` goes through DeepSpeed's own teardown, which also drops the
    group references DeepSpeed cached.
    """
    if not (td.is_available() and td.is_initialized()):
        return
    if deepspeed_made_group():
        from deepspeed import comm as ds_comm

        ds_comm.destroy_process_group()
    else:
        td.destroy_process_group()


def deepspeed_made_group() -> bool:
    """DeepSpeed's communication backend holds the live process group (``init_distributed`` ran).

    The backend lives in ``deepspeed.comm.comm.cdb``: ``deepspeed.comm`` re-exports that module's
    names with ``from .comm import *``, which copied ``cdb = None`` at import, so
    ``deepspeed.comm.cdb`` stays None whatever happens later. deepspeed is looked up only if
    something imported it already.
    """
    impl = sys.modules.get("deepspeed.comm.comm")
    cdb = getattr(impl, "cdb", None)
    return cdb is not None and bool(cdb.is_initialized())


# ----------------------------------------------------------------------------- process-group layout (pure)


@dataclass(frozen=True)
class ParallelLayout:
    """world = dp x sp ranks: sequence-parallel groups are blocks of ``sp`` consecutive ranks.

    Rank r sits in sequence-parallel group ``r // sp`` (the data-parallel rank: every member of one
    SP group holds shards of the same rows) at SP rank ``r % sp``; the data-parallel group of r is
    the ranks with the same SP rank. Consecutive blocks keep the SP all-to-alls inside one node
    whenever ``sp`` divides the GPUs per node (DeepSpeed's ``parallel_state_sp`` uses the same blocks).
    """

    world_size: int
    sp: int

    @property
    def dp(self) -> int:
        return self.world_size // self.sp

    def dp_rank(self, rank: int) -> int:
        return rank // self.sp

    def sp_rank(self, rank: int) -> int:
        return rank % self.sp

    def sp_groups(self) -> list[list[int]]:
        return [list(range(i * self.sp, (i + 1) * self.sp)) for i in range(self.dp)]

    def dp_groups(self) -> list[list[int]]:
        return [list(range(j, self.world_size, self.sp)) for j in range(self.sp)]


def parallel_layout(world_size: int, sequence_parallel: int) -> ParallelLayout:
    """The dp x sp layout; ``ValueError`` naming ``train.sequence_parallel`` when it does not divide the world."""
    if sequence_parallel < 1:
        raise ValueError(f"train.sequence_parallel must be >= 1, got {sequence_parallel}")
    if world_size < 1 or world_size % sequence_parallel:
        raise ValueError(
            f"train.sequence_parallel={sequence_parallel} does not divide the {world_size} trainer processes "
            "(WORLD_SIZE): the world is data-parallel x sequence-parallel ranks"
        )
    return ParallelLayout(world_size, sequence_parallel)


@dataclass(frozen=True)
class ProcessGroups:
    """This rank's groups of a ``ParallelLayout`` (``None`` groups for a degree of 1)."""

    layout: ParallelLayout
    rank: int
    sp_group: Any
    dp_group: Any

    @property
    def sp_rank(self) -> int:
        return self.layout.sp_rank(self.rank)

    @property
    def dp_rank(self) -> int:
        return self.layout.dp_rank(self.rank)


def make_process_groups(layout: ParallelLayout, rank: int, backend: str | None = None) -> ProcessGroups:
    """Create every SP and DP group (all ranks must call this, in the same order) and keep this rank's.

    ``backend``: None = the default process group's (gloo on CPU, nccl on CUDA).
    """
    sp_group = dp_group = None
    if layout.sp > 1:
        for ranks in layout.sp_groups():
            g = td.new_group(ranks, backend=backend)
            if rank in ranks:
                sp_group = g
        for ranks in layout.dp_groups():
            g = td.new_group(ranks, backend=backend)
            if rank in ranks:
                dp_group = g
    return ProcessGroups(layout, rank, sp_group, dp_group)


# ----------------------------------------------------------------------------- sharding (pure)


def shard_groups(group_ids: list[int], row_costs: list[int], world_size: int) -> list[list[int]]:
    """Assign whole groups to ranks, balancing cost; returns the sorted row indices of each rank.

    Groups are taken in order of decreasing total cost (ties: first appearance) and each goes to the
    rank with the smallest load so far (ties: lowest rank) — the LPT heuristic, deterministic on
    every rank. ``row_costs[i]`` is the forward cost of row i (its sequence length).
    """
    if len(group_ids) != len(row_costs):
        raise ValueError(f"{len(group_ids)} group ids but {len(row_costs)} row costs")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    rows_of: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        rows_of.setdefault(int(g), []).append(i)
    groups = list(rows_of.values())
    costs = [sum(row_costs[i] for i in rows) for rows in groups]
    order = sorted(range(len(groups)), key=lambda k: (-costs[k], k))
    load = [0] * world_size
    out: list[list[int]] = [[] for _ in range(world_size)]
    for k in order:
        r = min(range(world_size), key=lambda j: (load[j], j))
        load[r] += costs[k]
        out[r].extend(groups[k])
    return [sorted(rows) for rows in out]


def padded_micro_batches(
    batch: TrainBatch, rows_per_rank: list[list[int]], rank: int, token_budget: int
) -> list[tuple[list[int], float]]:
    """This rank's micro-batches (row indices into ``batch``, weight 1.0), padded with weight-0
    passes over the batch's shortest row until every rank has the same number of passes."""
    lengths = [p + r for p, r in zip(batch.prompt_lens, batch.response_lens)]
    plans: list[list[list[int]]] = []
    for rows in rows_per_rank:
        if not rows:
            plans.append([])
            continue
        sub = batch.rows(rows)
        plans.append([[rows[i] for i in mb] for mb in micro_batches(sub, token_budget)])
    n = max(1, max(len(p) for p in plans))
    filler = [min(range(len(lengths)), key=lambda i: (lengths[i], i))]
    mine = [(mb, 1.0) for mb in plans[rank]]
    return mine + [(filler, 0.0)] * (n - len(mine))


def sp_micro_batches(
    batch: TrainBatch, rows_per_dp_rank: list[list[int]], dp_rank: int, sp_rank: int, sp: int, token_budget: int
) -> list[tuple[list[int], float]]:
    """``padded_micro_batches`` for a dp x sp world: the passes of rank (``dp_rank``, ``sp_rank``).

    The rows of a data-parallel shard are shared by its ``sp`` ranks: every row over ``token_budget``
    is one pass that all of them take together, sequence-sharded (first, in the same order on every
    member, so the Ulysses all-to-alls line up); the micro-batches under the cap are dealt round
    robin over the members (each trained whole by one of them). Weight-0 passes over the batch's
    shortest row (never sequence-sharded) pad every rank of the world to the same pass count.
    """
    lengths = row_costs(batch)
    counts: list[int] = []
    mine: list[list[int]] = []
    for d, rows in enumerate(rows_per_dp_rank):
        mbs = [[rows[i] for i in mb] for mb in micro_batches(batch.rows(rows), token_budget)] if rows else []
        long = [mb for mb in mbs if len(mb) == 1 and lengths[mb[0]] > token_budget]
        short = [mb for mb in mbs if not (len(mb) == 1 and lengths[mb[0]] > token_budget)]
        for s in range(sp):
            passes = long + short[s::sp]
            counts.append(len(passes))
            if (d, s) == (dp_rank, sp_rank):
                mine = passes
    n = max(1, max(counts))
    filler = [min(range(len(lengths)), key=lambda i: (lengths[i], i))]
    return [(mb, 1.0) for mb in mine] + [(filler, 0.0)] * (n - len(mine))


def row_costs(batch: TrainBatch) -> list[int]:
    return [p + r for p, r in zip(batch.prompt_lens, batch.response_lens)]


# ----------------------------------------------------------------------------- the context


class DataParallel:
    """One rank's view of a data-parallel run (``backend.data_parallel``; None in one process).

    ``ulorl.train.update.policy_update`` calls ``begin_update``, ``token_stats``, ``micro_batches``,
    ``all_finite`` and ``reduce_loss_metrics``; the DeepSpeed backend calls ``send`` before each
    collective it starts on the driver. All tensors exchanged here are CPU tensors on a gloo group,
    also when training runs on GPUs with nccl.

    ``traffic``: bytes this rank put into each kind of control collective (``command``, ``samples``,
    ``stats``, ``scalars``); on a broadcast that is the payload once, on an all-reduce this rank's
    input tensor.
    """

    def __init__(self, rank: int, world_size: int, sequence_parallel: int = 1) -> None:
        self.rank = rank
        self.world_size = world_size
        self.layout = parallel_layout(world_size, sequence_parallel)
        self.group = td.new_group(backend="gloo", timeout=control_timeout())
        # SP groups on the training backend (nccl on CUDA: the Ulysses all-to-alls move activations)
        self.groups = make_process_groups(self.layout, rank)
        self.traffic: dict[str, int] = {"command": 0, "samples": 0, "stats": 0, "scalars": 0}

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def _count(self, kind: str, *tensors: torch.Tensor) -> None:
        self.traffic[kind] += sum(t.numel() * t.element_size() for t in tensors)

    # ---- commands
    def send(self, name: str, payload: Any = None) -> None:
        """Driver only: tell the workers which collective comes next (no-op on workers)."""
        if not self.is_driver:
            return
        self.traffic["command"] += len(pickle.dumps((name, payload)))
        td.broadcast_object_list([(name, payload)], src=0, group=self.group)

    def receive(self) -> tuple[str, Any]:
        """Worker: wait for the driver's next command."""
        box: list[Any] = [None]
        td.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def barrier(self) -> None:
        td.barrier(group=self.group)

    # ---- samples
    def send_samples(self, samples: list[Sample]) -> None:
        """Driver: broadcast the samples once as packed tensors (``ulorl.train.transport``)."""
        packed = pack_samples(samples)
        sizes = packed.sizes()
        td.broadcast(sizes, src=0, group=self.group)
        for t in packed.tensors():
            if t.numel():
                td.broadcast(t, src=0, group=self.group)
        self._count("samples", sizes, *packed.tensors())

    def receive_samples(self) -> list[Sample]:
        """Worker: the samples of ``send_samples`` (the fields ``policy_update`` reads)."""
        sizes = torch.empty(4, dtype=torch.int64)
        td.broadcast(sizes, src=0, group=self.group)
        packed = empty_packed(sizes)
        for t in packed.tensors():
            if t.numel():
                td.broadcast(t, src=0, group=self.group)
        return unpack_samples(packed)

    # ---- update hooks
    def begin_update(self, samples: list[Sample]) -> None:
        """Driver: announce the update and ship the released samples; workers already hold them."""
        if not self.is_driver:
            return
        self.send("update")
        self.send_samples(samples)

    @property
    def sp(self) -> int:
        return self.layout.sp

    def shard(self, batch: TrainBatch) -> list[list[int]]:
        """Rows of each data-parallel rank (whole groups; the ranks of one SP group share them)."""
        return shard_groups(batch.group_ids.tolist(), row_costs(batch), self.layout.dp)

    def micro_batches(self, batch: TrainBatch, token_budget: int) -> list[tuple[list[int], float]]:
        """(rows, weight) passes of this rank over ``batch`` (``padded_micro_batches``; with SP,
        ``sp_micro_batches``: rows over the cap are passes of the whole SP group, see ``sharded``)."""
        if self.sp == 1:
            return padded_micro_batches(batch, self.shard(batch), self.rank, token_budget)
        return sp_micro_batches(batch, self.shard(batch), self.groups.dp_rank, self.groups.sp_rank, self.sp,
                                token_budget)

    def sharded(self, sub: TrainBatch, weight: float, token_budget: int) -> bool:
        """True when the pass over ``sub`` is sequence-sharded over this rank's SP group."""
        return self.sp > 1 and weight != 0.0 and sub.input_ids.shape[0] == 1 and row_costs(sub)[0] > token_budget

    def sharded_stats(
        self, model: torch.nn.Module, sub: TrainBatch, temperature: float, device: torch.device,
        chunk_tokens: int | None = None, with_entropy: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """This rank's shard of the one row of ``sub``: (log-probs, entropy) Float[1, n] at target positions
        ``lo .. lo + n - 1``, and ``lo`` (``ulorl.train.sequence_parallel.sharded_token_stats``)."""
        return sharded_token_stats(model, sub, temperature, device, self.groups.sp_group, self.groups.sp_rank,
                                   self.sp, chunk_tokens=chunk_tokens, with_entropy=with_entropy)

    @torch.no_grad()
    def token_stats(
        self,
        model: torch.nn.Module,
        batch: TrainBatch,
        temperature: float,
        token_budget: int,
        device: torch.device,
        bf16: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sharded ``current_token_stats``: (log-probs, entropy), each Float[B, L-1] on cpu, full batch.

        Only response positions carry values (``current_token_stats`` zeroes the rest), so only they
        are all-reduced: Float32[2, batch.num_response_tokens] (rows, and under SP positions, are disjoint
        across ranks).
        """
        lp = torch.zeros(batch.targets.shape, dtype=torch.float32)
        ent = torch.zeros(batch.targets.shape, dtype=torch.float32)
        for rows, weight in self.micro_batches(batch, token_budget):
            sub = batch.rows(rows)
            if self.sharded(sub, weight, token_budget):  # this rank's positions of the row only
                with autocast_ctx(bf16, device):
                    part_lp, part_ent, lo = self.sharded_stats(model, sub, temperature, device)
                n = part_lp.shape[1]
                lp[rows[0], lo:lo + n] = part_lp[0].float().cpu()
                ent[rows[0], lo:lo + n] = part_ent[0].float().cpu()
                continue
            sub_lp, sub_ent = current_token_stats(model, sub, temperature, token_budget, device, bf16)
            if weight:
                scatter_rows(lp, rows, sub_lp)
                scatter_rows(ent, rows, sub_ent)
        resp = batch.response_mask
        both = torch.stack([lp[resp], ent[resp]])
        self._count("stats", both)
        td.all_reduce(both, op=td.ReduceOp.SUM, group=self.group)  # rows are disjoint across ranks
        lp_full = torch.zeros_like(lp)
        ent_full = torch.zeros_like(ent)
        lp_full[resp] = both[0]
        ent_full[resp] = both[1]
        return lp_full, ent_full

    def all_finite(self, loss: torch.Tensor) -> bool:
        """True when the loss is finite on every rank (one rank refusing must stop all of them)."""
        flag = torch.tensor([1.0 if bool(torch.isfinite(loss.detach()).all()) else 0.0])
        self._count("scalars", flag)
        td.all_reduce(flag, op=td.ReduceOp.MIN, group=self.group)
        return bool(flag.item() == 1.0)

    def reduce_loss_metrics(self, pg_loss_total: float, acc: dict[str, float]) -> tuple[float, dict[str, float]]:
        """Sum the per-rank loss parts and token-weighted metrics; max / min of ratio extremes."""
        sums = torch.tensor(
            [pg_loss_total, acc.get("clip_frac", 0.0), acc.get("ratio_mean", 0.0)], dtype=torch.float64
        )
        td.all_reduce(sums, op=td.ReduceOp.SUM, group=self.group)
        hi = torch.tensor([acc.get("ratio_max", -math.inf)], dtype=torch.float64)
        lo = torch.tensor([acc.get("ratio_min", math.inf)], dtype=torch.float64)
        td.all_reduce(hi, op=td.ReduceOp.MAX, group=self.group)
        td.all_reduce(lo, op=td.ReduceOp.MIN, group=self.group)
        self._count("scalars", sums, hi, lo)
        out = {"clip_frac": float(sums[1]), "ratio_mean": float(sums[2])}
        if math.isfinite(float(hi)):
            out["ratio_max"] = float(hi)
        if math.isfinite(float(lo)):
            out["ratio_min"] = float(lo)
        return float(sums[0]), out
