"""DeepSpeed ZeRO training backend (``train.backend: deepspeed``), same interface as ``TorchBackend``.

    backend = DeepSpeedBackend(model, cfg.train)   # ZeRO stage / offload from cfg.train.deepspeed

* Optimizer: a torch ``AdamW`` handed to DeepSpeed (constant lr, ``train.betas``, ``weight_decay``),
  so nothing compiles (DeepSpeed's own CPU Adam builds an extension for ~60 s). Gradient clipping
  at ``train.grad_clip`` is DeepSpeed's (global norm over all ZeRO partitions); ``step`` returns
  the pre-clip global norm.
* Precision: ``train.bf16`` -> DeepSpeed bf16 (bf16 module, fp32 master weights in the optimizer).
* Gradient accumulation by token budget: the trainer splits a mini-batch into micro-batches by
  ``train.micro_batch_tokens`` and divides each micro-batch loss by the mini-batch's *global*
  response-token count (Eq. 10). DeepSpeed runs with ``gradient_accumulation_steps=1`` in
  unmanaged mode (``backward`` accumulates, ``step`` is the boundary), never rescales by
  accumulation steps, and averages gradients over ranks — so ``backward`` multiplies the loss by
  the world size: mean over ranks of (W x local part) = sum of the parts = the single-process
  gradient.
* Multi-process: ``self.data_parallel`` (``ulorl.train.distributed.DataParallel``) is set when
  WORLD_SIZE > 1; on rank 0 each collective method first tells the worker ranks to join.
* Checkpoints: ``save(dir)`` / ``load(dir)`` use ``engine.save_checkpoint`` / ``load_checkpoint`` in
  ``dir/deepspeed`` (module, fp32 master weights, Adam moments and step of every rank's shard); the
  trainer writes model/, pools, RNG and data position beside it. Resuming needs the same number of
  processes and a filesystem that every rank sees.
* ``rollout_model``: the plain transformers module the rollout engine and the trainer's checkpoint
  ``model/`` use — the engine's own module under ZeRO 1/2 (full replica), a full copy under ZeRO-3
  (parameters are partitioned there), refreshed by ``state_dict_for_rollout``.

deepspeed is imported when the backend is built, never at package import.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from ulorl.config import TrainConfig
from ulorl.train.distributed import DataParallel, dist_env, ensure_process_group

log = logging.getLogger("ulorl.train.deepspeed")

CHECKPOINT_SUBDIR = "deepspeed"
CHECKPOINT_TAG = "state"
EXPORT_BUCKET_BYTES = 256 << 20   # ZeRO-3 export: parameters gathered per bucket (same on every rank)


def full_nbytes(p: torch.nn.Parameter) -> int:
    """Bytes of a parameter's full (unpartitioned) tensor: ZeRO-3 keeps the full numel in ``ds_numel``."""
    return int(getattr(p, "ds_numel", p.numel())) * p.element_size()


def bucketize_params(named: list[tuple[str, torch.nn.Parameter]], bucket_bytes: int) -> list[list[tuple[str, torch.nn.Parameter]]]:
    """Consecutive parameters grouped into buckets of at most ``bucket_bytes`` full bytes (an
    oversize parameter alone); the same on every rank (pure: sizes and order only)."""
    buckets: list[list[tuple[str, torch.nn.Parameter]]] = []
    cur: list[tuple[str, torch.nn.Parameter]] = []
    size = 0
    for name, p in named:
        n = full_nbytes(p)
        if cur and size + n > bucket_bytes:
            buckets.append(cur)
            cur, size = [], 0
        cur.append((name, p))
        size += n
    if cur:
        buckets.append(cur)
    return buckets


