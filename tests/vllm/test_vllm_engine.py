"""VLLMEngine on a tiny random Qwen3 (float32, CPU): agreement with the HF engine and with a
plain transformers forward, segment continuation, sampling mapping, finish reasons, prefix
cache and in-place weight updates. Run with ``.venv-vllm/bin/pytest tests/vllm``.
"""

from __future__ import annotations

import pytest
import torch

from vllm_tiny import EOS_PROMPT, MAX_MODEL_LEN
from ulorl.rollout.types import Engine, GenerationRequest, SamplingParams

LP_TOL = 1e-3          # acceptance: vLLM vs HF log-probs
GREEDY = SamplingParams(temperature=0.85, greedy=True)


def _requests(n: int, new_tokens: int, seed: int = 1, first_id: int = 0) -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(seed)
    reqs = [GenerationRequest(first_id + i, torch.randint(3, 512, (4 + 9 * i,), generator=g).tolist(), [], new_tokens, seed=i)
            for i in range(n)]
    reqs.append(GenerationRequest(first_id + n, list(EOS_PROMPT), [], new_tokens, seed=n))
    return reqs


def _max_lp_diff(a, b) -> float:
    return max((abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra.logprobs, rb.logprobs)), default=0.0)


@torch.no_grad()
def _forward_logprobs(model, context: list[int], tokens: list[int], temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced ``log_softmax(logits / T)`` [n, V] at the positions that produced ``tokens``,
    and the log-probs of ``tokens`` [n]."""
    ids = torch.tensor([context + tokens])
    logits = model(ids).logits[0, len(context) - 1:-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp, logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def test_engine_protocol_and_isolation(vllm_engine, tiny_model_dir):
    assert isinstance(vllm_engine, Engine)
    assert vllm_engine.eos_token_id == tiny_model_dir[1]
    assert vllm_engine.policy_version == 0
    # vLLM's CPU worker rebinds torch threads; it must do so in its own process, not in ours.
    assert torch.get_num_threads() == vllm_engine.main_threads_before
    print(f"vLLM start-up {vllm_engine.startup_s:.1f} s")


def test_greedy_matches_hf_token_for_token(vllm_engine, hf_engine, tiny_model_dir):
    reqs = _requests(7, 40)
    rv = vllm_engine.generate(reqs, GREEDY)
    rh = hf_engine.generate(reqs, GREEDY)
    assert [r.request_id for r in rv] == [q.request_id for q in reqs]
    for a, b in zip(rv, rh):
        assert a.token_ids == b.token_ids, f"request {a.request_id}"
        assert a.finish_reason == b.finish_reason
        assert len(a.logprobs) == len(a.token_ids)
    diff = _max_lp_diff(rv, rh)
    print(f"greedy: {sum(len(r.token_ids) for r in rv)} tokens equal, max |lp diff| {diff:.2e}")
    assert diff < LP_TOL
    # the EOS prompt stops on EOS, which is kept as the last token
    eos_res = rv[-1]
    assert eos_res.finish_reason == "eos" and eos_res.token_ids[-1] == tiny_model_dir[1]
    assert tiny_model_dir[1] not in eos_res.token_ids[:-1]
    assert any(r.finish_reason == "length" and len(r.token_ids) == 40 for r in rv)
    st = vllm_engine.last_stats
    assert st.batch_rows == len(reqs) and st.useful_tokens == sum(len(r.token_ids) for r in rv)
    assert st.prefill_tokens + vllm_engine.last_cached_tokens == sum(len(q.prompt_ids) for q in reqs)


def test_greedy_logprobs_are_temperature_scaled(vllm_engine, hf_model):
    req = _requests(1, 24)[0]
    for temp in (0.6, 1.0):
        r = vllm_engine.generate([req], SamplingParams(temperature=temp, greedy=True))[0]
        logp, lp = _forward_logprobs(hf_model, req.prompt_ids, r.token_ids, temp)
        assert r.token_ids == logp.argmax(-1).tolist()
        assert torch.allclose(torch.tensor(r.logprobs), lp, atol=LP_TOL, rtol=0)


def test_segment_continuation_equals_one_shot(vllm_engine):
    reqs = _requests(5, 48)[:-1]                  # no EOS prompt: every row runs 48 tokens
    one = vllm_engine.generate(reqs, GREEDY)
    assert all(r.finish_reason == "length" for r in one)
    prefix = {q.request_id: [] for q in reqs}
    lps = {q.request_id: [] for q in reqs}
    for _ in range(3):                             # 3 segments of 16, context = prompt + prefix ids
        seg = [GenerationRequest(q.request_id, q.prompt_ids, list(prefix[q.request_id]), 16, seed=q.seed) for q in reqs]
        for r in vllm_engine.generate(seg, GREEDY):
            prefix[r.request_id] += r.token_ids
            lps[r.request_id] += r.logprobs
    for r in one:
        assert prefix[r.request_id] == r.token_ids
        assert max(abs(x - y) for x, y in zip(lps[r.request_id], r.logprobs)) < 1e-4


@pytest.mark.parametrize("temp,top_k,top_p", [(0.7, 5, 1.0), (1.0, -1, 0.6), (1.3, 8, 0.8), (1.3, -1, 1.0)])
def test_sampled_logprobs_untruncated_and_truncation_respected(vllm_engine, hf_model, temp, top_k, top_p):
    """Returned log-probs = log_softmax(logits / T) of the full vocabulary (before top-k / top-p),
    and each sampled token lies inside the top-k / top-p set."""
    reqs = _requests(6, 24)
    sp = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, seed=7)
    worst = 0.0
    for q, r in zip(reqs, vllm_engine.generate(reqs, sp)):
        logp, lp = _forward_logprobs(hf_model, q.prompt_ids, r.token_ids, temp)
        worst = max(worst, (lp - torch.tensor(r.logprobs)).abs().max().item())
        rank = (logp > lp[:, None]).sum(-1)               # 0 = most likely token
        if top_k > 0:
            assert int(rank.max()) < top_k
        if top_p < 1.0:
            k = top_k if top_k > 0 else logp.shape[-1]
            top = torch.topk(logp, k, dim=-1).values.double().exp()
            probs = top / top.sum(-1, keepdim=True)
            mass_before = (probs.cumsum(-1) - probs).gather(-1, rank[:, None]).squeeze(-1)
            assert bool((mass_before < top_p + 1e-6).all())
    print(f"T={temp} top_k={top_k} top_p={top_p}: max |lp - forward| {worst:.2e}")
    assert worst < LP_TOL


def test_top_k_one_and_tiny_top_p_give_the_greedy_tokens(vllm_engine):
    reqs = _requests(4, 20)
    greedy = vllm_engine.generate(reqs, GREEDY)
    for sp in (SamplingParams(temperature=0.85, top_k=1, seed=3), SamplingParams(temperature=0.85, top_p=1e-6, seed=3)):
        got = vllm_engine.generate(reqs, sp)
        assert [r.token_ids for r in got] == [r.token_ids for r in greedy]


def test_seeds_make_sampling_reproducible(vllm_engine):
    reqs = _requests(4, 24)[:-1]
    sp = SamplingParams(temperature=1.2, seed=11)
    a = vllm_engine.generate(reqs, sp)
    b = vllm_engine.generate(list(reversed(reqs)), sp)[::-1]      # order / batch position does not matter
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    same_prompt = [GenerationRequest(i, reqs[0].prompt_ids, [], 24, seed=i) for i in range(4)]
    outs = {tuple(r.token_ids) for r in vllm_engine.generate(same_prompt, sp)}
    assert len(outs) == 4, "different request seeds must give different samples"
    c = vllm_engine.generate(reqs, SamplingParams(temperature=1.2, seed=12))
    assert [r.token_ids for r in c] != [r.token_ids for r in a]


def test_finish_reasons_under_sampling(vllm_engine, tiny_model_dir):
    eos = tiny_model_dir[1]
    reqs = [GenerationRequest(i, list(EOS_PROMPT), [], 30, seed=i) for i in range(32)]
    res = vllm_engine.generate(reqs, SamplingParams(temperature=0.5, seed=1))
    reasons = {r.finish_reason for r in res}
    assert reasons == {"eos", "length"}, reasons
    for r in res:
        if r.finish_reason == "eos":
            assert r.token_ids[-1] == eos and eos not in r.token_ids[:-1] and len(r.token_ids) <= 30
        else:
            assert len(r.token_ids) == 30 and eos not in r.token_ids


def test_prefix_cache_shared_within_a_step_and_reset_after_update(vllm_engine, hf_model):
    # CPU vLLM caches full blocks of 128 tokens: a 300-token prompt has two cacheable blocks.
    prompt = torch.randint(3, 512, (300,), generator=torch.Generator().manual_seed(5)).tolist()
    group = [GenerationRequest(i, prompt, [], 4, seed=i) for i in range(4)]   # G = 4 samples of one prompt
    sp = SamplingParams(temperature=1.0, seed=2)
    vllm_engine.update_weights(hf_model.state_dict(), vllm_engine.policy_version)   # start from an empty cache
    vllm_engine.generate(group, sp)
    within = vllm_engine.last_cached_tokens
    vllm_engine.generate(group[:1], sp)
    across = vllm_engine.last_cached_tokens
    vllm_engine.update_weights(hf_model.state_dict(), vllm_engine.policy_version)
    vllm_engine.generate(group[:1], sp)
    after_update = vllm_engine.last_cached_tokens
    print(f"cached prompt tokens: within a step {within}, next call {across}, after update {after_update}")
    assert within >= 3 * 256          # samples 2..4 reuse the first sample's two full blocks
    assert across == 256
    assert after_update == 0


def test_without_the_reset_stale_prefix_blocks_would_be_reused(vllm_engine, hf_model):
    """Negative control for the reset in ``update_weights``: reloading weights WITHOUT it makes
    vLLM reuse KV blocks computed under the old weights (wrong log-probs); with it, they agree."""
    from ulorl.rollout.engines.vllm_ext import RELOAD_METHOD, state_dict_to_bytes

    prompt = torch.randint(3, 512, (300,), generator=torch.Generator().manual_seed(6)).tolist()
    req = GenerationRequest(0, prompt, [], 8, seed=0)
    original = {k: v.clone() for k, v in hf_model.state_dict().items()}
    g = torch.Generator().manual_seed(7)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in original.items()}
    v0 = vllm_engine.policy_version
    try:
        vllm_engine.generate([req], GREEDY)                            # cache the prompt's blocks
        vllm_engine.llm.collective_rpc(RELOAD_METHOD, args=(state_dict_to_bytes(new),))   # no reset
        stale = vllm_engine.generate([req], GREEDY)[0]
        assert vllm_engine.last_cached_tokens == 256
        hf_model.load_state_dict(new)
        _, lp = _forward_logprobs(hf_model, prompt, stale.token_ids, GREEDY.temperature)
        stale_err = (lp - torch.tensor(stale.logprobs)).abs().max().item()
        vllm_engine.update_weights(new, v0 + 1)                        # reload + reset
        fresh = vllm_engine.generate([req], GREEDY)[0]
        assert vllm_engine.last_cached_tokens == 0
        _, lp = _forward_logprobs(hf_model, prompt, fresh.token_ids, GREEDY.temperature)
        fresh_err = (lp - torch.tensor(fresh.logprobs)).abs().max().item()
        print(f"max |lp - forward| with stale prefix blocks {stale_err:.2e}, after reset {fresh_err:.2e}")
        assert stale_err > 100 * LP_TOL and fresh_err < LP_TOL
    finally:
        vllm_engine.update_weights(original, v0 + 2)
        hf_model.load_state_dict(original)


def test_weight_update_in_place_then_both_engines_agree(vllm_engine, hf_engine, hf_model):
    reqs = _requests(5, 32)
    # a 300-token prompt fills two KV blocks that the prefix cache keeps from the call before the
    # update: reusing them after it would make vLLM disagree with HF
    long_prompt = torch.randint(3, 512, (300,), generator=torch.Generator().manual_seed(8)).tolist()
    reqs.append(GenerationRequest(99, long_prompt, [], 32, seed=0))
    before = vllm_engine.generate(reqs, GREEDY)
    original = {k: v.clone() for k, v in hf_model.state_dict().items()}
    g = torch.Generator().manual_seed(99)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in original.items()}
    v0 = vllm_engine.policy_version
    try:
        vllm_engine.update_weights(new, v0 + 1)
        hf_engine.update_weights(new, v0 + 1)
        hf_model.load_state_dict(new)
        assert vllm_engine.policy_version == v0 + 1
        print(f"weight update {vllm_engine.last_update_s * 1000:.0f} ms")
        rv = vllm_engine.generate(reqs, GREEDY)
        rh = hf_engine.generate(reqs, GREEDY)
        assert [r.token_ids for r in rv] != [r.token_ids for r in before], "the update changed nothing"
        assert [r.token_ids for r in rv] == [r.token_ids for r in rh]
        diff = _max_lp_diff(rv, rh)
        print(f"after update: max |lp diff| {diff:.2e}")
        assert diff < LP_TOL
    finally:
        vllm_engine.update_weights(original, v0 + 2)
        hf_engine.update_weights(original, v0 + 2)
        hf_model.load_state_dict(original)
    back = vllm_engine.generate(reqs, GREEDY)
    assert [r.token_ids for r in back] == [r.token_ids for r in before]


def test_request_validation(vllm_engine):
    with pytest.raises(ValueError, match="max_model_len"):
        vllm_engine.generate([GenerationRequest(0, [5] * 500, [], MAX_MODEL_LEN)], GREEDY)
    with pytest.raises(ValueError, match="empty"):
        vllm_engine.generate([GenerationRequest(0, [], [], 4)], GREEDY)
    res = vllm_engine.generate([GenerationRequest(3, [5, 6], [7], 0), GenerationRequest(4, [5, 6], [], 2)], GREEDY)
    assert [r.request_id for r in res] == [3, 4]
    assert res[0].token_ids == [] and res[0].finish_reason == "length" and len(res[1].token_ids) == 2


@pytest.mark.slow
def test_engine_from_in_memory_model(hf_model, tiny_model_dir, vllm_engine):
    """A PreTrainedModel is saved to a temporary folder first (a second engine: slow start-up)."""
    from ulorl.rollout.engines.vllm import VLLMEngine

    reqs = _requests(3, 16)
    with VLLMEngine(hf_model, dtype="float32", max_model_len=MAX_MODEL_LEN) as eng:
        assert eng.eos_token_id == tiny_model_dir[1]
        got = eng.generate(reqs, GREEDY)
        tmp = eng.llm_kwargs["model"]     # the temporary folder the in-memory model was saved to
    assert [r.token_ids for r in got] == [r.token_ids for r in vllm_engine.generate(reqs, GREEDY)]
    import os

    assert tmp is not None and not os.path.exists(tmp)


@pytest.mark.parametrize("bucket_mb,transport", [(0.05, "shm"), (1.5, "shm"), (0.3, "inline")])
def test_bucketed_update_matches_hf_with_new_weights(vllm_engine, hf_engine, hf_model, bucket_mb, transport):
    """Streamed update in buckets small enough that q / k / v (one packed vLLM tensor) and
    gate / up straddle buckets: greedy output after the sync equals HF with the new weights."""
    import glob

    from ulorl.rollout.weight_sync import bucket_bytes_from_mb, plan_buckets

    reqs = _requests(5, 32)
    # only this update's files count: another process on the machine (e.g. an engine that crashed mid-update)
    # may have left its own
    shm_before = set(glob.glob("/dev/shm/ulorl-wsync-*"))
    before = vllm_engine.generate(reqs, GREEDY)
    original = {k: v.clone() for k, v in hf_model.state_dict().items()}
    g = torch.Generator().manual_seed(123)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in original.items()}
    v0, saved = vllm_engine.policy_version, vllm_engine.bucket_bytes
    vllm_engine.bucket_bytes = bucket_bytes_from_mb(bucket_mb)
    vllm_engine.weight_sync_transport = transport
    try:
        vllm_engine.update_weights_streamed(iter(new.items()), v0 + 1)   # a lazy stream, like the trainer's
        plan = plan_buckets([t.numel() * t.element_size() for t in new.values()], vllm_engine.bucket_bytes)
        assert vllm_engine.last_update_messages == plan.num_buckets
        assert vllm_engine.last_update_bytes == plan.total_bytes
        if bucket_mb < 1:
            assert plan.num_buckets > 10
        hf_engine.update_weights(new, v0 + 1)
        hf_model.load_state_dict(new)
        rv = vllm_engine.generate(reqs, GREEDY)
        rh = hf_engine.generate(reqs, GREEDY)
        assert [r.token_ids for r in rv] != [r.token_ids for r in before], "the update changed nothing"
        assert [r.token_ids for r in rv] == [r.token_ids for r in rh]
        assert _max_lp_diff(rv, rh) < LP_TOL
        assert not set(glob.glob("/dev/shm/ulorl-wsync-*")) - shm_before, "shared bucket files left behind"
        print(f"bucket {bucket_mb} MiB ({transport}): {plan.num_buckets} messages, {vllm_engine.last_update_s * 1000:.0f} ms")
    finally:
        vllm_engine.bucket_bytes = saved
        vllm_engine.weight_sync_transport = "shm"
        vllm_engine.update_weights(original, v0 + 2)
        hf_engine.update_weights(original, v0 + 2)
        hf_model.load_state_dict(original)
    assert [r.token_ids for r in vllm_engine.generate(reqs, GREEDY)] == [r.token_ids for r in before]


def test_an_update_that_misses_layers_is_refused_not_half_applied(vllm_engine, hf_model):
    """vLLM's layerwise reload keeps a layer's OLD weights when none of its tensors arrive (a log line
    only); the engine reads vLLM's own per-layer bookkeeping and refuses such an update, naming the layers."""
    reqs = _requests(3, 16)
    before = vllm_engine.generate(reqs, GREEDY)
    original = {k: v.clone() for k, v in hf_model.state_dict().items()}
    partial = {k: v + 0.05 for k, v in original.items() if ".layers.1.mlp." not in k}
    v0 = vllm_engine.policy_version
    try:
        with pytest.raises(RuntimeError, match=r"2 of \d+ layers got none of their weights") as exc:
            vllm_engine.update_weights(partial, v0 + 1)
        assert "model.layers.1.mlp.gate_up_proj" in str(exc.value) and "model.layers.1.mlp.down_proj" in str(exc.value)
        assert vllm_engine.policy_version == v0                          # not recorded as updated
    finally:
        vllm_engine.update_weights(original, v0 + 2)
    assert vllm_engine.last_update_layers > 0 and vllm_engine.last_update_partial == []
    assert [r.token_ids for r in vllm_engine.generate(reqs, GREEDY)] == [r.token_ids for r in before]


def test_colocate_and_native_transfer_refused_on_cpu(tiny_model_dir):
    """vLLM's CPU build has no sleep mode and no native weight transfer: the switches say so
    (before any engine process starts)."""
    from ulorl.rollout.engines.vllm import VLLMEngine

    d, eos = tiny_model_dir
    with pytest.raises(ValueError, match="colocate=true needs vLLM sleep mode"):
        VLLMEngine(d, eos_token_id=eos, max_model_len=MAX_MODEL_LEN, colocate=True)
    with pytest.raises(ValueError, match="no native backend moves weights on CPU"):
        VLLMEngine(d, eos_token_id=eos, max_model_len=MAX_MODEL_LEN, weight_transfer="nccl")
