"""DeepSpeed ZeRO training backend (``train.backend: deepspeed``), same interface as ``TorchBackend``.

    backend = DeepSpeedBackend(model, cfg.train)   # ZeRO stage / offload from cfg.train.deepspeed

* Optimizer: a torch ``AdamW`` handed to DeepSpeed (constant lr, ``train.betas``, ``weight_decay``),
  so nothing compiles (DeepSpeed's own CPU Adam builds an extension for ~60 s). Gradient clipping
  at ``train.grad_clip`` is DeepSpeed's (global norm over all ZeRO partitions); ``step`` returns
  the pre-clip global norm.
* Precision: ``train.bf16`` -> DeepSpeed bf16 (bf16 module, fp32 master weights in the optimizer).
* Non-finite gradients: DeepSpeed 0.19's ZeRO optimizers skip the step when the global gradient norm
  (reduced over every rank) is not finite — ZeRO-3 in any dtype, ZeRO-1/2 in fp32 and, with
  ``bf16.check_grad_overflow`` (set here), in bf16 — and report the norm as inf. ``step`` checks
  that DeepSpeed did so (``was_step_applied``) and raises if it ever applied a non-finite step.
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
  ``model/`` use — the engine's own module under ZeRO 1/2 (full replica), a full copy on rank 0
  under ZeRO-3 (parameters are partitioned there), refreshed by ``state_dict_for_rollout``. With
  ``rollout_copy=False`` (engines in other processes) rank 0 keeps no such copy: ``rollout_model``
  is the partitioned module, weights leave through ``named_weights_for_rollout`` and
  ``save_model`` gathered per bucket.
* ZeRO-3 partitioned load: ``zero3_load(ds_config)`` around ``from_pretrained`` / ``from_config``
  makes transformers build the model under ``deepspeed.zero.Init`` (each rank allocates only its
  partition; rank 0 copies the checkpoint's values into each gathered module, which is then
  re-partitioned). Transformers 5.16-5.19 (vLLM 0.32's range) would read the whole checkpoint, and fuse
  MoE experts, on every rank: ranks > 0 get ``checkpoint_meta_state_dict`` instead (``train.worker``).
  A model that arrives partitioned is wrapped as it is; one that arrives whole is partitioned by
  ``deepspeed.initialize`` (every rank held the whole model until then).

deepspeed is imported when the backend is built, never at package import.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Optional

import torch

from ulorl.config import TrainConfig
from ulorl.rollout.weight_sync import WeightMeta, WeightStreamFactory
from ulorl.train.backend import adamw
from ulorl.train.distributed import DataParallel, dist_env, ensure_process_group

log = logging.getLogger("ulorl.train.deepspeed")

CHECKPOINT_SUBDIR = "deepspeed"
CHECKPOINT_TAG = "state"
EXPORT_BUCKET_BYTES = 256 << 20   # ZeRO-3 export: parameters gathered per bucket (same on every rank)


def full_nbytes(p: torch.nn.Parameter) -> int:
    """Bytes of a parameter's full (unpartitioned) tensor: ZeRO-3 keeps the full numel in ``ds_numel``."""
    return int(getattr(p, "ds_numel", p.numel())) * p.element_size()


def bucketize_params(named: list[tuple[str, torch.nn.Parameter]], bucket_bytes: int
                     ) -> list[list[tuple[str, torch.nn.Parameter]]]:
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


def is_partitioned(model: torch.nn.Module) -> bool:
    """True when ``model``'s parameters are ZeRO-3 partitioned (built under ``deepspeed.zero.Init``)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def local_partition_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameter data this rank holds: its ZeRO-3 partitions (``ds_tensor``), or the full
    tensors of an unpartitioned model."""
    return sum((p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel()) * p.element_size()
               for p in model.parameters())


