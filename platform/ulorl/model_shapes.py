"""Model shapes for memory arithmetic without weights: the paper's Qwen3 configs kept in code, or a local
``config.json``.

    shape = model_shape("Qwen/Qwen3-30B-A3B")      # ModelShape(..., layers=48, kv_heads=4, ...)
    shape.params                                    # 30.53e9 parameters, counted from the shape
    shape.kv_bytes_per_token(tensor_parallel=1)     # 98,304 = 48 x 4 x 128 x 2 (K, V) x 2 bytes

A hub id is never fetched (no downloads at run time): a hub id outside ``KNOWN_SHAPES`` has no shape
(None) unless its ``config.json`` is already in the local Hugging Face cache.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

__all__ = ["ModelShape", "KNOWN_SHAPES", "model_shape", "shape_from_config"]


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only (dense or MoE) config that size its weights and KV cache."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int           # dense MLP width (MoE models: their dense width, unused by MoE layers)
    tie_embeddings: bool = False
    experts: int = 0            # routed experts per MoE layer (0: dense)
    moe_intermediate: int = 0   # width of one expert's MLP

    @property
    def attention_params(self) -> int:
        """q, k, v, o projections of one layer (no biases; Qwen3's q/k RMSNorms are 2 x head_dim)."""
        return self.hidden * self.head_dim * (self.heads + 2 * self.kv_heads) + self.heads * self.head_dim * self.hidden

    @property
    def expert_params(self) -> int:
        """All routed experts of one layer (gate, up, down): ``experts x 3 x hidden x moe_intermediate``."""
        return self.experts * 3 * self.hidden * self.moe_intermediate

    @property
    def mlp_params(self) -> int:
        """One layer's MLP: the routed experts plus the router, or the dense MLP."""
        if self.experts:
            return self.expert_params + self.hidden * self.experts
        return 3 * self.hidden * self.intermediate

    @property
    def params(self) -> int:
        """All parameters (norm weights included): layers, embedding, LM head unless tied."""
        per_layer = self.attention_params + self.mlp_params + 2 * self.hidden + 2 * self.head_dim
        embeddings = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return self.layers * per_layer + embeddings + self.hidden

    @property
    def largest_tensor_params(self) -> int:
        """Elements of the largest single weight in the checkpoint layout (what a weight update streams:
        per-expert matrices, not transformers' fused in-memory experts): the embedding or a dense MLP
        matrix."""
        return max(self.vocab * self.hidden, self.hidden * (self.intermediate if not self.experts else
                                                            self.moe_intermediate))

    def kv_bytes_per_token(self, tensor_parallel: int = 1, dtype_bytes: int = 2) -> int:
        """KV-cache bytes one token takes on one GPU of a TP group: layers x KV heads per rank x head_dim
        x 2 (K and V) x dtype bytes. vLLM shards KV heads over TP ranks and replicates them when TP
        exceeds their count (at least one head per rank)."""
        heads_per_rank = max(1, self.kv_heads // max(1, tensor_parallel))
        return self.layers * heads_per_rank * self.head_dim * 2 * dtype_bytes


# The released configs (huggingface.co/Qwen/<name>/blob/main/config.json): hidden_size, num_hidden_layers,
# num_attention_heads, num_key_value_heads, head_dim, vocab_size, intermediate_size, tie_word_embeddings,
# num_experts, moe_intermediate_size. Parameter counts from these: 4.02e9, 8.19e9, 30.53e9 (model cards:
# 4.0B, 8.2B, 30.5B).
KNOWN_SHAPES: dict[str, ModelShape] = {
    "Qwen/Qwen3-4B": ModelShape(layers=36, hidden=2560, heads=32, kv_heads=8, head_dim=128, vocab=151936,
                                intermediate=9728, tie_embeddings=True),
    "Qwen/Qwen3-8B": ModelShape(layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, vocab=151936,
                                intermediate=12288),
    "Qwen/Qwen3-30B-A3B": ModelShape(layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128, vocab=151936,
                                     intermediate=6144, experts=128, moe_intermediate=768),
}


def shape_from_config(cfg: dict[str, Any]) -> ModelShape:
    """A ``config.json`` dict (``text_config`` when nested) as a ``ModelShape``."""
    c = cfg.get("text_config", cfg)
    heads = int(c["num_attention_heads"])
    hidden = int(c["hidden_size"])
    return ModelShape(
        layers=int(c["num_hidden_layers"]), hidden=hidden, heads=heads,
        kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(c.get("head_dim") or hidden // heads), vocab=int(c["vocab_size"]),
        intermediate=int(c.get("intermediate_size") or 4 * hidden),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        experts=int(c.get("num_experts") or c.get("num_local_experts") or 0),
        moe_intermediate=int(c.get("moe_intermediate_size") or 0),
    )


def _cached_hub_config(repo_id: str) -> Optional[Path]:
    """``config.json`` of ``repo_id`` if the Hugging Face cache already holds it (never downloads)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return None
    found = try_to_load_from_cache(repo_id, "config.json")
    return Path(found) if isinstance(found, str) else None


def model_shape(name_or_path: str | Path) -> Optional[ModelShape]:
    """The shape of a local checkpoint folder (its ``config.json``), of a known hub id (``KNOWN_SHAPES``),
    or of a hub id whose config is in the local cache; None otherwise."""
    path = Path(name_or_path)
    if (path / "config.json").is_file():
        return shape_from_config(json.loads((path / "config.json").read_text()))
    name = str(name_or_path)
    if name in KNOWN_SHAPES:
        return KNOWN_SHAPES[name]
    if name.count("/") == 1 and not name.startswith((".", "/")):
        cached = _cached_hub_config(name)
        if cached is not None:
            return shape_from_config(json.loads(cached.read_text()))
    return None
