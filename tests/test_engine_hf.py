"""HFEngine with a real (randomly initialised) tiny Qwen3 in float32, 1 thread.

Expectations come from the model itself: a full ``model(...)`` forward over prompt + response
gives the reference log-probs, the top-k / top-p allowed sets and the greedy tokens.
"""

from __future__ import annotations

import sys

import pytest
import torch
import transformers

from ulorl.rollout.engines import MissingExtraError, make_engine, vllm_available
from ulorl.rollout.engines.hf import HFEngine, plan_buckets, prefix_forest
from ulorl.rollout.types import Engine, GenerationRequest, SamplingParams

EOS, PAD = 1, 0


def tiny_config(kind: str = "qwen3"):
    common = dict(vocab_size=320, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512)
    if kind == "qwen3":
        return transformers.Qwen3Config(head_dim=16, **common)
    if kind == "qwen2":
        return transformers.Qwen2Config(**common)
    return transformers.LlamaConfig(**common)


def build(kind: str = "qwen3", seed: int = 0):
    torch.manual_seed(seed)
    cls = {"qwen3": transformers.Qwen3ForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
           "llama": transformers.LlamaForCausalLM}[kind]
    model = cls(tiny_config(kind)).eval()
    with torch.no_grad():  # sharper distributions than the default init: realistic, fewer near-ties
        model.lm_head.weight.mul_(8.0)
    return model


@pytest.fixture(scope="module", autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def model():
    return build()


def prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 14) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(lo, hi, (1,), generator=g))
        out.append(torch.randint(2, 320, (length,), generator=g).tolist())
    return out


def reqs(ps, max_new, prefixes=None, seeds=None):
    return [GenerationRequest(i, p, list(prefixes[i]) if prefixes else [], max_new,
                              seed=seeds[i] if seeds else i) for i, p in enumerate(ps)]


def full_logits(model, ctx: list[int], resp: list[int]) -> torch.Tensor:
    """Logits predicting each response token, [len(resp), V], from one unpadded forward."""
    with torch.no_grad():
        lg = model(torch.tensor([ctx + resp])).logits[0].float()
    return lg[len(ctx) - 1: len(ctx) - 1 + len(resp)]


GREEDY = SamplingParams(greedy=True, temperature=1.0)


@pytest.mark.parametrize("batching", ["static", "compact"])
def test_greedy_four_segments_equal_one_shot(model, batching):
    eng = HFEngine(model, EOS, PAD, batching=batching)
    ps = prompts(6)
    one = eng.generate(reqs(ps, 24), GREEDY)
    resp = [[] for _ in ps]
    lps = [[] for _ in ps]
    for _ in range(4):
        live = [i for i in range(len(ps)) if len(resp[i]) < 24 and not (resp[i] and resp[i][-1] == EOS)]
        out = eng.generate([GenerationRequest(i, ps[i], resp[i], 6, seed=i) for i in live], GREEDY)
        for i, r in zip(live, out):
            resp[i] += r.token_ids
            lps[i] += r.logprobs
    for i, r in enumerate(one):
        assert resp[i] == r.token_ids
        assert lps[i] == pytest.approx(r.logprobs, abs=1e-5)


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_logprobs_equal_full_forward(model, backend):
    eng = HFEngine(model, EOS, PAD, backend=backend)
    sp = SamplingParams(temperature=0.7, seed=3)
    ps = prompts(5, seed=1)
    prefixes = [[], [5, 6, 7], [], list(range(10, 30)), [9]]
    out = eng.generate(reqs(ps, 16, prefixes), sp)
    for p, pre, r in zip(ps, prefixes, out):
        ref = torch.log_softmax(full_logits(model, p + pre, r.token_ids) / 0.7, dim=-1)
        ref_lp = ref.gather(-1, torch.tensor(r.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(r.logprobs), ref_lp, atol=1e-5, rtol=0)


def allowed_sets(logits: torch.Tensor, top_k: int, top_p: float, margin: float) -> torch.Tensor:
    """[T, V] bool: tokens allowed by top-k then top-p, with a tolerance ``margin`` on the p edge."""
    probs = torch.softmax(logits.double(), dim=-1)
    vals, idx = probs.sort(dim=-1, descending=True)
    keep = torch.ones_like(vals, dtype=torch.bool)
    if top_k > 0:
        keep[:, top_k:] = False
        vals = vals * keep
        vals = vals / vals.sum(-1, keepdim=True)
    if top_p < 1.0:
        before = vals.cumsum(-1) - vals
        keep &= before < top_p + margin
    out = torch.zeros_like(keep)
    out.scatter_(-1, idx, keep)
    return out


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (-1, 0.6), (8, 0.7)])
def test_top_k_top_p_respected(model, top_k, top_p):
    eng = HFEngine(model, EOS, PAD)
    sp = SamplingParams(temperature=1.3, top_k=top_k, top_p=top_p, seed=11)
    ps = prompts(4, seed=2)
    rs = [GenerationRequest(i, ps[i % 4], [], 12, seed=100 + i) for i in range(48)]
    out = eng.generate(rs, sp)
    draws = 0
    distinct = set()
    for q, r in zip(rs, out):
        ok = allowed_sets(full_logits(model, q.prompt_ids, r.token_ids) / 1.3, top_k, top_p, margin=1e-6)
        toks = torch.tensor(r.token_ids)
        assert ok.gather(-1, toks[:, None]).all(), "a sampled token lies outside the allowed set"
        draws += len(r.token_ids)
        distinct.update(zip(range(len(r.token_ids)), r.token_ids))
    assert draws > 400
    assert len(distinct) > 40  # really sampling, not collapsing to greedy


