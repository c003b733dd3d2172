"""Weight export in the checkpoint's names and layout (what vLLM's loaders read): a tiny Qwen3-MoE's
fused experts are split per expert exactly as ``save_pretrained`` writes them; dense Qwen3 passes."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from ulorl.rollout.checkpoint_names import conversion_model, to_checkpoint_names


def _tiny_moe() -> Qwen3MoeForCausalLM:
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=4, num_experts_per_tok=2))


def test_moe_export_equals_the_saved_checkpoint(tmp_path: Path) -> None:
    model = _tiny_moe()
    assert any(n.endswith("mlp.experts.gate_up_proj") for n, _ in model.named_parameters())  # fused in memory
    model.save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    names_model = conversion_model(tmp_path)
    assert names_model is not None and next(names_model.parameters()).device.type == "meta"

    exported = dict(to_checkpoint_names(names_model, ((n, p.detach()) for n, p in model.named_parameters())))
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in exported
    assert not any("gate_up_proj" in n for n in exported)
    exported.setdefault("lm_head.weight", model.lm_head.weight.detach())  # tied or not, saved once
    assert set(exported) == set(saved)
    for name, tensor in saved.items():
        assert torch.equal(exported[name], tensor), name


def test_export_is_lazy_one_source_tensor_at_a_time(tmp_path: Path) -> None:
    model = _tiny_moe()
    model.save_pretrained(tmp_path)
    pulled: list[str] = []

    def source():
        for n, p in model.named_parameters():
            pulled.append(n)
            yield n, p.detach()

    it = to_checkpoint_names(conversion_model(tmp_path), source())
    first = next(it)
    assert first[0] == "model.embed_tokens.weight" and pulled == ["model.embed_tokens.weight"]


def test_dense_qwen3_needs_no_conversion(tmp_path: Path) -> None:
    Qwen3ForCausalLM(Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, head_dim=16)).save_pretrained(tmp_path)
    assert conversion_model(tmp_path) is None
    pairs = [("a", torch.ones(2))]
    assert list(to_checkpoint_names(None, pairs)) == pairs
