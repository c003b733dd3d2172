"""The embedded tiny Qwen3 causal LM (about 1M parameters, trains on a 2-core CPU).

    tok = build_tokenizer()
    model = build_tiny_model(tok)       # Qwen3ForCausalLM, random init (seeded)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # heavy imports stay inside the functions (the spec is read by cache lookups)
    import torch
    from transformers import PreTrainedTokenizerBase, Qwen3Config, Qwen3ForCausalLM


@dataclass(frozen=True)
class TinySpec:
    """Architecture of the embedded model (its fields enter the warm-start cache key)."""

    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    vocab_multiple: int = 64     # pad the embedding rows up to a multiple of this

    def to_dict(self) -> dict:
        return asdict(self)


DEFAULT_TINY = TinySpec()


def padded_vocab_size(n_tokens: int, multiple: int = DEFAULT_TINY.vocab_multiple) -> int:
    """Smallest multiple of ``multiple`` that is >= ``n_tokens`` (e.g. 264 -> 320)."""
    return -(-n_tokens // multiple) * multiple


def tiny_config(tokenizer: PreTrainedTokenizerBase, spec: TinySpec = DEFAULT_TINY) -> Qwen3Config:
    """Qwen3Config for the embedded model, with the tokenizer's eos/pad ids."""
    from transformers import Qwen3Config

    vocab = padded_vocab_size(len(tokenizer), spec.vocab_multiple)
    if vocab > 512:
        raise ValueError(f"embedded vocabulary must be <= 512, got {vocab}")
    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.hidden_size // spec.num_attention_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


def build_tiny_model(tokenizer: PreTrainedTokenizerBase, spec: TinySpec = DEFAULT_TINY,
                     seed: int = 0) -> Qwen3ForCausalLM:
    """Randomly initialised embedded model (deterministic given ``seed``), float32."""
    import torch
    from transformers import Qwen3ForCausalLM

    cfg = tiny_config(tokenizer, spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(cfg)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
