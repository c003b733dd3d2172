"""The tiny MoE profile's pieces: the MoE shape and its flags, the dense build's cache key left alone, upcycling
from the dense model (slices by hand), the warm start's load-balancing term."""

from __future__ import annotations

import argparse

import pytest
import torch

from ulorl.cli.data import DataCliError, moe_spec
from ulorl.models.tiny import MoeSpec, build_tiny_model, upcycle_from_dense
from ulorl.models.tokenizer import build_tokenizer
from ulorl.models.warmstart import Batch, WarmStartConfig, batch_loss, profile_config


def _args(**kw):
    base = {"moe_experts": None, "moe_top_k": None, "moe_intermediate_size": None}
    base.update(kw)
    return argparse.Namespace(**base)


def test_moe_flags():
    assert moe_spec(_args()) is None
    assert moe_spec(_args(moe_experts=8, moe_top_k=3)) == MoeSpec(num_experts=8, num_experts_per_tok=3)
    with pytest.raises(DataCliError, match="need --moe-experts"):
        moe_spec(_args(moe_top_k=2))
    with pytest.raises(DataCliError, match="num_experts_per_tok"):
        moe_spec(_args(moe_experts=2, moe_top_k=3))


def test_dense_cache_key_is_unchanged_and_moe_keys_differ():
    dense = profile_config()
    assert "moe" not in dense.key_dict() and "moe_init" not in dense.key_dict()
    a = WarmStartConfig(moe=MoeSpec())
    b = WarmStartConfig(moe=MoeSpec(), moe_init="random")
    assert len({dense.cache_key(), a.cache_key(), b.cache_key()}) == 3
    assert "upcycle_source" in a.key_dict() and "upcycle_source" not in b.key_dict()


def test_upcycle_slices_the_dense_mlp_by_hand():
    tok = build_tokenizer()
    dense = build_tiny_model(tok, seed=1).state_dict()
    moe = build_tiny_model(tok, moe=MoeSpec(), seed=2)
    upcycle_from_dense(moe, dense)
    own = moe.state_dict()
    assert torch.equal(own["model.embed_tokens.weight"], dense["model.embed_tokens.weight"])
    assert torch.equal(own["model.layers.3.self_attn.q_proj.weight"], dense["model.layers.3.self_attn.q_proj.weight"])
    pre = "model.layers.2.mlp."
    # expert 1 = dense units 128..255: gate rows then up rows; down columns x 4 experts
    assert torch.equal(own[pre + "experts.gate_up_proj"][1][:128], dense[pre + "gate_proj.weight"][128:256])
    assert torch.equal(own[pre + "experts.gate_up_proj"][1][128:], dense[pre + "up_proj.weight"][128:256])
    assert torch.equal(own[pre + "experts.down_proj"][1], dense[pre + "down_proj.weight"][:, 128:256] * 4)
    with pytest.raises(ValueError, match="not num_experts x moe_intermediate_size"):
        upcycle_from_dense(build_tiny_model(tok, moe=MoeSpec(moe_intermediate_size=64)), dense)


def test_warm_start_loss_adds_the_models_load_balancing_term():
    tok = build_tokenizer()
    moe = build_tiny_model(tok, moe=MoeSpec(router_aux_loss_coef=0.5))
    ids = torch.randint(3, 200, (2, 9))
    batch = Batch(ids, torch.ones(2, 9))
    out = moe(input_ids=ids, output_router_logits=True)
    logp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
    ce = -logp.gather(-1, ids[:, 1:, None]).squeeze(-1).mean()
    assert batch_loss(moe, batch).item() == pytest.approx((ce + 0.5 * out.aux_loss).item(), rel=1e-5)
