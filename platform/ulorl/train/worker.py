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
from ulorl.models.loading import _apply_rope_scaling, load_policy, load_tokenizer, resolve_model_path
from ulorl.rollout.engines.vllm import PolicySpec
from ulorl.rollout.weight_sync import bucket_bytes_from_mb
from ulorl.train.deepspeed_backend import (
    DeepSpeedBackend,
    checkpoint_meta_state_dict,
    deepspeed_config,
    full_nbytes,
    zero3_load,
)
from ulorl.train.distributed import dist_env, ensure_process_group
from ulorl.train.update import UpdateContext, policy_update

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


def engine_policy(cfg: ExperimentConfig) -> tuple[Any, Any]:
    """(policy, tokenizer) for a rollout engine built outside the trainer (a Ray engine actor).

    ``rollout.engine=vllm``: a weightless ``PolicySpec`` (the config with the trainer's rope scaling,
    the generation config, the dtype): vLLM loads the checkpoint itself, on its own device, and a
    copy of the HF weights in the actor would take the memory vLLM needs to start. ``hf``: the
    whole model on ``rollout.device`` (the HF engine runs it).
    """
    if cfg.rollout.engine != "vllm":
        return load_model(cfg, cfg.rollout.device)
    from transformers import AutoConfig, GenerationConfig

    m = cfg.model
    path = resolve_model_path(m.name_or_path)
    config = AutoConfig.from_pretrained(path, trust_remote_code=m.trust_remote_code)
    if m.rope_scaling:
        _apply_rope_scaling(config, m.rope_scaling)
    try:
        generation = GenerationConfig.from_pretrained(path)
    except OSError:   # no generation_config.json: the config's own end ids
        generation = GenerationConfig.from_model_config(config)
    tok = load_tokenizer(m.name_or_path, trust_remote_code=m.trust_remote_code)
    return PolicySpec(config=config, generation_config=generation, dtype=m.dtype), tok


def is_zero3(cfg: ExperimentConfig) -> bool:
    return cfg.train.backend == "deepspeed" and cfg.train.deepspeed.zero_stage == 3


def load_train_model(cfg: ExperimentConfig, device: str | torch.device) -> tuple[Any, Any]:
    """(model, tokenizer) of the policy the trainer trains (every rank calls it).

    Under ZeRO-3 (``train.backend=deepspeed``, ``zero_stage: 3``) the model is created partitioned:
    each rank allocates only its share of every parameter while the weights load (transformers'
    ``deepspeed.zero.Init`` path), instead of every rank loading the whole model and
    ``deepspeed.initialize`` partitioning it afterwards. Only rank 0 reads the checkpoint: ranks > 0
    load from its meta state dict (``checkpoint_meta_state_dict``; transformers < 5.20 would otherwise
    read it whole, and fuse MoE experts, on every rank). Other backends: ``load_model``.
    """
    if not is_zero3(cfg):
        return load_model(cfg, device)
    ensure_process_group(torch.device(device).type)   # zero.Init partitions over the process group
    meta = None
    if dist_env().rank > 0:   # one reader per run: ranks > 0 get the checkpoint's names and shapes only
        meta = checkpoint_meta_state_dict(resolve_model_path(cfg.model.name_or_path))
    with zero3_load(deepspeed_config(cfg.train)):
        if meta is None:
            return load_model(cfg, device)
        return _load_from_meta(cfg, device, meta)


def _load_from_meta(cfg: ExperimentConfig, device: str | torch.device,
                    meta: dict[str, torch.Tensor]) -> tuple[Any, Any]:
    """A rank > 0's partitioned policy under ZeRO-3: built as ``load_model`` builds it, its gathers fed
    ``meta`` (rank 0 reads the checkpoint and fills every gathered parameter)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    m = cfg.model
    path = resolve_model_path(m.name_or_path)
    config = AutoConfig.from_pretrained(path, trust_remote_code=m.trust_remote_code)
    if m.rope_scaling:
        _apply_rope_scaling(config, m.rope_scaling)
    extra = {"attn_implementation": m.attn_implementation} if m.attn_implementation else {}
    # the model class itself: the Auto class resolves remote code from the (absent) path first
    model_cls: Any = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    model: Any = model_cls.from_pretrained(
        None, config=config, state_dict=meta, dtype=getattr(torch, m.dtype), **extra)
    if cfg.train.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(device).eval()
    return model, load_tokenizer(m.name_or_path, trust_remote_code=m.trust_remote_code)


def sais_from_engine(cfg: ExperimentConfig) -> bool:
    """Whether SAIS takes each segment's old log-probs from the engine's sampled-token log-probs
    (``algo.sais_logprobs``; ``auto``: under ZeRO-3 with vLLM engines) instead of a trainer forward."""
    choice = cfg.algo.sais_logprobs
    if choice == "auto":
        return is_zero3(cfg) and cfg.rollout.engine == "vllm"
    return choice == "engine"


def rollout_copy_needed(cfg: ExperimentConfig) -> bool:
    """Whether rank 0 keeps a full unpartitioned policy copy under ZeRO-3: yes for the in-process
    hf engine and for SAIS log-probs from a trainer forward (both run the policy on rank 0 alone);
    no when vLLM engines (loading the checkpoint themselves, fed by gathered buckets) are the only
    users of the weights and SAIS, if on, takes the engine's log-probs (``sais_from_engine``)."""
    if cfg.rollout.engine != "vllm":
        return True
    return cfg.algo.is_mode == "sais" and not sais_from_engine(cfg)


