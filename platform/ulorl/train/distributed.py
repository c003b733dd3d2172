"""Data-parallel plumbing for multi-process training (``torchrun``, the ``deepspeed`` launcher, Ray actors).

Design (one driver, N-1 workers):

* Rank 0 is the **driver**: it runs the whole ``Trainer`` (rollout engine, segment scheduler, reward
  scorer, MLflow, the trainer checkpoint files). Ranks >= 1 are **workers**: they hold a DeepSpeed
  replica (ZeRO shard) of the policy and execute the commands the driver broadcasts over a gloo
  control group (``torch.distributed.broadcast_object_list``)::

      ("update", samples)  policy_update on the same released samples; each rank trains on its
                           shard of whole groups (``shard_groups``), the Eq. 10 denominator is the
                           global response-token count of the mini-batch
      ("gather", None)     take part in a ZeRO-3 parameter gather (weights for the rollout engine)
      ("save", dir)        engine.save_checkpoint into dir/deepspeed (all ranks write their shards)
      ("load", dir)        engine.load_checkpoint from dir/deepspeed
      ("stop", None)       leave the loop

  Every collective after DeepSpeed's ``initialize`` is thus entered by all ranks in the same order.
* ZeRO-2/3 reduce gradients inside every backward pass (and ZeRO-3 gathers parameters inside every
  forward), so all ranks must run the same number of forward/backward passes:
  ``padded_micro_batches`` pads a rank's micro-batch list with weight-0 passes over one real row.
* The no-grad pass (current log-probs, entropies) is sharded the same way and all-reduced, so masks,
  advantages and the logged metrics are computed from the full batch on every rank (exactly what a
  single process computes, up to float summation order).

Nothing here imports deepspeed at module import time.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ulorl.train.batch import TrainBatch, micro_batches

if TYPE_CHECKING:
    from ulorl.config import ExperimentConfig
    from ulorl.train.trainer import Trainer, TrainResult

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


def launch_role(cfg: "ExperimentConfig") -> str:
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
    import torch.distributed as td

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


def row_costs(batch: TrainBatch) -> list[int]:
    return [p + r for p, r in zip(batch.prompt_lens, batch.response_lens)]


# ----------------------------------------------------------------------------- the context


class DataParallel:
    """One rank's view of a data-parallel run (``backend.data_parallel``; None in one process).

    ``ulorl.train.update.policy_update`` calls ``begin_update``, ``token_stats``, ``micro_batches``,
    ``all_finite`` and ``reduce_loss_metrics``; the DeepSpeed backend calls ``send`` before each
    collective it starts on the driver. All tensors exchanged here are CPU tensors on a gloo group,
    also when training runs on GPUs with nccl.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        import torch.distributed as td

        self.rank = rank
        self.world_size = world_size
        self.group = td.new_group(backend="gloo", timeout=control_timeout())

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    # ---- commands
    def send(self, name: str, payload: Any = None) -> None:
        """Driver only: tell the workers which collective comes next (no-op on workers)."""
        if not self.is_driver:
            return
        import torch.distributed as td

        td.broadcast_object_list([(name, payload)], src=0, group=self.group)

    def receive(self) -> tuple[str, Any]:
        """Worker: wait for the driver's next command."""
        import torch.distributed as td

        box: list[Any] = [None]
        td.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def barrier(self) -> None:
        import torch.distributed as td

        td.barrier(group=self.group)

    # ---- update hooks
    def begin_update(self, samples: list[Any]) -> None:
        """Driver: ship the released samples; workers already hold them (they called with them)."""
        self.send("update", samples)

    def shard(self, batch: TrainBatch) -> list[list[int]]:
        return shard_groups(batch.group_ids.tolist(), row_costs(batch), self.world_size)

    def micro_batches(self, batch: TrainBatch, token_budget: int) -> list[tuple[list[int], float]]:
        """(rows, weight) passes of this rank over ``batch`` (see ``padded_micro_batches``)."""
        return padded_micro_batches(batch, self.shard(batch), self.rank, token_budget)

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
        """Sharded ``current_token_stats``: (log-probs, entropy), each Float[B, L-1] on cpu, full batch."""
        import torch.distributed as td

        from ulorl.train.batch import scatter_rows
        from ulorl.train.update import current_token_stats

        lp = torch.zeros(batch.targets.shape, dtype=torch.float32)
        ent = torch.zeros(batch.targets.shape, dtype=torch.float32)
        for rows, weight in self.micro_batches(batch, token_budget):
            sub_lp, sub_ent = current_token_stats(model, batch.rows(rows), temperature, token_budget, device, bf16)
            if weight:
                scatter_rows(lp, rows, sub_lp)
                scatter_rows(ent, rows, sub_ent)
        both = torch.stack([lp, ent])
        td.all_reduce(both, op=td.ReduceOp.SUM, group=self.group)  # rows are disjoint across ranks
        return both[0], both[1]

    def all_finite(self, loss: torch.Tensor) -> bool:
        """True when the loss is finite on every rank (one rank refusing must stop all of them)."""
        import torch.distributed as td

        flag = torch.tensor([1.0 if bool(torch.isfinite(loss.detach()).all()) else 0.0])
        td.all_reduce(flag, op=td.ReduceOp.MIN, group=self.group)
        return bool(flag.item() == 1.0)

    def reduce_loss_metrics(self, pg_loss_total: float, acc: dict[str, float]) -> tuple[float, dict[str, float]]:
        """Sum the per-rank loss parts and token-weighted metrics; max / min of ratio extremes."""
        import math

        import torch.distributed as td

        sums = torch.tensor(
            [pg_loss_total, acc.get("clip_frac", 0.0), acc.get("ratio_mean", 0.0)], dtype=torch.float64
        )
        td.all_reduce(sums, op=td.ReduceOp.SUM, group=self.group)
        hi = torch.tensor([acc.get("ratio_max", -math.inf)], dtype=torch.float64)
        lo = torch.tensor([acc.get("ratio_min", math.inf)], dtype=torch.float64)
        td.all_reduce(hi, op=td.ReduceOp.MAX, group=self.group)
        td.all_reduce(lo, op=td.ReduceOp.MIN, group=self.group)
        out = {"clip_frac": float(sums[1]), "ratio_mean": float(sums[2])}
        if math.isfinite(float(hi)):
            out["ratio_max"] = float(hi)
        if math.isfinite(float(lo)):
            out["ratio_min"] = float(lo)
        return float(sums[0]), out


