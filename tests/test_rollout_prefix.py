"""ulorl.rollout.prefix: the prefix forest the hf engine prefills, its token count, and the compact
(lexicographic order + adjacent LCP) record the bench writes and the simulator rebuilds."""

from __future__ import annotations

import random

import pytest

from ulorl.rollout.prefix import (
    adjacent_lcps,
    distinct_contexts,
    lcp,
    prefill_tokens,
    prefix_forest,
    sequences_with_lcps,
    share_plan,
)


def test_forest_and_plan_on_hand_made_contexts():
    # template [1, 2] shared by 3 contexts, then [3] x 40 shared by two of them
    a = [1, 2] + [3] * 40 + [4]
    b = [1, 2] + [3] * 40 + [5]
    c = [1, 2, 9]
    nodes = prefix_forest([a, b, c])
    assert sorted((n.start, n.end) for n in nodes) == [(0, 2), (2, 3), (2, 42), (42, 43), (42, 43)]
    assert prefill_tokens([a, b, c], min_saving=0) == 2 + 40 + 1 + 1 + 1
    # [1, 2] among 3 saves (3 - 1) * 2 = 4 < 64: dissolved into its children; [3] x 40 saves 40 < 64
    assert prefill_tokens([a, b, c], min_saving=64) == len(a) + len(b) + len(c)
    # min_saving 40: [1,2] dissolved, the child [3]x40 (now [1,2,3 x 40], 42 tokens, 2 users) kept
    plan = share_plan(nodes, 3, min_saving=40)
    assert sorted((n.start, n.end) for n in plan) == [(0, 3), (0, 42), (42, 43), (42, 43)]
    assert prefill_tokens([a, b, c], min_saving=40) == 3 + 42 + 2


def test_identical_contexts_count_once_like_the_engine():
    p = [7, 8, 9]
    ctxs = [p] * 8 + [p + [1, 2]] * 2 + [p + [1, 3]]
    uniq, idx = distinct_contexts(ctxs)
    assert uniq == [p, p + [1, 2], p + [1, 3]] and idx == [0] * 8 + [1, 1, 2]
    assert prefill_tokens(ctxs, min_saving=0) == 3 + 1 + 1 + 1
    assert prefill_tokens(ctxs, min_saving=64) == 3 + 5 + 5
    assert prefill_tokens([], 64) == 0


def test_adjacent_lcps_hand_example():
    seqs = [[5, 1, 2], [5, 1], [4, 9], [5, 1, 2, 7], [5, 3]]
    order, lcps = adjacent_lcps(seqs)
    assert [seqs[i] for i in order] == [[4, 9], [5, 1], [5, 1, 2], [5, 1, 2, 7], [5, 3]]
    assert lcps == [0, 2, 3, 1]
    assert lcp([1, 2, 3], [1, 2]) == 2 and lcp([], [1]) == 0


def test_synthetic_sequences_reproduce_every_pairwise_lcp():
    rng = random.Random(0)
    for _ in range(200):
        g = rng.randint(1, 8)
        seqs = []
        for _ in range(g):                      # real-looking: common openings from a tiny alphabet
            base = rng.choice([[1, 2, 3, 4], [1, 2, 5], [6]])
            seqs.append(base[: rng.randint(0, len(base))] + [rng.randint(1, 3) for _ in range(rng.randint(0, 6))])
        seqs = [s for s in seqs if s] or [[1]]
        order, lcps = adjacent_lcps(seqs)
        lens = [len(seqs[i]) for i in order]
        syn = sequences_with_lcps(lens, lcps, first_token=1000)
        assert [len(s) for s in syn] == lens
        assert adjacent_lcps(syn) == (list(range(len(syn))), lcps)   # already sorted, same LCPs
        for i in range(len(syn)):
            for j in range(len(syn)):
                assert lcp(syn[i], syn[j]) == lcp(seqs[order[i]], seqs[order[j]])
        # hence the same prefill count under any prompt and any truncation of the responses
        cut = rng.randint(0, 8)
        real = [[9, 9] + seqs[i][:cut] for i in order]
        fake = [[9, 9] + s[:cut] for s in syn]
        for ms in (0, 3, 64):
            assert prefill_tokens(real, ms) == prefill_tokens(fake, ms)


def test_synthetic_sequences_reject_impossible_records():
    with pytest.raises(ValueError, match="adjacent LCPs"):
        sequences_with_lcps([3, 3], [])
    with pytest.raises(ValueError, match="exceeds"):
        sequences_with_lcps([3, 2], [3])
    with pytest.raises(ValueError, match="proper prefix"):
        sequences_with_lcps([4, 2], [2])


def test_prefill_tokens_equals_the_engine_count():
    torch = pytest.importorskip("torch")
    import transformers

    from ulorl.rollout.engines.hf import HFEngine
    from ulorl.rollout.types import GenerationRequest, SamplingParams

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        cfg = transformers.Qwen3Config(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=1, intermediate_size=64, head_dim=16,
                                       max_position_embeddings=256)
        model = transformers.Qwen3ForCausalLM(cfg).eval()
        rng = random.Random(3)
        template = [5, 6, 7]
        prompts = [template + [rng.randint(10, 100) for _ in range(rng.randint(4, 20))] for _ in range(6)]
        reqs, ctxs = [], []
        for i, p in enumerate(prompts):
            head = [rng.randint(10, 100) for _ in range(rng.randint(0, 30))]
            for k in range(4):                  # new samples (empty prefix) and continuations
                pre = [] if i % 2 == 0 else head[: rng.randint(0, len(head))] + [rng.randint(10, 100)] * (k % 2)
                reqs.append(GenerationRequest(len(reqs), p, pre, 2, seed=len(reqs)))
                ctxs.append(p + pre)
        for ms in (0, 16, 64):
            eng = HFEngine(model, eos_token_id=1, pad_token_id=0, share_min_tokens=ms)
            assert eng.backend == "fast"
            eng.generate(reqs, SamplingParams(temperature=1.0))
            assert eng.last_stats.prefill_tokens == prefill_tokens(ctxs, ms)
    finally:
        torch.set_num_threads(old)
