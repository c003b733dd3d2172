"""The dry-run's preflight: what vLLM and DeepSpeed will decide on the card ``resources.gpu_memory_gib`` names,
computed before a GPU is touched (pure arithmetic over the model's shape, ``ulorl.model_shapes``).

Per role, each check says whether it passes and, when not, the setting to change and a value that passes:

- ``engine_kv``: an engine's weights per GPU at its TP size, the KV cache left at
  ``rollout.vllm_gpu_memory_utilization`` and whether one ``engine_max_model_len`` sequence fits. vLLM 0.32
  (``vllm/v1/core/kv_cache_utils.py``, ``check_enough_kv_cache_memory``) refuses to start when
  ``cdiv(max_model_len, block_size) x page_size`` (summed over layers) exceeds the KV memory, after
  keeping one block back for the pool's null block; the KV memory is ``ceil(total x utilization)``
  minus the profiled non-KV memory (``gpu_worker.py``: weights, peak activations, CUDA graphs), for
  which ``ENGINE_NON_WEIGHT_ALLOWANCE_GIB`` stands here (an allowance, not measured). A page is
  ``block_size x kv_heads per rank x head_dim x 2 x dtype bytes`` per layer (``AttentionSpec``).
- ``trainer``: the trainer's peak per GPU (the plan's ``trainer_peak_per_gpu``) within 90 % of the card;
  the fix names the smallest ``train.sequence_parallel`` that fits.
- ``colocated_wake`` (``rollout.colocate``): the engine's reservation beside the trainer's steady state
  (weights, gradients, AdamW master copy and moments) plus the weight stream's gathered buckets:
  vLLM only gets back what it reserved at start (``rollout/colocate.py``).
- ``host_load``: host memory per node while the trainer ranks load the checkpoint.
- ``dev_shm``: /dev/shm per engine node: two of our largest weight buckets per engine and, for a
  tensor-parallel engine, vLLM's own message queues (``multiproc_executor.py``: the executor's
  broadcast queue of ``VLLM_MQ_MAX_CHUNK_BYTES_MB`` (16) MiB x 10 chunks, and one response queue per
  worker, ``MessageQueue(1, 1)``, whose default chunk is 24 MiB x 10; ``shm_broadcast.py``
  ``ShmRingBuffer`` checks /dev/shm has the whole ring free before creating it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Optional

from ulorl.model_shapes import ModelShape

if TYPE_CHECKING:
    from ulorl.config import ExperimentConfig

GIB = 1024**3
MIB = 1024**2

#: total memory of the paper's cards as nvidia-smi reports it (MiB): H100 80GB HBM3 and H200 141GB
CARD_TOTAL_MIB: dict[float, int] = {80.0: 81559, 141.0: 143771}
#: vLLM's default KV block size on CUDA (tokens per block)
VLLM_BLOCK_SIZE = 16
#: non-KV, non-weight memory of a vLLM worker: profiled peak activations, CUDA graphs, the CUDA context
#: and NCCL buffers (an allowance for Qwen3-size models, not a measurement)
ENGINE_NON_WEIGHT_ALLOWANCE_GIB = 4.0
#: the highest utilization a fix suggests for an engine on its own GPU
MAX_SUGGESTED_UTILIZATION = 0.95
#: the trainer's estimate may fill this fraction of the card (the plan's ``USABLE_GPU_FRACTION``)
TRAINER_USABLE_FRACTION = 0.9
#: host memory of one 8-GPU node (a DGX H100's 2 TiB; the plan's ``HOST_MEMORY_GIB``)
NODE_HOST_MEMORY_GIB = 2048.0
#: vLLM 0.32's VLLM_MQ_MAX_CHUNK_BYTES_MB default (the preflight ignores this machine's environment)
MQ_BROADCAST_CHUNK_MB = 16
#: under ZeRO-3, transformers < 5.20 (the versions vLLM 0.32 allows) merges every checkpoint file into
#: one CPU state dict on every rank (``modeling_utils.py``, ``map_location="cpu"``) and fuses MoE experts
#: on each; ulorl gives ranks > 0 the checkpoint's meta state dict instead (``train.worker``,
#: ``checkpoint_meta_state_dict``) when it is a local folder or already in the HF cache: one reader
ZERO3_EVERY_RANK_READS = False


@dataclass(frozen=True)
class Check:
    """One preflight answer: ``ok``, the numbers behind it, and for a failure the setting and a value that passes."""

    role: str
    name: str
    ok: bool
    detail: str
    fix: Optional[str] = None


def card_total_bytes(gpu_memory_gib: float) -> int:
    """The card's total memory in bytes: nvidia-smi's figure for the 80 / 141 GB cards, else the GiB given."""
    mib = CARD_TOTAL_MIB.get(float(gpu_memory_gib))
    return mib * MIB if mib is not None else int(gpu_memory_gib * GIB)


def kv_cache_bytes_needed(shape: ModelShape, max_model_len: int, tensor_parallel: int, dtype_bytes: int = 2,
                          block_size: int = VLLM_BLOCK_SIZE) -> int:
    """vLLM's ``FullAttentionSpec.max_memory_usage_bytes`` summed over layers, per GPU:
    ``cdiv(max_model_len, block_size) x block_size x kv bytes per token``."""
    blocks = -(-int(max_model_len) // block_size)
    return blocks * block_size * shape.kv_bytes_per_token(tensor_parallel, dtype_bytes)


def engine_weight_bytes(shape: ModelShape, tensor_parallel: int, dtype_bytes: int = 2) -> int:
    """Weights per GPU of a TP engine (every layer, embedding and LM head sharded over TP ranks)."""
    return shape.params * dtype_bytes // max(1, tensor_parallel)


def kv_cache_bytes_available(shape: ModelShape, total_bytes: int, utilization: float, tensor_parallel: int,
                             dtype_bytes: int = 2, overhead_bytes: int = int(ENGINE_NON_WEIGHT_ALLOWANCE_GIB * GIB),
                             block_size: int = VLLM_BLOCK_SIZE) -> int:
    """KV bytes vLLM plans against on one GPU: ``ceil(total x utilization)`` less weights and the non-KV
    allowance, less one block (the pool's null block, ``_pool_bytes_per_block``)."""
    requested = math.ceil(total_bytes * utilization)
    block = block_size * shape.kv_bytes_per_token(tensor_parallel, dtype_bytes)
    return requested - engine_weight_bytes(shape, tensor_parallel, dtype_bytes) - overhead_bytes - block


def max_model_len_that_fits(shape: ModelShape, available: int, tensor_parallel: int, dtype_bytes: int = 2,
                            block_size: int = VLLM_BLOCK_SIZE) -> int:
    """The longest ``max_model_len`` (a multiple of the block size) whose KV fits ``available`` bytes."""
    per_block = block_size * shape.kv_bytes_per_token(tensor_parallel, dtype_bytes)
    return max(0, available // per_block) * block_size


def engine_kv_check(shape: ModelShape, *, total_bytes: int, utilization: float, tensor_parallel: int,
                    max_model_len: int, gpus_per_node: Optional[float], engines: int,
                    dtype_bytes: int = 2, overhead_bytes: int = int(ENGINE_NON_WEIGHT_ALLOWANCE_GIB * GIB)) -> Check:
    """Whether vLLM admits one ``max_model_len`` sequence; else the TP size, utilization or context that does."""
    weights = engine_weight_bytes(shape, tensor_parallel, dtype_bytes)
    avail = kv_cache_bytes_available(shape, total_bytes, utilization, tensor_parallel, dtype_bytes, overhead_bytes)
    need = kv_cache_bytes_needed(shape, max_model_len, tensor_parallel, dtype_bytes)
    ok = 0 < avail and need <= avail
    detail = (f"TP {tensor_parallel}: weights {weights / GIB:.1f} GiB/GPU, KV cache left at utilization {utilization} "
              f"{max(avail, 0) / GIB:.1f} GiB, one {max_model_len}-token sequence needs {need / GIB:.1f} GiB "
              f"({shape.kv_bytes_per_token(tensor_parallel, dtype_bytes) // 1024} KiB/token)")
    if ok:
        return Check("engine", "engine_kv", True, detail)
    fixes = []
    node = int(gpus_per_node) if gpus_per_node else 8
    for tp in (2, 4, 8):
        if tp <= tensor_parallel or tp > node:
            continue
        a = kv_cache_bytes_available(shape, total_bytes, utilization, tp, dtype_bytes, overhead_bytes)
        if 0 < a and kv_cache_bytes_needed(shape, max_model_len, tp, dtype_bytes) <= a:
            keep = max(1, engines * tensor_parallel // tp)
            fixes.append(f"resources.gpus_per_engine={tp}" + (f" with resources.rollout_engines={keep} (same "
                                                               f"{engines * tensor_parallel} engine GPUs)"
                                                               if keep != engines else ""))
            break
    extra = need + weights + overhead_bytes + VLLM_BLOCK_SIZE * shape.kv_bytes_per_token(tensor_parallel, dtype_bytes)
    util = math.ceil(100 * extra / total_bytes) / 100
    if util <= MAX_SUGGESTED_UTILIZATION:
        fixes.append(f"rollout.vllm_gpu_memory_utilization={util:.2f}")
    fits_len = max_model_len_that_fits(shape, avail, tensor_parallel, dtype_bytes)
    if fits_len > 0:
        fixes.append(f"rollout.engine_max_model_len={fits_len}")
    return Check("engine", "engine_kv", False, detail + ": vLLM refuses to start ('larger than the available KV "
                 "cache memory')", " or ".join(fixes) or "a larger card")


def trainer_check(peak_gib: Callable[[int], float], *, sequence_parallel: int, gpu_memory_gib: float,
                  trainer_workers: int) -> Check:
    """The trainer's peak per GPU (``peak_gib(sequence_parallel)``) within ``TRAINER_USABLE_FRACTION`` of the
    card; else the smallest ``train.sequence_parallel`` dividing ``trainer_workers`` that fits."""
    cap = TRAINER_USABLE_FRACTION * gpu_memory_gib
    peak = peak_gib(sequence_parallel)
    detail = f"peak {peak:.1f} GiB/GPU at sequence_parallel {sequence_parallel} (limit {cap:.1f} GiB)"
    if peak <= cap:
        return Check("trainer", "trainer_memory", True, detail)
    for sp in (2, 4, 8):
        if sp > sequence_parallel and trainer_workers % sp == 0 and peak_gib(sp) <= cap:
            return Check("trainer", "trainer_memory", False, detail,
                         f"train.sequence_parallel={sp} (peak {peak_gib(sp):.1f} GiB)")
    return Check("trainer", "trainer_memory", False, detail, "more trainer GPUs (resources.trainer_workers) or a "
                 "larger card")


def trainer_steady_state_bytes(shape: ModelShape, *, ranks: int, zero_stage: int, low_precision: bool) -> int:
    """The trainer's GPU bytes between steps (activations freed): weights, gradients and AdamW state
    (fp32 moments, plus an fp32 master copy for low-precision weights) under the ZeRO stage's sharding."""
    w = 2 if low_precision else 4
    p = shape.params
    weights = p * w // (ranks if zero_stage >= 3 else 1)
    grads = p * w // (ranks if zero_stage >= 2 else 1)
    optim = p * (12 if low_precision else 8) // (ranks if zero_stage >= 1 else 1)
    return weights + grads + optim


def colocated_wake_check(*, total_bytes: int, utilization: float, steady_bytes: int, bucket_bytes: int) -> Check:
    """A colocated engine wakes only if its start-time reservation fits beside the trainer's steady state
    and the two gathered buckets of the weight stream; the fix is ``colocated_utilization``."""
    from ulorl.rollout.colocate import colocated_utilization

    want = math.ceil(total_bytes * utilization)
    transient = 2 * bucket_bytes
    ok = want + steady_bytes + transient <= total_bytes
    detail = (f"engine reservation {want / GIB:.1f} GiB + trainer steady state {steady_bytes / GIB:.1f} GiB "
              f"(weights, grads, AdamW) + 2 buckets {transient / GIB:.2f} GiB vs {total_bytes / GIB:.1f} GiB")
    if ok:
        return Check("engine", "colocated_wake", True, detail)
    util = colocated_utilization(total_bytes, steady_bytes, transient)
    fix = (f"rollout.vllm_gpu_memory_utilization={util:.2f}" if util >= 0.05
           else "rollout.colocate=false (engines on their own GPUs)")
    return Check("engine", "colocated_wake", False, detail + ": the engine cannot wake after the first update", fix)


def host_load_check(shape: ModelShape, *, ranks_on_node: int, loading_ranks: int, zero3: bool,
                    dtype_bytes: int = 2, host_gib: float = NODE_HOST_MEMORY_GIB) -> Check:
    """Host memory of the busiest trainer node while the ranks load the checkpoint: the checkpoint's
    pages once (page cache, shared by the ranks' mmaps) plus, per reading rank, under ZeRO-3 the experts
    transformers fuses into new tensors (MoE; dense models add nothing: values go straight into the
    gathered parameters), without ZeRO-3 the rank's whole host copy of the model before it moves to its GPU."""
    checkpoint = shape.params * dtype_bytes
    extra = shape.layers * shape.expert_params * dtype_bytes if zero3 else checkpoint
    readers = min(ranks_on_node, loading_ranks)
    total = checkpoint + readers * extra
    what = "fused experts" if zero3 else "model copy"
    detail = (f"{readers} of {ranks_on_node} rank(s) on the node read the checkpoint: {checkpoint / GIB:.1f} GiB "
              f"of pages + {readers} x {extra / GIB:.1f} GiB of {what} = {total / GIB:.1f} GiB "
              f"(node {host_gib:.0f} GiB)")
    ok = total <= host_gib * GIB
    return Check("trainer", "host_load", ok, detail, None if ok else "fewer trainer ranks per node "
                 "(resources.gpus_per_node) or a node with more memory")


def dev_shm_bytes(*, bucket_bytes: int, largest_tensor_bytes: int, tensor_parallel: int, engines_on_node: int,
                  stream: bool) -> int:
    """/dev/shm one engine node needs: per engine two of the largest bucket (a tensor larger than a
    bucket travels alone) when buckets go through /dev/shm, and vLLM's message queues of a TP engine:
    ``(16 + 24 x TP) MiB x 10`` (the broadcast queue and one response queue per worker)."""
    from ulorl.rollout.engines.vllm import vllm_message_queue_bytes

    ours = 2 * max(bucket_bytes, largest_tensor_bytes) if stream else 0
    return engines_on_node * (ours + vllm_message_queue_bytes(tensor_parallel, MQ_BROADCAST_CHUNK_MB))


def dev_shm_check(need_bytes: int, *, tensor_parallel: int) -> Check:
    """Always passes (the size is the host's, not the config's): says what /dev/shm must hold. Our
    buckets fall back to inline when it is short (``weight_sync_transport=auto``); vLLM's queues
    do not: a TP engine refuses to start."""
    detail = f"{need_bytes / MIB:.0f} MiB per engine node"
    if tensor_parallel > 1:
        detail += " (vLLM's message queues included: a TP engine refuses to start below them)"
    return Check("engine", "dev_shm", True, detail + f"; in a container: --shm-size={math.ceil(need_bytes / GIB) + 1}g "
                 "or --ipc=host")


def preflight(cfg: ExperimentConfig, shape: Optional[ModelShape], gpu_memory_gib: Optional[float] = None,
              trainer_peak_gib: Optional[Callable[[ExperimentConfig], float]] = None) -> list[Check]:
    """Every check for ``cfg`` on a card of ``gpu_memory_gib`` (default ``resources.gpu_memory_gib``).

    ``trainer_peak_gib(cfg)``: the trainer's peak per GPU in GiB (the dry-run passes the plan's
    ``trainer_peak_per_gpu``); without it the trainer check is left out. No shape: no checks.
    """
    from ulorl.rollout.engine_config import engine_context, tensor_parallel_size

    if shape is None:
        return []
    res, r, t = cfg.resources, cfg.rollout, cfg.train
    gib = float(res.gpu_memory_gib if gpu_memory_gib is None else gpu_memory_gib)
    total = card_total_bytes(gib)
    tp = tensor_parallel_size(cfg)
    dtype_bytes = 4 if (r.engine_dtype or cfg.model.dtype) == "float32" else 2
    checks: list[Check] = []
    vllm = r.engine == "vllm" and r.device != "cpu"
    if vllm:
        checks.append(engine_kv_check(shape, total_bytes=total, utilization=r.vllm_gpu_memory_utilization,
                                      tensor_parallel=tp, max_model_len=engine_context(r),
                                      gpus_per_node=res.gpus_per_node, engines=res.rollout_engines,
                                      dtype_bytes=dtype_bytes))
    if trainer_peak_gib is not None:
        def peak(sp: int) -> float:
            return float(trainer_peak_gib(cfg.model_copy(update={"train": t.model_copy(
                update={"sequence_parallel": sp})})))
        checks.append(trainer_check(peak, sequence_parallel=t.sequence_parallel, gpu_memory_gib=gib,
                                    trainer_workers=res.trainer_workers))
    ds = t.backend == "deepspeed"
    stage = t.deepspeed.zero_stage if ds else 0
    low = cfg.model.dtype in ("bfloat16", "float16") or (ds and t.bf16)
    bucket = int(r.weight_sync_bucket_mb * MIB)
    if vllm and r.colocate:
        steady = trainer_steady_state_bytes(shape, ranks=res.trainer_workers, zero_stage=stage, low_precision=low)
        checks.append(colocated_wake_check(total_bytes=total, utilization=r.vllm_gpu_memory_utilization,
                                           steady_bytes=steady, bucket_bytes=bucket))
    per_node = int(res.gpus_per_node) if res.gpus_per_node else res.trainer_workers
    trainer_gpus = max(1, int(res.gpus_per_trainer_worker or 1))
    ranks_on_node = min(res.trainer_workers, max(1, per_node // trainer_gpus))
    loading = ranks_on_node if (stage < 3 or ZERO3_EVERY_RANK_READS) else 1
    checks.append(host_load_check(shape, ranks_on_node=ranks_on_node, loading_ranks=loading, zero3=stage >= 3,
                                  dtype_bytes=2 if low else 4))
    if vllm:
        engines_on_node = min(res.rollout_engines, max(1, per_node // max(1, tp)))
        largest = shape.largest_tensor_params * dtype_bytes
        need = dev_shm_bytes(bucket_bytes=bucket, largest_tensor_bytes=largest, tensor_parallel=tp,
                             engines_on_node=engines_on_node,
                             stream=r.weight_transfer == "stream" and r.weight_sync_transport != "inline")
        checks.append(dev_shm_check(need, tensor_parallel=tp))
    return checks


OTHER_CARD = {80.0: 141.0, 141.0: 80.0}


def other_card(gpu_memory_gib: float) -> float:
    """The paper card the profile does not name: 141 for an 80 GB profile, else 80."""
    return OTHER_CARD.get(float(gpu_memory_gib), 80.0 if gpu_memory_gib > 100 else 141.0)


def preflight_summary(cfg: ExperimentConfig, shape: Optional[ModelShape],
                      trainer_peak_gib: Optional[Callable[[ExperimentConfig], float]] = None) -> dict[str, Any]:
    """The dry-run's ``preflight`` entry: the checks on the named card, and what to change on the other one."""
    gib = float(cfg.resources.gpu_memory_gib)
    if shape is None:
        return {"note": f"no shape for model {cfg.model.name_or_path!r} (not a local folder with config.json nor "
                        "a known hub id): no preflight"}
    named = preflight(cfg, shape, gib, trainer_peak_gib)
    other = other_card(gib)
    out: dict[str, Any] = {
        "card_gib": gib,
        "passes": all(c.ok for c in named),
        "checks": [asdict(c) for c in named],
    }
    changes = [f"{c.name}: {c.fix}" for c in preflight(cfg, shape, other, trainer_peak_gib) if not c.ok and c.fix]
    out[f"on_{other:g}_gib"] = changes or "passes unchanged"
    return out


def preflight_table(rows: list[tuple[str, float, list[Check]]]) -> str:
    """Markdown: one row per (profile, card) with each check's verdict and the fixes of failing ones."""
    lines = ["| profile | card GiB | engine KV | trainer | colocated wake | host load | /dev/shm | to change |",
             "|---|---|---|---|---|---|---|---|"]
    names = ("engine_kv", "trainer_memory", "colocated_wake", "host_load", "dev_shm")
    for profile, gib, checks in rows:
        by = {c.name: c for c in checks}
        cells = []
        for n in names:
            c = by.get(n)
            cells.append("-" if c is None else (("ok: " if c.ok else "FAILS: ") + c.detail))
        fixes = "; ".join(f"{c.fix}" for c in checks if not c.ok and c.fix) or "-"
        lines.append(f"| {profile} | {gib:g} | " + " | ".join(cells) + f" | {fixes} |")
    return "\n".join(lines)