# ----------------------------------------------------------------------------- worker ranks


def worker_device(cfg: "ExperimentConfig") -> torch.device:
    """The device of this rank: ``cuda:LOCAL_RANK`` when the rollout device is CUDA, else cpu."""
    if torch.device(cfg.rollout.device).type == "cuda":
        dev = torch.device("cuda", dist_env().local_rank)
        torch.cuda.set_device(dev)
        return dev
    return torch.device("cpu")


def worker_loop(backend: Any, cfg: "ExperimentConfig", pad_token_id: int, device: torch.device) -> dict[str, Any]:
    """Rank >= 1: execute rank 0's commands on ``backend`` until ``stop``.

    Returns the ``stop`` payload (rank 0's ``backend.close(**info)``) plus ``updates`` done here.
    """
    from ulorl.train.update import policy_update

    dp = backend.data_parallel
    if dp is None or dp.is_driver:
        raise RuntimeError("worker_loop runs on ranks >= 1 of a multi-process run")
    updates = 0
    while True:
        name, payload = dp.receive()
        if name == "update":
            res = policy_update(payload, backend, cfg.algo, cfg.train, cfg.rollout.temperature, pad_token_id, device)
            updates += int(res.updated)
        elif name == "gather":
            backend.state_dict_for_rollout()
        elif name == "save":
            backend.save(Path(payload))
        elif name == "load":
            backend.load(Path(payload))
        elif name == "stop":
            return {**(payload or {}), "updates": updates}
        else:
            raise RuntimeError(f"rank {dp.rank}: unknown command {name!r} from rank 0")


def run_worker(trainer: "Trainer") -> "TrainResult":
    """Rank >= 1 of a ``Trainer`` run: build the DeepSpeed replica, then ``worker_loop``.

    SIGINT / SIGTERM are left to rank 0 (it finishes the step, checkpoints with the workers' help,
    then sends ``stop``), so a launcher that signals every rank still gets a clean checkpoint.
    """
    from ulorl.models.loading import load_policy
    from ulorl.train.deepspeed_backend import DeepSpeedBackend
    from ulorl.train.trainer import TrainResult, seed_everything

    cfg = trainer.cfg
    torch.set_num_threads(cfg.train.threads or max(1, len(os.sched_getaffinity(0))))
    seed_everything(cfg.train.seed)
    device = worker_device(cfg)
    model, tokenizer = load_policy(
        cfg.model.name_or_path, dtype=cfg.model.dtype, device=str(device), rope_scaling=cfg.model.rope_scaling,
        trust_remote_code=cfg.model.trust_remote_code,
    )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    backend = DeepSpeedBackend(model, cfg.train)
    rank = backend.rank
    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            old[sig] = signal.signal(sig, lambda s, f: log.warning("rank %d: signal %s left to rank 0", rank, s))
        except ValueError:  # not the main thread (e.g. a Ray actor thread)
            pass
    try:
        info = worker_loop(backend, cfg, pad_id, device)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    log.info("rank %d: stopped after %d updates", rank, info["updates"])
    return TrainResult(
        run_id=info.get("run_id"), run_dir=Path(info.get("run_dir", trainer.run_dir)),
        steps=int(info.get("steps", info["updates"])), interrupted=bool(info.get("interrupted", False)),
        tracking_uri=trainer.tracking_uri,
    )