def test_sampling_frequencies_match_distribution():
    from ulorl.rollout.engines.sampling import counter_uniforms, sample_tokens

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]]).expand(20000, 5)
    u = torch.from_numpy(counter_uniforms(list(range(20000)), [0] * 20000, 1)[:, 0])
    tok, lp = sample_tokens(logits, SamplingParams(temperature=1.0), u)
    freq = torch.bincount(tok, minlength=5).double() / 20000
    p = torch.softmax(logits[0].double(), -1)
    assert torch.allclose(freq, p, atol=0.012)
    assert torch.allclose(lp, torch.log_softmax(logits[0], -1)[tok], atol=1e-6)
    tk, _ = sample_tokens(logits, SamplingParams(temperature=1.0, top_k=2), u)
    assert set(tk.tolist()) == {0, 1}
    freq2 = torch.bincount(tk, minlength=5).double()[:2] / 20000
    assert torch.allclose(freq2, p[:2] / p[:2].sum(), atol=0.012)


def test_counter_uniforms_are_a_pure_function_of_seed_and_position():
    from ulorl.rollout.engines.sampling import counter_uniforms

    a = counter_uniforms([7, 8], [0, 3], 6)
    b = counter_uniforms([8], [5], 4)          # seed 8 from position 5 = a[1, 2:]
    assert (a[1, 2:] == b[0]).all()
    assert ((a >= 0) & (a < 1)).all()
    many = counter_uniforms(list(range(1000)), [0] * 1000, 8)
    assert abs(many.mean() - 0.5) < 0.01 and abs(many.var() - 1 / 12) < 0.005