class _ZeroThreeLoadConfig:
    """What transformers asks of a DeepSpeed config while loading (``is_zero3``, ``config``): the
    same as ``transformers.integrations.HfDeepSpeedConfig`` without its ``accelerate`` dependency."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def is_zero3(self) -> bool:
        return int(self.config.get("zero_optimization", {}).get("stage", 0)) == 3


@contextlib.contextmanager
def zero3_load(ds_config: dict[str, Any]) -> Iterator[None]:
    """Inside: transformers' ``from_pretrained`` / ``from_config`` build models partitioned under
    ``deepspeed.zero.Init(ds_config)``. Scoped (not kept for the process' life) so that models built
    afterwards (a judge, an in-process engine's copy) stay whole and ``generate`` does not switch to
    ZeRO-3's all-rank synchronised decoding. Needs the process group (``ensure_process_group``)."""
    from transformers.integrations import deepspeed as hf_ds

    previous = hf_ds._hf_deepspeed_config_weak_ref
    holder = _ZeroThreeLoadConfig(ds_config)   # transformers keeps only a weak reference: hold it here
    hf_ds.set_hf_deepspeed_config(holder)
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = previous
        del holder


def deepspeed_config(cfg: TrainConfig) -> dict[str, Any]:
    """The DeepSpeed JSON config for ``cfg`` (see the module docstring for why each value)."""
    ds = cfg.deepspeed
    # overlap_comm: ZeRO-3 reduces gradients and gathers parameters on side streams while the backward
    # runs (DeepSpeed's default and recommendation for stage 3). Off for 1 / 2: DeepSpeed's default,
    # and with the caller-owned accumulation boundary it refuses overlap_comm under ZeRO-1.
    zero: dict[str, Any] = {"stage": ds.zero_stage, "overlap_comm": ds.zero_stage == 3, "contiguous_gradients": True}
    if ds.zero_stage == 3:
        # DeepSpeed's defaults unless set: a model smaller than them stays gathered whole for the whole pass
        zero.update({"stage3_max_live_parameters": ds.max_live_parameters,
                     "stage3_max_reuse_distance": ds.max_reuse_distance,
                     "stage3_prefetch_bucket_size": ds.prefetch_bucket_size})
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": cfg.grad_clip,
        # check_grad_overflow: skip a bf16 step whose gradient norm is not finite (DeepSpeed's default,
        # stated so that a change of default cannot drop it; fp32 steps are always checked)
        "bf16": {"enabled": bool(cfg.bf16), **({"check_grad_overflow": True} if cfg.bf16 else {})},
        # bf16: accumulate gradients across micro-batches in fp32 (bf16 accumulation loses small terms)
        **({"data_types": {"grad_accum_dtype": "fp32"}} if cfg.bf16 else {}),
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }


def unpartitioned_like(model: Any) -> Any:
    """A whole (unpartitioned) module of ``model``'s class, config and dtype, weights uninitialised
    (they are gathered into it next): the rank-0 rollout copy of a model loaded partitioned."""
    from transformers import initialization as hf_init

    dtype = next(model.parameters()).dtype
    with hf_init.no_init_weights():
        whole = type(model)._from_config(model.config, dtype=dtype)
    if getattr(model, "is_gradient_checkpointing", False):
        whole.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return whole


class DeepSpeedBackend:
    """``TrainBackend`` over a DeepSpeed engine (module docstring).

    Attributes:
        model: the DeepSpeed engine (an ``nn.Module``: forward / train / eval go through it, as ZeRO
            needs its hooks); ``engine.module`` is the transformers model.
        rollout_model: full-weight transformers module for rollouts, SAIS log-probs and checkpoints.
        is_main_process: rank 0.
        data_parallel: ``DataParallel`` when WORLD_SIZE > 1, else None.
        residency: the ``ULORL_PARAM_RESIDENCY_DIR`` probe (``worker.ParamResidency``) when one is attached.
    """

    residency: Optional[object] = None

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig, rollout_copy: bool = True) -> None:
        """``rollout_copy`` (ZeRO-3 only; the same value on every rank): rank 0 keeps a full
        unpartitioned copy for an in-process engine / SAIS log-probs. False when the engines run in
        other processes: no rank then holds more than its partition plus one export bucket."""
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
        self.rollout_copy = bool(rollout_copy) and self.zero_stage == 3
        partitioned = is_partitioned(model)
        # ZeRO-3 partitions the module's parameters in place: keep a full copy for rollouts (rank 0);
        # a model loaded partitioned gets an empty copy, filled from gathered buckets below
        copy_for_rollout = None
        if self.rollout_copy and self.is_main_process:
            copy_for_rollout = unpartitioned_like(model) if partitioned else copy.deepcopy(model)
        optimizer = adamw([p for p in model.parameters() if p.requires_grad], cfg)
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
        if self.rollout_copy and partitioned:
            self._gather_into_rollout_copy()   # collective: every rank is here (same rollout_copy)

    # ------------------------------------------------------------------ training
    def backward(self, loss: torch.Tensor) -> None:
        # DeepSpeed averages gradients over ranks; the loss parts already carry the global token
        # denominator, so scale by W to get their sum (module docstring).
        self.engine.backward(loss * self.world_size if self.world_size > 1 else loss, scale_wrt_gas=False)

    def step(self) -> float:
        """Reduce, clip, AdamW step, zero gradients; return the pre-clip global grad norm.

        A non-finite norm (on any rank's gradients: the norm is reduced over all of them) means no
        rank stepped: DeepSpeed skipped it (module docstring), the gradients are dropped, and the
        caller sees the non-finite norm. Raises if DeepSpeed reports a step applied on one.
        """
        self.engine.step()
        raw = self.engine.get_global_grad_norm()
        norm = float(raw) if raw is not None else float("nan")
        applied = bool(self.engine.was_step_applied())
        if applied and not math.isfinite(norm):
            import deepspeed

            raise RuntimeError(
                f"DeepSpeed {deepspeed.__version__} applied an optimizer step with a non-finite global gradient "
                f"norm ({norm}) at ZeRO stage {self.zero_stage}: the weights are no longer trustworthy. Resume "
                "from the last checkpoint under a DeepSpeed that skips such steps (0.19.8 does: "
                "tests/test_nonfinite_grad.py).")
        if not applied:
            self.zero_grad()   # nothing of the skipped step's gradients may reach the next one
            return norm if not math.isfinite(norm) else float("inf")
        return norm

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
        if self.zero_stage == 3 and self.rollout_copy and self.data_parallel is None:
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
        if not self.rollout_copy:   # no full copy to refresh: rank 0 gets CPU copies, bucket by bucket
            gathered: dict[str, torch.Tensor] = {}
            for bucket in self._gathered_buckets():
                if self.is_main_process:
                    gathered.update({name: p.data.detach().to("cpu", copy=True) for name, p in bucket})
            return gathered
        self._gather_into_rollout_copy()
        if not self.is_main_process:
            return {}
        return {k: v.detach() for k, v in self.rollout_model.state_dict().items()}

    def _gather_into_rollout_copy(self) -> None:
        """ZeRO-3, every rank: gather bucket by bucket; rank 0 copies each into ``rollout_model``."""
        target = dict(self.rollout_model.named_parameters()) if self.is_main_process else {}
        for bucket in self._gathered_buckets():
            for name, p in bucket:
                if name in target:
                    target[name].data.copy_(p.data)

    def save_model(self, directory: Path) -> None:
        """Every rank (a collective under ZeRO-3): rank 0 writes the full weights to ``directory`` as
        safetensors shards of one gathered bucket each (+ index and config), so that
        ``from_pretrained(directory)`` loads them; rank 0 never holds more than one bucket."""
        from safetensors.torch import save_file

        directory = Path(directory)
        if self.zero_stage != 3 or self.rollout_copy:
            if self.is_main_process:
                whole: Any = self.rollout_model
                whole.save_pretrained(directory, safe_serialization=True)
            return
        if self.data_parallel is not None and self.data_parallel.is_driver:
            self.data_parallel.send("save_model", str(directory))
        names = self._export_buckets()
        weight_map: dict[str, str] = {}
        if self.is_main_process:
            directory.mkdir(parents=True, exist_ok=True)
            config: Any = self.module.config
            config.save_pretrained(directory)
        for i, bucket in enumerate(self._gathered_buckets()):
            if not self.is_main_process:
                continue
            shard = f"model-{i + 1:05d}-of-{len(names):05d}.safetensors"
            save_file({name: p.data.detach().to("cpu", copy=True).contiguous() for name, p in bucket},
                      str(directory / shard), metadata={"format": "pt"})
            weight_map.update({name: shard for name, _ in bucket})
        if self.is_main_process:
            total = sum(full_nbytes(p) for p in self.module.parameters())
            (directory / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))

    def _export_buckets(self) -> list[list[tuple[str, torch.nn.Parameter]]]:
        return bucketize_params(list(self.module.named_parameters()), self.export_bucket_bytes)

    @property
    def rollout_weight_stream(self) -> WeightStreamFactory:
        """``named_weights_for_rollout`` streams, with ``rollout_weight_metadata`` (no gather)."""
        return WeightStreamFactory(self.named_weights_for_rollout, self.rollout_weight_metadata)

    def rollout_weight_metadata(self) -> list[WeightMeta]:
        """``(name, dtype, full shape)`` of every tensor ``named_weights_for_rollout`` yields, in its
        order, read locally on any rank: ZeRO-3 keeps each parameter's full shape in ``ds_shape``."""
        if self.zero_stage != 3:
            return [(k, v.dtype, tuple(v.shape)) for k, v in self.module.state_dict().items()]
        return [(name, p.dtype, tuple(getattr(p, "ds_shape", p.shape)))
                for bucket in self._export_buckets() for name, p in bucket]

    def named_weights_for_rollout(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Lazy ``(name, tensor)`` stream of the full weights for a streaming engine (rank 0).

        ZeRO-1/2: the module's own tensors. ZeRO-3: parameters gathered one bucket of
        ``export_bucket_bytes`` at a time (a collective: the worker ranks run the same sequence
        from ``state_dict_for_rollout``), the bucket released before the next one is gathered.
        Tensors stay where the trainer holds them (its GPU): each consumer copies once, where it
        must (a native NCCL broadcast packs device tensors; the bucketed stream copies each bucket
        to host once). A yielded ZeRO-3 tensor is the gathered parameter's data: it keeps that
        gathered storage alive while the consumer holds it, so rank 0 holds at most the consumer's
        current bucket plus the gathered buckets it spans.
        """
        if self.zero_stage != 3:
            for k, v in self.module.state_dict().items():
                yield k, v.detach()
            return
        if self.data_parallel is not None and self.data_parallel.is_driver:
            self.data_parallel.send("gather")
        for bucket in self._gathered_buckets():
            for name, p in bucket:
                yield name, p.data.detach()

    def _gathered_buckets(self) -> Iterator[list[tuple[str, torch.nn.Parameter]]]:
        """ZeRO-3: ``named_parameters`` in buckets of ``export_bucket_bytes`` (full sizes), each
        inside ``GatheredParameters`` while the caller consumes it. Every rank must iterate fully."""
        from deepspeed.runtime.zero.partition_parameters import GatheredParameters

        yield from hold_while_consumed(self._export_buckets(),
                                       lambda bucket: GatheredParameters([p for _, p in bucket], modifier_rank=None),
                                       synchronize_device_of)

    def close(self, **info: Any) -> None:
        """Rank 0: release the worker ranks; ``info`` (run_id, steps, ...) is what their loop returns."""
        if self.data_parallel is not None and self.data_parallel.is_driver:
            self.data_parallel.send("stop", info)


def synchronize_device_of(bucket: list[tuple[str, torch.nn.Parameter]]) -> None:
    """Wait for every kernel queued on the bucket's CUDA device, whatever its stream (no-op on CPU)."""
    dev = next((p.data.device for _, p in bucket if p.data.is_cuda), None)
    if dev is not None:
        torch.cuda.synchronize(dev)


def hold_while_consumed(buckets: Iterable[list[tuple[str, torch.nn.Parameter]]], gather: Any,
                        synchronize: Any) -> Iterator[list[tuple[str, torch.nn.Parameter]]]:
    """Each bucket inside ``gather(bucket)`` while the consumer reads it, and ``synchronize(bucket)``
    before the gather is left.

    Why the synchronisation: vLLM's ``packed_nccl_broadcast_producer`` pulls this stream inside
    alternating side streams (``torch.cuda.stream(streams[i])`` around ``pack_tensors``), so a bucket's
    tensors may be packed (``torch.cat``) on one stream while the generator resumes, and leaves the
    gather, under the next. DeepSpeed's release frees the gathered storage to the caching allocator
    for its allocation stream only (no ``record_stream`` for the side streams), so the next gather
    could overwrite it while the earlier stream's copy still reads it. The consumer has asked for the
    next item, so every read of this bucket is queued: a device synchronize makes them finish first
    (one per bucket of ``export_bucket_bytes``, small next to the gather itself).
    """
    for bucket in buckets:
        with gather(bucket):
            yield bucket
            synchronize(bucket)


#: safetensors header dtypes -> torch (the ones a causal LM checkpoint holds)
_SAFETENSORS_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}
#: model types whose checkpoints hold no persistent buffers: transformers < 5.20 copies checkpoint buffers
#: on every rank (``buf.copy_``), which a meta tensor cannot feed
META_LOAD_MODEL_TYPES = ("qwen3", "qwen3_moe", "qwen2", "qwen2_moe", "llama")


