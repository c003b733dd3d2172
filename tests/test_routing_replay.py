"""MoE routing replay (R3): the pure routing functions on hand-built router logits, and one Qwen3-MoE sparse
block whose router has a constructed near-tie (bf16 rounding of the engine flips the trainer's float32 choice).

The block: hidden size 4, 4 experts, top-2, renormalised gates. Token h = e_0 (unit vector); router rows
give logits z = W h = [2, 1, 1 + 2^-12, -1]. In float32 the top-2 set is {0, 2} (2^-12 separates experts 1 and
2); the same router weights rounded to bf16 (8 mantissa bits: 1 + 2^-12 -> 1) tie experts 1 and 2 and topk
keeps the lower index: {0, 1}, the engine's route. Replayed, the trainer's experts are {0, 1} with gates from
its own float32 logits over them: e^2 / (e^2 + e^1) = 0.7311 and e^1 / (e^2 + e^1) = 0.2689.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ulorl.algo.routing import (
    gate_weights,
    own_routes,
    replay_routes,
    route_bytes_per_token,
    route_dtype,
    routes_differ,
    routing_mismatch,
)
from ulorl.rollout.types import Sample, SegmentSpan
from ulorl.train.routing_replay import RouteTable, active_routes, batch_routes, moe_routing, routed_forward

EPS = 2.0 ** -12


def test_replay_routes_by_hand():
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 1.0]])
    rec = torch.tensor([[3, 1], [-1, -1]])          # row 1 has no record: the trainer's own choice
    routes, w, own = replay_routes(z, rec, top_k=2, norm_topk_prob=True)
    assert own.tolist() == [[0, 1], [2, 3]]
    assert routes.tolist() == [[3, 1], [2, 3]]
    # row 0: softmax over the chosen logits {-1, 1}: e^-1 / (e^-1 + e^1) = 1 / (1 + e^2)
    a = 1 / (1 + math.e ** 2)
    b = 1 / (1 + math.e ** -2)
    torch.testing.assert_close(w, torch.tensor([[a, 1 - a], [b, 1 - b]]))
    # not renormalised: the full softmax's probabilities of the chosen experts
    p = torch.softmax(z, dim=-1)
    torch.testing.assert_close(gate_weights(z, routes, norm_topk_prob=False), p.gather(1, routes))
    with pytest.raises(ValueError, match="top_k"):
        replay_routes(z, torch.tensor([[1, 2, 3]]), top_k=2, norm_topk_prob=True)


def test_routes_differ_and_mismatch_by_hand():
    # order within the k does not count; [B=1, T=3, layers=2, k=2]
    t = torch.tensor([[[[0, 1], [2, 3]], [[1, 0], [2, 3]], [[0, 1], [0, 3]]]])
    e = torch.tensor([[[[1, 0], [3, 2]], [[0, 2], [2, 3]], [[0, 1], [0, 2]]]])
    assert routes_differ(t, e).tolist() == [[[False, False], [True, False], [False, True]]]
    s = routing_mismatch(t, e, torch.tensor([[True, True, True]]))
    assert s == {"tokens": 3.0, "token_frac": pytest.approx(2 / 3), "token_layer_frac": pytest.approx(2 / 6)}
    assert routing_mismatch(t, e, torch.tensor([[True, False, False]]))["token_frac"] == 0.0
    assert routing_mismatch(t, e, torch.zeros(1, 3, dtype=torch.bool)) == {}


def test_route_storage_at_the_paper_shape():
    # Qwen3-30B-A3B: 48 layers, top-8 of 128 experts -> uint8, 384 bytes per token, 48 MiB per 128k response
    assert route_dtype(128) == torch.uint8 and route_dtype(257) == torch.int16
    assert route_bytes_per_token(48, 8, 128) == 384
    assert 131_072 * route_bytes_per_token(48, 8, 128) == 48 * 2 ** 20


def _block():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(hidden_size=4, moe_intermediate_size=3, num_experts=4, num_experts_per_tok=2,
                         norm_topk_prob=True, hidden_act="silu")
    torch.manual_seed(0)
    block = Qwen3MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        block.experts.gate_up_proj.normal_()
        block.experts.down_proj.normal_()
        w = torch.zeros(4, 4)
        w[:, 0] = torch.tensor([2.0, 1.0, 1.0 + EPS, -1.0])
        w[:, 1] = torch.tensor([0.0, 0.0, 0.0, 5.0])     # token 1 = e_1: expert 3 first, then 0, 1, 2 tie at 0
        block.gate.weight.copy_(w)
    return block


def _experts_used(block, h):
    seen = {}
    orig = block.experts.forward

    def spy(hidden, top_k_index, top_k_weights):
        seen["index"], seen["weights"] = top_k_index.clone(), top_k_weights.clone()
        return orig(hidden, top_k_index, top_k_weights)

    block.experts.forward = spy
    try:
        out = block(h)
    finally:
        del block.experts.forward
    return seen["index"], seen["weights"], out


def test_near_tie_flips_without_replay_and_replay_restores_the_engine_choice():
    block = _block()
    h = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]])                              # [B=1, L=1, H=4]
    z32 = torch.nn.functional.linear(h.reshape(-1, 4), block.gate.weight)
    z16 = torch.nn.functional.linear(h.reshape(-1, 4).bfloat16(), block.gate.weight.bfloat16()).float()
    trainer_own, engine = own_routes(z32, 2), own_routes(z16, 2)
    assert sorted(trainer_own[0].tolist()) == [0, 2]                        # float32: 1 + 2^-12 > 1
    assert sorted(engine[0].tolist()) == [0, 1]                             # bf16: a tie, lower index kept
    # without replay the block uses the trainer's own experts: the near-tie flipped the engine's choice
    idx, _, _ = _experts_used(block, h)
    assert sorted(idx[0].tolist()) == [0, 2]
    # with replay: the recorded experts, token by token, gates from the float32 logits over them
    recorded = engine.reshape(1, 1, 1, 2)                                   # [B, L, layers, k]
    with moe_routing(block, recorded) as cap:
        idx, w, out = _experts_used(block, h)
    assert idx.tolist() == engine.tolist()
    assert sorted(cap.own[0][0].tolist()) == [0, 2]                         # the trainer's own choice, captured
    e2, e1 = math.exp(2.0), math.exp(1.0)
    by_expert = dict(zip(idx[0].tolist(), w[0].tolist()))
    assert by_expert[0] == pytest.approx(e2 / (e2 + e1)) and by_expert[1] == pytest.approx(e1 / (e2 + e1))
    # the output is the two recorded experts' outputs with those gates
    x = h.reshape(1, 4)
    want = sum(by_expert[e] * _expert(block, e, x) for e in (0, 1))
    torch.testing.assert_close(out.reshape(1, 4), want)
    # the router's forward is its own again after the block
    assert "forward" not in block.gate.__dict__
    assert sorted(_experts_used(block, h)[0][0].tolist()) == [0, 2]


def _expert(block, e, x):
    gate, up = torch.nn.functional.linear(x, block.experts.gate_up_proj[e]).chunk(2, dim=-1)
    return torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, block.experts.down_proj[e])


def test_replay_token_by_token_on_a_one_layer_model():
    # a one-layer tiny Qwen3-MoE: recorded routes on the response positions are the experts used there, token by
    # token; prompt positions (no record) keep the trainer's own choice
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=32, hidden_size=16, intermediate_size=32, moe_intermediate_size=8, num_experts=4,
                         num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=8, decoder_sparse_step=1, mlp_only_layers=[])
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg).eval()
    prompt, response = [1, 2, 3], [4, 5, 6, 7]
    own_first = _own_routes_of(model, prompt + response)                   # [L, k]
    # the "engine" routed every response token to the complement of the trainer's own pair
    comp = torch.tensor([[e for e in range(4) if e not in row][:2] for row in own_first.tolist()])
    t = len(response)
    rec = comp[len(prompt) - 1:len(prompt) - 1 + t].numpy().astype(np.uint8)   # position p-1+j routes token j
    sample = Sample(0, 0, list(prompt), response_ids=list(response),
                    segments=[SegmentSpan(0, 2, 0), SegmentSpan(2, 4, 1)])
    sample.routed_experts = [rec[:2, None], rec[2:, None]]                 # per segment [tokens, layers=1, k]
    table = RouteTable.of([sample], replay=True)
    assert table is not None
    ids = torch.tensor([prompt + response])
    used = _experts_index(model, ids, table)
    p = len(prompt)
    for j in range(t):                                                     # replayed, token by token
        assert used[p - 1 + j].tolist() == comp[p - 1 + j].tolist()
    for pos in range(p - 1):                                               # not recorded: own routing
        assert sorted(used[pos].tolist()) == sorted(own_first[pos].tolist())
    # the trainer's own routes were captured for the row (for the mismatch metric), whatever was replayed
    key = next(iter(table.captured))
    assert table.captured[key][:, 0].tolist() == own_first.tolist()
    # replay off: the own routes are used, the capture still happens
    off = RouteTable.of([sample], replay=False)
    used_off = _experts_index(model, ids, off)
    assert [sorted(r) for r in used_off.tolist()] == [sorted(r) for r in own_first.tolist()]
    assert batch_routes(table, ids, torch.ones_like(ids), 1, 2)[0, p - 1:p - 1 + t, 0].tolist() == rec.tolist()


def _own_routes_of(model, ids):
    out = model(input_ids=torch.tensor([ids]), output_router_logits=True)
    return own_routes(out.router_logits[0], 2)


def _experts_index(model, ids, table):
    block = model.model.layers[0].mlp
    seen = {}
    orig = block.experts.forward

    def spy(hidden, top_k_index, top_k_weights):
        seen["index"] = top_k_index.clone()
        return orig(hidden, top_k_index, top_k_weights)

    block.experts.forward = spy
    try:
        with active_routes(table), routed_forward(model, ids, None):
            model(input_ids=ids)
    finally:
        del block.experts.forward
    return seen["index"]