def test_eos_stops_a_row(model):
    ps = prompts(3, seed=4)
    probe = HFEngine(model, 10**6, PAD).generate(reqs(ps, 12), GREEDY)  # an id never produced
    toks = probe[0].token_ids
    k = next(i for i in range(2, 12) if toks[i] not in toks[:i])
    eos = toks[k]
    for batching in ("static", "compact"):
        out = HFEngine(model, eos, PAD, batching=batching).generate(reqs(ps, 12), GREEDY)
        assert out[0].token_ids == toks[: k + 1] and out[0].finish_reason == "eos"
        for p, r in zip(probe[1:], out[1:]):
            cut = p.token_ids.index(eos) + 1 if eos in p.token_ids else 12
            assert r.token_ids == p.token_ids[:cut]
            assert r.finish_reason == ("eos" if eos in p.token_ids else "length")
    # several EOS ids
    out = HFEngine(model, [10**6, eos], PAD).generate(reqs(ps[:1], 12), GREEDY)
    assert out[0].finish_reason == "eos" and out[0].token_ids[-1] == eos


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_left_padding_mixed_lengths_equals_unbatched(model, backend):
    eng = HFEngine(model, EOS, PAD, backend=backend, batching="compact")
    ps = prompts(7, seed=5, lo=1, hi=40)
    prefixes = [[], [3] * 9, [], [4, 5], [], [6] * 30, []]
    batched = eng.generate(reqs(ps, 10, prefixes), GREEDY)
    for i, r in enumerate(batched):
        alone = eng.generate([GenerationRequest(i, ps[i], prefixes[i], 10, seed=i)], GREEDY)[0]
        assert r.token_ids == alone.token_ids
        assert r.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    # the model's own generate agrees on an unpadded prompt
    with torch.no_grad():
        ref = model.generate(torch.tensor([ps[0]]), max_new_tokens=10, do_sample=False,
                             eos_token_id=None, pad_token_id=PAD)[0, len(ps[0]):].tolist()
    assert batched[0].token_ids == ref


def test_same_seed_same_output_regardless_of_batch_and_regime(model):
    sp = SamplingParams(temperature=1.0, seed=5)
    ps = prompts(6, seed=6)
    a = HFEngine(model, EOS, PAD, batching="compact").generate(reqs(ps, 16), sp)
    b = HFEngine(model, EOS, PAD, batching="static").generate(reqs(ps, 16), sp)
    c = HFEngine(model, EOS, PAD, max_batch_rows=2).generate(list(reversed(reqs(ps, 16))), sp)[::-1]
    assert [r.token_ids for r in a] == [r.token_ids for r in b] == [r.token_ids for r in c]
    d = HFEngine(model, EOS, PAD).generate(reqs(ps, 16, seeds=[s + 50 for s in range(6)]), sp)
    assert [r.token_ids for r in a] != [r.token_ids for r in d]
    e = HFEngine(model, EOS, PAD).generate(reqs(ps, 16), SamplingParams(temperature=1.0, seed=6))
    assert [r.token_ids for r in a] != [r.token_ids for r in e]


def test_update_weights_changes_outputs(model):
    m = build(seed=0)
    eng = HFEngine(m, EOS, PAD)
    ps = prompts(4, seed=7)
    before = eng.generate(reqs(ps, 12), GREEDY)
    m2 = build(seed=1)
    eng.update_weights(m2.state_dict(), version=3)
    assert eng.policy_version == 3
    after = eng.generate(reqs(ps, 12), GREEDY)
    assert [r.token_ids for r in before] != [r.token_ids for r in after]
    fresh = HFEngine(m2, EOS, PAD).generate(reqs(ps, 12), GREEDY)
    assert [r.token_ids for r in after] == [r.token_ids for r in fresh]
    # in-place training step on the shared model, then update with its own tensors
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    eng.update_weights(m.state_dict(), version=4)
    assert eng.generate(reqs(ps, 12), GREEDY) == HFEngine(m, EOS, PAD).generate(reqs(ps, 12), GREEDY)


def test_static_costs_every_slot_compact_does_not(model):
    ps = prompts(8, seed=8)
    probe = HFEngine(model, 10**6, PAD).generate(reqs(ps, 20), GREEDY)
    eos = probe[0].token_ids[2]            # row 0 stops by step 3, others later or never
    st = HFEngine(model, eos, PAD, batching="static")
    co = HFEngine(model, eos, PAD, batching="compact", compact_min_frac=0.1)
    a, b = st.generate(reqs(ps, 20), GREEDY), co.generate(reqs(ps, 20), GREEDY)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    lens = [len(r.token_ids) for r in a]
    s1, s2 = st.last_stats, co.last_stats
    assert s1.useful_tokens == s2.useful_tokens == sum(lens)
    assert s1.row_slots == 8 * max(lens)
    assert s1.decode_iterations == max(lens) and s1.forwards == max(lens) - 1
    if min(lens) < max(lens):
        assert s2.row_slots < s1.row_slots and s2.compactions >= 1
    assert s1.batch_rows == 8 and s1.prefill_tokens == sum(len(p) for p in ps)