def deepspeed_config(cfg: TrainConfig) -> dict[str, Any]:
    """The DeepSpeed JSON config for ``cfg`` (see the module docstring for why each value)."""
    ds = cfg.deepspeed
    zero: dict[str, Any] = {"stage": ds.zero_stage, "overlap_comm": False, "contiguous_gradients": True}
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": cfg.grad_clip,
        "bf16": {"enabled": bool(cfg.bf16)},
        # bf16: accumulate gradients across micro-batches in fp32 (bf16 accumulation loses small terms)
        **({"data_types": {"grad_accum_dtype": "fp32"}} if cfg.bf16 else {}),
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }


class DeepSpeedBackend:
    """``TrainBackend`` over a DeepSpeed engine (module docstring).

    Attributes:
        model: the DeepSpeed engine (an ``nn.Module``: forward / train / eval go through it, as ZeRO
            needs its hooks); ``engine.module`` is the transformers model.
        rollout_model: full-weight transformers module for rollouts, SAIS log-probs and checkpoints.
        is_main_process: rank 0.
        data_parallel: ``DataParallel`` when WORLD_SIZE > 1, else None.
    """

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig) -> None:
        if cfg.deepspeed.zero_stage not in (1, 2, 3):
            raise ValueError(
                f"train.deepspeed.zero_stage={cfg.deepspeed.zero_stage}: the deepspeed backend runs ZeRO "
                "stage 1, 2 or 3 (for no sharding use train.backend=torch)"
            )
        device_type = next(model.parameters()).device.type
        ensure_process_group(device_type)
        import deepspeed

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        env = dist_env()
        self.cfg = cfg
        self.rank = env.rank
        self.world_size = env.world_size
        self.is_main_process = env.rank == 0
        self.zero_stage = cfg.deepspeed.zero_stage
        self.export_bucket_bytes = EXPORT_BUCKET_BYTES
        self.data_parallel: Optional[DataParallel] = (
            DataParallel(env.rank, env.world_size, cfg.sequence_parallel) if env.world_size > 1 else None
        )
        # ZeRO-3 partitions the module's parameters in place: keep a full copy for rollouts (rank 0).
        copy_for_rollout = copy.deepcopy(model) if self.zero_stage == 3 and self.is_main_process else None
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=cfg.lr,
            betas=tuple(cfg.betas),
            weight_decay=cfg.weight_decay,
        )
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=deepspeed_config(cfg)
        )
        self.model = self.engine
        self.module: torch.nn.Module = self.engine.module
        if copy_for_rollout is not None:
            dtype = next(self.module.parameters()).dtype
            self.rollout_model = copy_for_rollout.to(dtype=dtype).eval()
            for p in self.rollout_model.parameters():
                p.requires_grad_(False)
        else:
            self.rollout_model = self.module
        self.module.eval()

    # ------------------------------------------------------------------ training
    def backward(self, loss: torch.Tensor) -> None:
        # DeepSpeed averages gradients over ranks; the loss parts already carry the global token
        # denominator, so scale by W to get their sum (module docstring).
        self.engine.backward(loss * self.world_size if self.world_size > 1 else loss, scale_wrt_gas=False)

    def step(self) -> float:
        """Reduce, clip, AdamW step, zero gradients; return the pre-clip global grad norm."""
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def zero_grad(self) -> None:
        """Drop accumulated gradients (an update refused after some backward passes)."""
        opt = self.engine.optimizer
        opt.zero_grad(set_to_none=True)  # ZeRO-3: also restarts its partition accumulation
        if self.zero_stage < 3:
            # ZeRO 1/2 keep reduced partition gradients between backward and step; without this reset
            # the next backward would accumulate onto them
            from deepspeed.runtime.zero.stage_1_and_2 import INITIAL_MICRO_STEP_ID

            for name in ("averaged_gradients", "all_grad_tensors"):
                held = getattr(opt, name, None)
                if isinstance(held, dict):
                    held.clear()
            opt.micro_step_id = INITIAL_MICRO_STEP_ID
        self.engine.zero_grad()

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory: Path) -> None:
        """All ranks: write this rank's ZeRO shard (and, on rank 0, the module) into ``dir/deepspeed``."""
        directory = Path(directory)
        if self.data_parallel is not None:
            self.data_parallel.send("save", str(directory))
        self.engine.save_checkpoint(str(directory / CHECKPOINT_SUBDIR), tag=CHECKPOINT_TAG, save_latest=False)
        if self.data_parallel is not None:
            self.data_parallel.barrier()  # every shard is on disk before rank 0 renames the folder

    def load(self, directory: Path) -> None:
        directory = Path(directory)
        path = directory / CHECKPOINT_SUBDIR
        if not (path / CHECKPOINT_TAG).is_dir():
            raise FileNotFoundError(
                f"checkpoint {directory} has no DeepSpeed state ({path / CHECKPOINT_TAG}); it was not written "
                "by train.backend=deepspeed"
            )
        if self.data_parallel is not None:
            self.data_parallel.send("load", str(directory))
        load_path, _ = self.engine.load_checkpoint(
            str(path), tag=CHECKPOINT_TAG, load_optimizer_states=True, load_lr_scheduler_states=False,
            load_module_strict=True,
        )
        if load_path is None:
            raise RuntimeError(f"DeepSpeed could not load its checkpoint from {path}")
        if self.zero_stage == 3 and self.data_parallel is None:
            self.state_dict_for_rollout()

    # ------------------------------------------------------------------ weights out
    def state_dict_for_rollout(self) -> dict[str, torch.Tensor]:
        """Full model weights (ZeRO-3: gathered bucket by bucket from every rank, all ranks take part).

        ZeRO-3, rank 0: each gathered bucket is copied straight into ``rollout_model``'s tensors
        (never the whole model gathered at once, no clone of it); other ranks return {}.
        """
        if self.zero_stage != 3:
            return {k: v.detach() for k, v in self.module.state_dict().items()}
        if self.data_parallel is not None and self.data_parallel.is_driver:
            self.data_parallel.send("gather")
        target = dict(self.rollout_model.named_parameters()) if self.is_main_process else {}
        for bucket in self._gathered_buckets():
            for name, p in bucket:
                if name in target:
                    target[name].data.copy_(p.data)
        if not self.is_main_process:
            return {}
        return {k: v.detach() for k, v in self.rollout_model.state_dict().items()}

    def named_weights_for_rollout(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Lazy ``(name, tensor)`` stream of the full weights for a streaming engine (rank 0).

        ZeRO-1/2: the module's own tensors. ZeRO-3: parameters gathered one bucket of
        ``export_bucket_bytes`` at a time (a collective: the worker ranks run the same sequence
        from ``state_dict_for_rollout``), each yielded as a CPU copy and the bucket released
        before the next one is gathered, so rank 0 holds at most one gathered bucket plus the
        consumer's current bucket.
        """
        if self.zero_stage != 3:
            for k, v in self.module.state_dict().items():
                yield k, v.detach()
            return
        if self.data_parallel is not None and self.data_parallel.is_driver:
            self.data_parallel.send("gather")
        for bucket in self._gathered_buckets():
            for name, p in bucket:
                yield name, p.data.detach().to("cpu", copy=True)

    def _gathered_buckets(self) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """ZeRO-3: ``named_parameters`` in buckets of ``export_bucket_bytes`` (full sizes), each
        inside ``GatheredParameters`` while the caller consumes it. Every rank must iterate fully."""
        from deepspeed.runtime.zero.partition_parameters import GatheredParameters

        named = list(self.module.named_parameters())
        for bucket in bucketize_params(named, self.export_bucket_bytes):
            with GatheredParameters([p for _, p in bucket], modifier_rank=None):
                yield bucket

    def close(self, **info: Any) -> None:
        """Rank 0: release the worker ranks; ``info`` (run_id, steps, ...) is what their loop returns."""
        if self.data_parallel is not None and self.data_parallel.is_driver:
            self.data_parallel.send("stop", info)