RESIDENCY_ENV = "ULORL_PARAM_RESIDENCY_DIR"


def materialised_param_bytes(backend: Any) -> int:
    """Parameter bytes this rank holds right now: for each ZeRO-3 parameter its partition
    (``ds_tensor``) plus its full tensor while gathered (``data`` is ``empty(0)`` when released;
    persistent small parameters stay whole), a plain parameter's tensor, and a separate rollout
    copy's tensors when there is one."""
    def module_bytes(module: Any) -> int:
        total = 0
        for p in module.parameters():
            total += p.data.numel() * p.element_size()
            if hasattr(p, "ds_tensor"):
                total += p.ds_tensor.numel() * p.element_size()
        return total

    out = module_bytes(backend.module)
    if backend.rollout_model is not backend.module:
        out += module_bytes(backend.rollout_model)
    return out


class ParamResidency:
    """Peak of ``materialised_param_bytes`` on this rank, sampled at every submodule's forward (pre and
    post: where ZeRO-3 gathers for compute) and after every gathered export bucket (weight pushes,
    ``save_model``); written to ``DIR/rank<r>.json`` whenever it grows. A diagnostic: attached only when
    ``ULORL_PARAM_RESIDENCY_DIR`` is set (the composition test reads it)."""

    def __init__(self, backend: Any, rank: int, out_dir: Path) -> None:
        import json

        self.backend, self.path, self._json = backend, Path(out_dir) / f"rank{rank}.json", json
        self.full_bytes = sum(full_nbytes(p) for p in backend.module.parameters())
        self.peak, self.samples = 0, 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for m in backend.module.modules():
            m.register_forward_pre_hook(lambda *a: self.sample())
            m.register_forward_hook(lambda *a: self.sample())
        gathered = backend._gathered_buckets

        def sampled_buckets() -> Any:
            for bucket in gathered():
                self.sample()
                yield bucket

        backend._gathered_buckets = sampled_buckets
        self.sample()

    def sample(self) -> None:
        self.samples += 1
        now = materialised_param_bytes(self.backend)
        if now > self.peak:
            self.peak = now
            copy = self.backend.rollout_model is not self.backend.module
            self.path.write_text(self._json.dumps({"peak_bytes": now, "full_bytes": self.full_bytes,
                                                  "rollout_copy": copy}))


def finish_backend(backend: DeepSpeedBackend, cfg: ExperimentConfig) -> DeepSpeedBackend:
    """Settings every rank applies to a new DeepSpeed backend (the same on every rank): ZeRO-3 exports
    (weight pushes, ``save_model``) gather buckets of ``rollout.weight_sync_bucket_mb``, the size the
    engines receive; the ``ULORL_PARAM_RESIDENCY_DIR`` probe when set."""
    backend.export_bucket_bytes = bucket_bytes_from_mb(cfg.rollout.weight_sync_bucket_mb)
    out = os.environ.get(RESIDENCY_ENV)
    if out and backend.zero_stage == 3:
        backend.residency = ParamResidency(backend, dist_env().rank, Path(out))
    return backend


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
    ctx = UpdateContext.of_run(backend, cfg, pad_id, device)
    updates = 0
    while True:
        name, payload = dp.receive()
        if name == "update":
            samples = dp.receive_samples()
            res = policy_update(samples, ctx)
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
    backend = finish_backend(DeepSpeedBackend(model, cfg.train, rollout_copy=rollout_copy_needed(cfg)), cfg)
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
