"""Set-up shared by every launch path, and the worker-rank entry point of a multi-process run.

    model, tokenizer = load_model(cfg, device)       # honours model.dtype / rope_scaling / trust_remote_code
    model, tokenizer = load_train_model(cfg, device) # the trained policy: ZeRO-3 partitioned at load
    outcome = run_worker_rank(cfg, run_dir)         # ranks >= 1: follow rank 0 until it says stop

Every path that builds the policy from an experiment (the single-process ``Trainer``, worker ranks,
Ray engine actors) calls ``load_model``, so an option of ``cfg.model`` is honoured everywhere.

Layering (no cycles): ``distributed`` (communication) < ``deepspeed_backend`` < ``worker`` <
``trainer``. Rank 0 runs the ``Trainer``; ranks >= 1 run ``run_worker_rank`` and never build one.
"""

from __future__ import annotations

import logging
import os
import random
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from ulorl.config import ExperimentConfig
from ulorl.models.loading import load_policy
from ulorl.train.deepspeed_backend import DeepSpeedBackend, deepspeed_config, zero3_load
from ulorl.train.distributed import dist_env, ensure_process_group
from ulorl.train.update import policy_update

log = logging.getLogger("ulorl.train.worker")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_threads(cfg: ExperimentConfig) -> int:
    """torch threads: ``train.threads`` or the cores this process may use; returns the count."""
    threads = cfg.train.threads or max(1, len(os.sched_getaffinity(0)))
    torch.set_num_threads(threads)
    return threads


def load_model(
    cfg: ExperimentConfig, device: str | torch.device, name_or_path: Optional[str] = None, rope_scaling: bool = True
) -> tuple[Any, Any]:
    """(model, tokenizer) of ``cfg.model`` on ``device``; ``name_or_path`` loads another model (a judge)
    with the same dtype and ``trust_remote_code``, ``rope_scaling=False`` leaves its context as built."""
    m = cfg.model
    return load_policy(
        name_or_path or m.name_or_path, dtype=m.dtype, device=str(device),
        rope_scaling=m.rope_scaling if rope_scaling else None, trust_remote_code=m.trust_remote_code,
        attn_implementation=m.attn_implementation, gradient_checkpointing=cfg.train.gradient_checkpointing,
    )


def is_zero3(cfg: ExperimentConfig) -> bool:
    return cfg.train.backend == "deepspeed" and cfg.train.deepspeed.zero_stage == 3


def load_train_model(cfg: ExperimentConfig, device: str | torch.device) -> tuple[Any, Any]:
    """(model, tokenizer) of the policy the trainer trains (every rank calls it).

    Under ZeRO-3 (``train.backend=deepspeed``, ``zero_stage: 3``) the model is created partitioned:
    each rank allocates only its share of every parameter while the weights load (transformers'
    ``deepspeed.zero.Init`` path, rank 0 reading the checkpoint), instead of every rank loading the
    whole model and ``deepspeed.initialize`` partitioning it afterwards. Other backends: ``load_model``.
    """
    if not is_zero3(cfg):
        return load_model(cfg, device)
    ensure_process_group(torch.device(device).type)   # zero.Init partitions over the process group
    with zero3_load(deepspeed_config(cfg.train)):
        return load_model(cfg, device)


def rollout_copy_needed(cfg: ExperimentConfig) -> bool:
    """Whether rank 0 keeps a full unpartitioned policy copy under ZeRO-3: yes for the in-process
    hf engine and for SAIS log-probs (both run the policy on rank 0 alone); no when vLLM engines
    (their own processes, loading the model directory themselves) are the only users of the weights."""
    return not (cfg.rollout.engine == "vllm" and cfg.algo.is_mode != "sais")


def pad_token_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def worker_device(cfg: ExperimentConfig) -> torch.device:
    """The device of this rank: ``cuda:LOCAL_RANK`` when the rollout device is CUDA, else cpu."""
    if torch.device(cfg.rollout.device).type == "cuda":
        dev = torch.device("cuda", dist_env().local_rank)
        torch.cuda.set_device(dev)
        return dev
    return torch.device("cpu")


def worker_loop(backend: Any, cfg: ExperimentConfig, pad_id: int, device: torch.device) -> dict[str, Any]:
    """Rank >= 1: execute rank 0's commands on ``backend`` until ``stop``.

    Returns the ``stop`` payload (rank 0's ``backend.close(**info)``) plus ``updates`` done here.
    ``update`` carries no payload: the samples follow as packed token tensors (``DataParallel.receive_samples``).
    """
    dp = backend.data_parallel
    if dp is None or dp.is_driver:
        raise RuntimeError("worker_loop runs on ranks >= 1 of a multi-process run")
    updates = 0
    while True:
        name, payload = dp.receive()
        if name == "update":
            samples = dp.receive_samples()
            res = policy_update(samples, backend, cfg.algo, cfg.train, cfg.rollout.temperature, pad_id, device)
            updates += int(res.updated)
        elif name == "gather":
            backend.state_dict_for_rollout()
        elif name == "save":
            backend.save(Path(payload))
        elif name == "save_model":
            backend.save_model(Path(payload))
        elif name == "load":
            backend.load(Path(payload))
        elif name == "stop":
            return {**(payload or {}), "updates": updates}
        else:
            raise RuntimeError(f"rank {dp.rank}: unknown command {name!r} from rank 0")


@dataclass(frozen=True)
class WorkerOutcome:
    """What a worker rank reports when rank 0 released it (rank 0's run id, steps, ...)."""

    run_id: Optional[str]
    run_dir: Path
    steps: int
    interrupted: bool


def run_worker_rank(cfg: ExperimentConfig, run_dir: Path) -> WorkerOutcome:
    """Rank >= 1 of a run: build the DeepSpeed replica, then ``worker_loop``.

    SIGINT / SIGTERM are left to rank 0 (it finishes the step, checkpoints with the workers' help,
    then sends ``stop``), so a launcher that signals every rank still gets a clean checkpoint.
    """
    set_threads(cfg)
    seed_everything(cfg.train.seed)
    device = worker_device(cfg)
    model, tokenizer = load_train_model(cfg, device)
    backend = DeepSpeedBackend(model, cfg.train, rollout_copy=rollout_copy_needed(cfg))
    rank = backend.rank
    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            old[sig] = signal.signal(sig, lambda s, f: log.warning("rank %d: signal %s left to rank 0", rank, s))
        except ValueError:  # not the main thread (e.g. a Ray actor thread)
            pass
    try:
        info = worker_loop(backend, cfg, pad_token_id(tokenizer), device)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    log.info("rank %d: stopped after %d updates", rank, info["updates"])
    return WorkerOutcome(
        run_id=info.get("run_id"), run_dir=Path(info.get("run_dir", run_dir)),
        steps=int(info.get("steps", info["updates"])), interrupted=bool(info.get("interrupted", False)),
    )
