"""Engine sizing from an experiment config (pure): context, prompt budget, tensor parallelism.

    engine_context(cfg.rollout)        # the engine's max_model_len (prompt + response tokens)
    prompt_budget(cfg.rollout)         # longest prompt kept at load (longer ones are dropped, counted)
    engine_rollout_config(cfg)         # cfg.rollout with tensor_parallel_size resolved from resources
    engine_summary(cfg)                # the dry-run plan's "engine" entry (context, rope scaling, TP)

The engine context defaults to ``DEFAULT_PROMPT_BUDGET + max_response_len``. A 128k profile sets
``rollout.engine_max_model_len`` (e.g. 135,168 = 131,072 + 4,096) and YaRN rope scaling whose
``original_max_position_embeddings x factor`` covers it (vLLM sizes its rotary cache from
``max_position_embeddings`` and does not multiply it by the factor itself; the model loader
sets it to that product, ``models/loading.py``).
"""

from __future__ import annotations

from typing import Any, Optional

from ulorl.config import ExperimentConfig, RolloutConfig, scaled_max_positions

__all__ = ["DEFAULT_PROMPT_BUDGET", "PAPER_ORIGINAL_POSITIONS", "engine_context", "prompt_budget",
           "engine_rollout_config", "tensor_parallel_size", "engine_summary", "scaled_positions"]

DEFAULT_PROMPT_BUDGET = 512
# max_position_embeddings of the released Qwen3 configs (their model cards enable YaRN beyond it)
PAPER_ORIGINAL_POSITIONS = {"Qwen/Qwen3-4B": 40960, "Qwen/Qwen3-8B": 40960, "Qwen/Qwen3-30B-A3B": 40960}


def engine_context(rollout: RolloutConfig) -> int:
    """The engine's ``max_model_len``: ``rollout.engine_max_model_len`` or the default prompt budget + response."""
    if rollout.engine_max_model_len is not None:
        return int(rollout.engine_max_model_len)
    return DEFAULT_PROMPT_BUDGET + int(rollout.max_response_len)


def prompt_budget(rollout: RolloutConfig) -> int:
    """Longest prompt (tokens) a sample may start from so that the full response fits the engine."""
    return engine_context(rollout) - int(rollout.max_response_len)


def tensor_parallel_size(cfg: ExperimentConfig) -> int:
    """``rollout.tensor_parallel_size`` if set, else ``resources.gpus_per_engine`` when > 1, else 1."""
    if cfg.rollout.tensor_parallel_size is not None:
        return int(cfg.rollout.tensor_parallel_size)
    gpus = float(cfg.resources.gpus_per_engine)
    if gpus > 1 and gpus != int(gpus):
        raise ValueError(f"resources.gpus_per_engine={gpus}: a tensor-parallel engine needs a whole number of GPUs")
    return max(1, int(gpus))


def engine_rollout_config(cfg: ExperimentConfig) -> RolloutConfig:
    """``cfg.rollout`` with ``tensor_parallel_size`` and ``engine_max_model_len`` resolved."""
    return cfg.rollout.model_copy(update={"tensor_parallel_size": tensor_parallel_size(cfg),
                                          "engine_max_model_len": engine_context(cfg.rollout)})


def scaled_positions(rope_scaling: Optional[dict[str, Any]]) -> Optional[int]:
    """``original_max_position_embeddings x factor`` of a rope-scaling dict (None without both)."""
    return scaled_max_positions(rope_scaling) if rope_scaling else None


def engine_summary(cfg: ExperimentConfig) -> dict[str, Any]:
    """The dry-run plan's ``engine`` entry: context, prompt budget, rope scaling, positions, TP size."""
    ctx = engine_context(cfg.rollout)
    rs = cfg.model.rope_scaling
    scaled = scaled_positions(rs)
    positions = scaled if scaled is not None else PAPER_ORIGINAL_POSITIONS.get(cfg.model.name_or_path)
    return {
        "max_model_len": ctx,
        "prompt_budget": prompt_budget(cfg.rollout),
        "max_response_len": cfg.rollout.max_response_len,
        "rope_scaling": dict(rs) if rs else None,
        "max_position_embeddings": positions,
        "positions_cover_context": None if positions is None else positions >= ctx,
        "tensor_parallel_size": tensor_parallel_size(cfg),
        "weight_transfer": cfg.rollout.weight_transfer,
        "weight_sync_bucket_mb": cfg.rollout.weight_sync_bucket_mb,
        "colocate": cfg.rollout.colocate,
    }