@pytest.mark.parametrize("batching", ["static", "compact"])
def test_buckets_and_compaction_keep_every_row_exact(model, batching):
    ps = prompts(10, seed=13, lo=2, hi=50)
    sp = SamplingParams(temperature=1.1, seed=2)
    probe = HFEngine(model, 10**6, PAD).generate(reqs(ps, 14), sp)
    counts: dict[int, int] = {}
    for r in probe:                              # the most frequent early token: several rows stop
        for t in r.token_ids[1:8]:
            counts[t] = counts.get(t, 0) + 1
    eos = max(counts, key=counts.get)
    eng = HFEngine(model, eos, PAD, batching=batching, max_buckets=4, bucket_overhead=0.0,
                   compact_min_frac=0.05)
    out = eng.generate(reqs(ps, 14), sp)
    assert eng.last_stats.buckets >= 3
    if batching == "compact":
        assert eng.last_stats.compactions >= 1
    for i, r in enumerate(out):
        alone = HFEngine(model, eos, PAD).generate([GenerationRequest(i, ps[i], [], 14, seed=i)], sp)[0]
        assert r.token_ids == alone.token_ids and r.finish_reason == alone.finish_reason
        assert r.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    assert 1 < len({len(r.token_ids) for r in out})


def test_shared_prompt_is_prefilled_once(model):
    ps = prompts(2, seed=9)
    rs = [GenerationRequest(i, ps[i // 4], [], 5, seed=i) for i in range(8)]
    eng = HFEngine(model, EOS, PAD)
    eng.generate(rs, SamplingParams(temperature=1.0))
    assert eng.last_stats.prefill_tokens == len(ps[0]) + len(ps[1])
    assert eng.last_stats.context_tokens == 4 * (len(ps[0]) + len(ps[1]))


def test_prefix_forest_hand_example():
    nodes = prefix_forest([[1, 2, 3], [1, 2, 4], [5], [1, 2]])
    spans = sorted((n.start, n.end, n.level, sorted(n.ends)) for n in nodes)
    assert spans == [(0, 1, 0, [2]), (0, 2, 0, [3]), (2, 3, 1, [0]), (2, 3, 1, [1])]
    by_span = {(n.start, n.end, tuple(n.ends)): n for n in nodes}
    root = nodes.index(by_span[(0, 2, (3,))])
    assert by_span[(2, 3, (0,))].parent == root and by_span[(2, 3, (1,))].parent == root
    with pytest.raises(ValueError):
        prefix_forest([[1], []])


def test_shared_prefixes_prefilled_once_results_unchanged(model):
    p = prompts(1, seed=12)[0]
    prefixes = [[7, 8, 9, 10], [7, 8, 9, 11], [7, 8], [12], [7, 8, 9, 10]]
    rs = [GenerationRequest(i, p, pre, 6, seed=i) for i, pre in enumerate(prefixes)]
    eng = HFEngine(model, EOS, PAD, share_min_tokens=0)
    out = eng.generate(rs, GREEDY)
    # forest: p -> {[7, 8] -> [9] -> {[10], [11]}, [12]}; the duplicate context costs nothing
    assert eng.last_stats.prefill_tokens == len(p) + 2 + 1 + 1 + 1 + 1
    for q, r in zip(rs, out):
        alone = eng.generate([q], GREEDY)[0]
        assert r.token_ids == alone.token_ids
        assert r.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    # by default a prefix is shared only where that saves >= 64 prefill tokens: not here (3 x 13)
    eng2 = HFEngine(model, EOS, PAD)
    out2 = eng2.generate(rs, GREEDY)
    assert [r.token_ids for r in out2] == [r.token_ids for r in out]
    assert eng2.last_stats.prefill_tokens == sum(len(p) + len(pre) for pre in prefixes[:4])


def test_share_plan_dissolves_small_shared_nodes():
    from ulorl.rollout.engines.hf import share_plan

    ctxs = [[1, 2, 3] + [5] * 40 + [6], [1, 2, 3] + [5] * 40 + [7], [1, 9]]
    full = prefix_forest(ctxs)
    # [1] shared by 3 contexts saves 2 tokens: dissolved; [2, 3, 5 x 40] shared by 2 saves 42
    plan = share_plan(full, 3, min_saving=20)
    spans = sorted((n.start, n.end, n.parent >= 0) for n in plan)
    assert spans == [(0, 2, False), (0, 43, False), (43, 44, True), (43, 44, True)]
    assert sum(n.end - n.start for n in plan) == 2 + 43 + 1 + 1
    assert len(share_plan(full, 3, min_saving=0)) == len(full)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_other_llama_family_models_use_the_fast_path(kind):
    m = build(kind)
    fast = HFEngine(m, EOS, PAD)
    assert fast.backend == "fast"
    ps = prompts(3, seed=10)
    a = fast.generate(reqs(ps, 8, [[], [7, 8], []]), GREEDY)
    b = HFEngine(m, EOS, PAD, backend="hf").generate(reqs(ps, 8, [[], [7, 8], []]), GREEDY)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]


def test_plan_buckets_hand_example():
    # 4 short rows and 2 long rows: splitting saves 4 * (100 - 10) columns, far more than 256
    assert plan_buckets([10, 10, 10, 10, 100, 100], decode_len=0, overhead=256) == [(0, 4), (4, 6)]
    # a split that saves less than the per-bucket overhead is not made
    assert plan_buckets([10, 12], decode_len=0, overhead=256) == [(0, 2)]
    assert plan_buckets([], 8) == []
    with pytest.raises(ValueError):
        plan_buckets([3, 2], 8)


def test_request_edge_cases(model):
    eng = HFEngine(model, EOS, PAD)
    out = eng.generate([GenerationRequest(4, [5, 6], [], 0), GenerationRequest(5, [7], [], 1)], GREEDY)
    assert out[0].token_ids == [] and out[0].finish_reason == "length" and out[0].request_id == 4
    assert len(out[1].token_ids) == 1
    with pytest.raises(ValueError, match="empty prompt"):
        eng.generate([GenerationRequest(0, [], [], 3)], GREEDY)
    with pytest.raises(ValueError, match="batching"):
        HFEngine(model, EOS, PAD, batching="dynamic")
    assert isinstance(eng, Engine)


def test_make_engine_dispatch(model, monkeypatch):
    from ulorl.config import RolloutConfig

    class Tok:
        eos_token_id, pad_token_id = EOS, PAD

    eng = make_engine(RolloutConfig(engine="hf", batching="static"), model, Tok())
    assert isinstance(eng, HFEngine) and eng.batching == "static" and eng.eos_token_id == EOS
    monkeypatch.setitem(sys.modules, "vllm", None)  # make `import vllm` fail deterministically
    with pytest.raises(MissingExtraError, match=r"pip install 'ulorl\[gpu\]'"):
        make_engine(RolloutConfig(engine="vllm"), model, Tok())
    assert isinstance(vllm_available(), bool)


@pytest.mark.parametrize("sp", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, greedy=True),
                                SamplingParams(top_p=0.0), SamplingParams(top_p=1.5), SamplingParams(top_k=-2)])
def test_invalid_sampling_refused_before_decoding(model, sp):
    """The checks vLLM's mapping makes (tests/test_vllm_mapping.py), one function for both engines:
    greedy at temperature 0 is refused too (its log-probs would be log_softmax(logits / 0))."""
    with pytest.raises(ValueError, match=r"sampling\.(temperature|top_p|top_k)"):
        HFEngine(model, EOS, PAD).generate(reqs(prompts(1), 4), sp)
