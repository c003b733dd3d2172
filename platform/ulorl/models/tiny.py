"""The embedded tiny Qwen3 causal LM (about 1M parameters, trains on a 2-core CPU).

    tok = build_tokenizer()
    model = build_tiny_model(tok)       # Qwen3ForCausalLM, random init (seeded)
    moe = build_tiny_model(tok, moe=MoeSpec())   # Qwen3MoeForCausalLM: every MLP a top-k routed MoE
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # heavy imports stay inside the functions (the spec is read by cache lookups)
    import torch
    from transformers import (
        PreTrainedTokenizerBase,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )


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


@dataclass(frozen=True)
class MoeSpec:
    """The MoE shape of the tiny model (transformers' Qwen3-MoE): every decoder layer's MLP is
    ``num_experts`` SwiGLU experts of width ``moe_intermediate_size``, each token routed to the top
    ``num_experts_per_tok`` by a linear router (softmax, top-k, renormalised when ``norm_topk_prob``),
    with the model's own load-balancing loss (Switch Transformer, ``router_aux_loss_coef``). Its fields
    enter the warm-start cache key."""

    num_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 128
    router_aux_loss_coef: float = 0.001
    norm_topk_prob: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"need 1 <= num_experts_per_tok <= num_experts, got {self.num_experts_per_tok} of "
                             f"{self.num_experts}")
        if self.moe_intermediate_size < 1:
            raise ValueError(f"moe_intermediate_size must be >= 1, got {self.moe_intermediate_size}")

    def to_dict(self) -> dict:
        return asdict(self)


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


#: the dense config's fields the MoE shape keeps as they are (attention, embeddings, special tokens)
_SHARED_WITH_DENSE = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "head_dim", "max_position_embeddings", "rope_parameters",
                      "tie_word_embeddings", "eos_token_id", "pad_token_id", "bos_token_id")


def tiny_moe_config(tokenizer: PreTrainedTokenizerBase, spec: TinySpec = DEFAULT_TINY,
                    moe: MoeSpec = MoeSpec()) -> Qwen3MoeConfig:
    """Qwen3MoeConfig of the tiny model's MoE shape: ``spec``'s attention and embeddings, every layer
    sparse (``decoder_sparse_step`` 1, no dense MLP layer)."""
    from transformers import Qwen3MoeConfig

    dense = tiny_config(tokenizer, spec)
    shared = {key: getattr(dense, key) for key in _SHARED_WITH_DENSE}
    return Qwen3MoeConfig(
        **shared,
        moe_intermediate_size=moe.moe_intermediate_size,
        num_experts=moe.num_experts,
        num_experts_per_tok=moe.num_experts_per_tok,
        norm_topk_prob=moe.norm_topk_prob,
        router_aux_loss_coef=moe.router_aux_loss_coef,
        output_router_logits=False,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def build_tiny_model(tokenizer: PreTrainedTokenizerBase, spec: TinySpec = DEFAULT_TINY,
                     seed: int = 0, moe: Optional[MoeSpec] = None) -> Qwen3ForCausalLM | Qwen3MoeForCausalLM:
    """Randomly initialised embedded model (deterministic given ``seed``), float32; with ``moe`` the
    Qwen3-MoE shape (``tiny_moe_config``)."""
    import torch
    from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Qwen3ForCausalLM | Qwen3MoeForCausalLM
        if moe is None:
            model = Qwen3ForCausalLM(tiny_config(tokenizer, spec))
        else:
            model = Qwen3MoeForCausalLM(tiny_moe_config(tokenizer, spec, moe))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def upcycle_from_dense(moe_model: Qwen3MoeForCausalLM, dense_state: dict[str, torch.Tensor]) -> None:
    """Initialise ``moe_model`` from a dense tiny model's state (fine-grained sparse upcycling).

    Embeddings, attention, norms and the LM head are copied. Layer l's dense SwiGLU of width
    ``n * w`` (n = num_experts, w = moe_intermediate_size) is cut into n slices of w units; expert e
    is slice e, its down projection scaled by n. With near-uniform routing (router weights drawn
    small, top-k renormalised to 1 / k each) the expected output over the k chosen experts,
    ``(1/k) * n * (k/n) * sum_e slice_e``, is the dense MLP's. The routers keep their random init.
    Raises ValueError when the dense width is not n * w.
    """
    import torch

    cfg = moe_model.config
    n, w = cfg.num_experts, cfg.moe_intermediate_size
    own = moe_model.state_dict()
    with torch.no_grad():
        for name, t in own.items():
            if ".mlp." not in name:
                t.copy_(dense_state[name])
        for layer in range(cfg.num_hidden_layers):
            pre = f"model.layers.{layer}.mlp."
            gate, up, down = (dense_state[pre + k] for k in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"))
            if gate.shape[0] != n * w:
                raise ValueError(f"dense MLP width {gate.shape[0]} is not num_experts x moe_intermediate_size = "
                                 f"{n} x {w}")
            for e in range(n):
                sl = slice(e * w, (e + 1) * w)
                own[pre + "experts.gate_up_proj"][e].copy_(torch.cat([gate[sl], up[sl]], dim=0))
                own[pre + "experts.down_proj"][e].copy_(down[:, sl] * n)


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
