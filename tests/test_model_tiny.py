"""The embedded tiny Qwen3 and the shared loading path (save_pretrained / from_pretrained)."""

from __future__ import annotations

import pytest
import torch

from ulorl.models.loading import ModelLoadError, embedded_model_dir, load_policy, resolve_model_path
from ulorl.models.tiny import build_tiny_model, count_parameters, padded_vocab_size
from ulorl.models.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_architecture(tok) -> None:
    m = build_tiny_model(tok)
    c = m.config
    assert type(m).__name__ == "Qwen3ForCausalLM"
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.intermediate_size, c.head_dim) == (128, 4, 4, 2, 512, 32)
    assert c.max_position_embeddings >= 1024
    assert len(tok) <= c.vocab_size <= 512 and c.vocab_size % 64 == 0
    assert (c.eos_token_id, c.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    # embeddings 2 x V x 128 + 4 layers x (q 128x128, k,v 128x64, o 128x128, mlp 3 x 128x512, norms)
    per_layer = 128 * 128 * 2 + 128 * 64 * 2 + 3 * 128 * 512 + 2 * 128 + 2 * 32
    assert count_parameters(m) == 2 * c.vocab_size * 128 + 4 * per_layer + 128
    assert padded_vocab_size(264) == 320 and padded_vocab_size(320) == 320


def test_seeded_init(tok) -> None:
    a, b, c = build_tiny_model(tok, seed=1), build_tiny_model(tok, seed=1), build_tiny_model(tok, seed=2)
    wa, wb, wc = (x.model.embed_tokens.weight for x in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_save_load_identical_logits(tok, tmp_path) -> None:
    m = build_tiny_model(tok, seed=3).eval()
    m.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    loaded, ltok = load_policy(str(tmp_path))
    assert ltok.padding_side == "left" and ltok.get_vocab() == tok.get_vocab()
    enc = tok(["Add: 12+34\n", "Add: 10+20+30+40\n"], return_tensors="pt", padding=True)
    with torch.no_grad():
        a = m(**enc).logits
        b = loaded(**enc).logits
    assert torch.equal(a, b)
    assert not loaded.training


def test_rope_scaling_and_dtype(tok, tmp_path) -> None:
    build_tiny_model(tok).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    rs = {"type": "yarn", "factor": 1.5, "original_max_position_embeddings": 1024}
    m, _ = load_policy(str(tmp_path), dtype="bfloat16", rope_scaling=rs)
    params = getattr(m.config, "rope_parameters", None) or m.config.rope_scaling
    assert params["rope_type"] == "yarn" and params["factor"] == 1.5
    assert next(m.parameters()).dtype == torch.bfloat16
    with pytest.raises(ModelLoadError, match="dtype"):
        load_policy(str(tmp_path), dtype="int8")


def test_missing_path_is_named(tmp_path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ModelLoadError, match=str(missing)):
        load_policy(str(missing))


def test_embedded_is_shipped() -> None:
    d = embedded_model_dir()
    assert resolve_model_path("embedded") == str(d)
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "warmstart.json"):
        assert (d / f).is_file(), f"{f} missing from the shipped embedded model in {d}"
    import json

    # loadable by transformers 4.x too (5.x writes a class name 4.x does not know)
    assert json.loads((d / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    m, t = load_policy("embedded")
    assert type(m).__name__ == "Qwen3ForCausalLM" and t.padding_side == "left"
    assert 900_000 <= sum(p.numel() for p in m.parameters()) <= 1_200_000