def _cached_snapshot(repo_id: str) -> Optional[Path]:
    """The local Hugging Face cache's snapshot folder of ``repo_id`` when its config is there (never downloads)."""
    if repo_id.count("/") != 1 or repo_id.startswith((".", "/")):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:   # pragma: no cover - comes with transformers
        return None
    found = try_to_load_from_cache(repo_id, "config.json")
    return Path(found).parent if isinstance(found, str) else None


def checkpoint_meta_state_dict(model_dir: str | Path) -> Optional[dict[str, torch.Tensor]]:
    """The checkpoint of a local folder as meta tensors (names, shapes, dtypes from the safetensors
    headers; no tensor data read), or None where a rank must read the checkpoint itself: no local
    ``config.json`` with a model type of ``META_LOAD_MODEL_TYPES``, or no ``*.safetensors`` file. A hub
    id is looked up in the local Hugging Face cache (download it before the run: otherwise every rank
    fetches and reads it).

    Why: under ZeRO-3, transformers 5.16-5.19 (the versions vLLM 0.32 allows) merges every checkpoint
    file into one CPU state dict on EVERY rank (``modeling_utils.py``, ``map_location="cpu"``) and
    fuses a MoE model's experts into new tensors on each, though only rank 0 copies values into the
    gathered parameters (``integrations/deepspeed.py``, ``_load_state_dict_into_zero3_model``). Ranks > 0
    given this dict instead walk the same modules and gathers with no data (transformers 5.25 does the
    same itself: ``map_location="meta"`` on ranks > 0)."""
    from safetensors import safe_open

    d = Path(model_dir)
    if not d.is_dir():
        d = _cached_snapshot(str(model_dir)) or d
    files = sorted(d.glob("*.safetensors"))
    index = d / "model.safetensors.index.json"
    if index.is_file():   # a sharded checkpoint: every shard it names must be there (a download in progress)
        names = set(json.loads(index.read_text()).get("weight_map", {}).values())
        if not names or not all((d / n).is_file() for n in names):
            return None
        files = sorted(d / n for n in names)
    cfg_file = d / "config.json"
    if not files or not cfg_file.is_file():
        return None
    if json.loads(cfg_file.read_text()).get("model_type") not in META_LOAD_MODEL_TYPES:
        return None
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for key in h.keys():
                sl = h.get_slice(key)
                out[key] = torch.empty(sl.get_shape(), dtype=_SAFETENSORS_DTYPES[sl.get_dtype()], device="meta")
    return out
