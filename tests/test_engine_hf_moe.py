"""The HF engine on a tiny Qwen3-MoE records the experts of every response token (per layer, top-k), as compact
integers, and they are the routes a teacher-forced forward of prompt + response takes at the positions that
produced each token's logits; the scheduler keeps them per segment and a sample's JSON form restores them."""

from __future__ import annotations

import json

import numpy as np
import torch

from ulorl.algo.routing import own_routes
from ulorl.rollout.engines.hf import HFEngine
from ulorl.rollout.types import GenerationRequest, Sample, SamplingParams, SegmentSpan


def _model():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=32, hidden_size=16, intermediate_size=32, moe_intermediate_size=8, num_experts=4,
                         num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=8, decoder_sparse_step=1, mlp_only_layers=[], eos_token_id=31, pad_token_id=0)
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(cfg).eval()


def test_engine_returns_the_routes_of_every_response_token():
    model = _model()
    eng = HFEngine(model, eos_token_id=31, pad_token_id=0)
    assert eng.backend == "hf" and eng.moe_top_k == 2
    reqs = [GenerationRequest(0, [1, 2, 3], [], 6, seed=1), GenerationRequest(1, [4, 5], [6], 5, seed=2)]
    res = eng.generate(reqs, SamplingParams(temperature=1.0, seed=0))
    for req, r in zip(reqs, res):
        routes = r.routed_experts
        assert routes.dtype == np.uint8 and routes.shape == (len(r.token_ids), 2, 2)
        ctx = req.prompt_ids + req.prefix_ids
        ids = torch.tensor([ctx + r.token_ids])
        with torch.no_grad():
            out = model(input_ids=ids, output_router_logits=True)
        c = len(ctx)
        for layer in range(2):
            want = own_routes(out.router_logits[layer], 2)[c - 1:c - 1 + len(r.token_ids)]
            got = torch.from_numpy(routes[:, layer].astype(np.int64))
            assert [sorted(x) for x in got.tolist()] == [sorted(x) for x in want.tolist()]


def test_routes_survive_the_json_form_bit_for_bit():
    a = np.arange(24, dtype=np.uint8).reshape(3, 2, 4)
    b = np.arange(8, dtype=np.int16).reshape(1, 2, 4) + 300
    s = Sample(0, 0, [1], response_ids=[2, 3, 4, 5], segments=[SegmentSpan(0, 3, 0), SegmentSpan(3, 4, 1)],
               routed_experts=[a, b])
    back = Sample.from_dict(json.loads(json.dumps(s.to_dict())))
    assert [x.dtype for x in back.routed_experts] == [np.uint8, np.int16]
    assert np.array_equal(back.routed_experts[0], a) and np.array_equal(back.routed_experts[1], b)
    assert Sample.from_dict(json.loads(json.dumps(Sample(1, 0, [1]).to_dict()))).routed_experts == []
