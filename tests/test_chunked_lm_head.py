"""Chunked log-probs / entropy from hidden states (``ulorl.algo.chunked_lm_head``, ``ulorl.train.forward``)
against the full-logits path: values and gradients within 1e-5 in float32, with temperature,
padding and labels < 0; on tiny tensors and on a tiny Qwen3 (tied and untied embeddings)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ulorl.algo import logprobs_and_entropy
from ulorl.algo.chunked_lm_head import logprobs_from_hidden
from ulorl.rollout.types import Sample, SampleStatus, SegmentSpan
from ulorl.train.batch import build_train_batch
from ulorl.train.forward import token_stats

TOL = dict(atol=1e-5, rtol=1e-5)


def _ref(h: torch.Tensor, w: torch.Tensor, b, labels: torch.Tensor, t: float):
    """Full [.., V] reference: log-probs and entropy of softmax((h W^T + b) / t), both differentiable."""
    logp_all = torch.log_softmax(torch.nn.functional.linear(h, w, b) / t, dim=-1)
    valid = labels >= 0
    lp = logp_all.gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return torch.where(valid, lp, 0.0), torch.where(valid, ent, 0.0)


@pytest.mark.parametrize("chunk", [1, 3, None])
def test_values_and_gradients_match_full_logits(chunk):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 5, 4, generator=g, requires_grad=True)
    w = torch.randn(11, 4, generator=g, requires_grad=True)
    b = torch.randn(11, generator=g, requires_grad=True)
    labels = torch.randint(0, 11, (2, 5), generator=g)
    labels[0, 0] = -100
    labels[1, 3:] = -1  # padding
    c_lp, c_ent = torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g)

    lp, ent = logprobs_from_hidden(h, w, labels, temperature=0.7, bias=b, chunk_tokens=chunk)
    grads = torch.autograd.grad((lp * c_lp).sum() + (ent * c_ent).sum(), (h, w, b))
    rlp, rent = _ref(h, w, b, labels, 0.7)
    rgrads = torch.autograd.grad((rlp * c_lp).sum() + (rent * c_ent).sum(), (h, w, b))

    torch.testing.assert_close(lp, rlp, **TOL)
    torch.testing.assert_close(ent, rent, **TOL)
    assert lp[0, 0] == 0 and ent[1, 4] == 0  # skipped positions
    for got, want in zip(grads, rgrads):
        torch.testing.assert_close(got, want, **TOL)
    # the skipped positions get no gradient at all
    assert grads[0][0, 0].abs().sum() == 0 and grads[0][1, 3:].abs().sum() == 0


def test_matches_the_logits_path_logprobs_and_entropy():
    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(7, 6, generator=g), torch.randn(13, 6, generator=g)
    labels = torch.randint(0, 13, (7,), generator=g)
    lp, ent = logprobs_from_hidden(h, w, labels, temperature=1.3, chunk_tokens=2)
    flp, fent = logprobs_and_entropy(h @ w.T, labels, temperature=1.3)
    torch.testing.assert_close(lp, flp, **TOL)
    torch.testing.assert_close(ent, fent, **TOL)


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(2)
    h = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 5, -100, 2, 3])

    def f(hh, ww):
        lp, ent = logprobs_from_hidden(hh, ww, labels, temperature=0.9, chunk_tokens=2)
        return lp, ent

    assert torch.autograd.gradcheck(f, (h, w))


def test_tied_weight_gets_both_gradients():
    """One Parameter used as input embedding and as LM head: grads of both uses accumulate."""
    g = torch.Generator().manual_seed(3)
    emb = torch.randn(9, 4, generator=g, requires_grad=True)
    ids = torch.tensor([1, 4, 7, 2])
    labels = torch.tensor([4, 7, 2, -100])
    lp, _ = logprobs_from_hidden(torch.tanh(emb[ids]), emb, labels, chunk_tokens=3)
    (gc,) = torch.autograd.grad(lp.sum(), emb)
    rlp, _ = _ref(torch.tanh(emb[ids]), emb, None, labels, 1.0)
    (gr,) = torch.autograd.grad(rlp.sum(), emb)
    torch.testing.assert_close(gc, gr, **TOL)


def test_bf16_autocast_is_close_to_the_autocast_logits_path():
    g = torch.Generator().manual_seed(4)
    h, w = torch.randn(6, 8, generator=g), torch.randn(17, 8, generator=g)
    labels = torch.randint(0, 17, (6,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = logprobs_from_hidden(h, w, labels, chunk_tokens=4)
        logits = torch.nn.functional.linear(h, w)
    assert logits.dtype == torch.bfloat16 and lp.dtype == torch.float32
    flp, fent = logprobs_and_entropy(logits, labels)
    torch.testing.assert_close(lp, flp, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(ent, fent, atol=1e-2, rtol=1e-2)


def test_bad_labels_are_refused():
    with pytest.raises(ValueError, match="labels shape"):
        logprobs_from_hidden(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        logprobs_from_hidden(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(2))


def _tiny(tied: bool) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      max_position_embeddings=64, tie_word_embeddings=tied)
    return Qwen3ForCausalLM(cfg).float()


def _padded_batch():
    def s(i: int, prompt: list[int], resp: list[int]) -> Sample:
        out = Sample(sample_id=i, group_id=0, prompt_ids=prompt, response_ids=resp,
                     sampling_logprobs=[0.0] * len(resp), status=SampleStatus.FINISHED, reward=1.0)
        out.segments = [SegmentSpan(0, len(resp), 0)]
        return out

    return build_train_batch([s(0, [3, 5, 7], [11, 13, 17, 19, 23]), s(1, [2], [29, 31])], pad_token_id=0)


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_model_chunked_equals_full(tied):
    model = _tiny(tied)
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    batch = _padded_batch()
    dev = torch.device("cpu")
    params = [p for p in model.parameters() if p.requires_grad]
    lp_c, ent_c = token_stats(model, batch, 0.85, dev, path="chunked", chunk_tokens=3)
    g_c = torch.autograd.grad(lp_c.sum(), params, allow_unused=True)
    lp_f, ent_f = token_stats(model, batch, 0.85, dev, path="full")
    g_f = torch.autograd.grad(lp_f.sum(), params, allow_unused=True)
    mask = batch.response_mask
    torch.testing.assert_close(lp_c, lp_f, **TOL)
    torch.testing.assert_close(ent_c * mask, ent_f.detach() * mask, **TOL)
    assert (lp_c[~mask] == 0).all()
    for a, b in zip(g_c, g_f):
        if b is None:
            assert a is None or a.abs().sum() == 0
        else:
            torch.testing.assert_close(a, b, **TOL)


def test_forward_saves_no_token_by_vocab_tensor():
    """Autograd keeps only [N, H], [V, H] and per-token tensors for backward, never [N, V]."""
    n, hdim, vocab = 64, 8, 1000
    h = torch.randn(n, hdim, requires_grad=True)
    w = torch.randn(vocab, hdim, requires_grad=True)
    labels = torch.randint(0, vocab, (n,))
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, ent = logprobs_from_hidden(h, w, labels, chunk_tokens=8)
        (lp.sum() + ent.sum()).backward()
    assert saved and max(saved) <= vocab * hdim


def test_logprobs_only_pass_has_the_same_gradient():
    g = torch.Generator().manual_seed(5)
    h = torch.randn(6, 4, generator=g, requires_grad=True)
    w = torch.randn(9, 4, generator=g, requires_grad=True)
    labels = torch.tensor([1, 2, -100, 4, 5, 8])
    lp, ent = logprobs_from_hidden(h, w, labels, 0.8, chunk_tokens=4, with_entropy=False)
    assert (ent == 0).all() and not ent.requires_grad
    got = torch.autograd.grad(lp.sum(), (h, w))
    rlp, _ = _ref(h, w, None, labels, 0.8)
    want = torch.autograd.grad(rlp.sum(), (h, w))
    torch.testing.assert_close(lp, rlp, **TOL)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)


def test_bf16_weight_gradient_accumulates_in_float32_over_many_chunks():
    """A bf16 head over 4,096 one-token chunks: every token adds a same-sign term (1 - p) h to
    grad W[label], ~2,000 in all. A bf16 running sum stalls once it reaches a few hundred (its
    spacing there exceeds the terms); the float32 accumulator keeps the float32 reference within
    the final bf16 rounding (2^-8 relative)."""
    g = torch.Generator().manual_seed(7)
    n, hdim, vocab = 4096, 4, 5
    h32 = torch.rand(n, hdim, generator=g) + 0.5          # positive: the terms of grad W[0] never cancel
    w32 = torch.randn(vocab, hdim, generator=g) * 0.1
    labels = torch.zeros(n, dtype=torch.long)
    w = w32.to(torch.bfloat16).requires_grad_(True)
    lp, _ = logprobs_from_hidden(h32.to(torch.bfloat16), w, labels, chunk_tokens=1)
    (gw,) = torch.autograd.grad(lp.sum(), w)
    assert gw.dtype == torch.bfloat16
    wr = w.detach().float().requires_grad_(True)          # same bf16 values, float32 math
    rlp, _ = _ref(h32.to(torch.bfloat16).float(), wr, None, labels, 1.0)
    (gr,) = torch.autograd.grad(rlp.sum(), wr)
    assert float(gr[0].min()) > 1000                       # the sums a bf16 accumulator cannot reach
    torch.testing.assert_close(gw.float(), gr, atol=1e-3, rtol=2**-7)
    # what a bf16 running sum of the same per-token terms gives: far off (the test can fail)
    p0 = torch.softmax(h32.to(torch.bfloat16).float() @ wr.detach().t(), dim=-1)[:, 0]
    acc = torch.zeros(hdim, dtype=torch.bfloat16)
    for t in range(n):
        acc += ((1 - p0[t]) * h32[t].to(torch.bfloat16).float()).to(torch.bfloat16)
    assert float(((acc.float() - gr[0]).abs() / gr[0]).max()) > 0.1


def test_call_with_forward_runs_the_module_hooks_around_the_body_and_restores_forward():
    from ulorl.algo.chunked_lm_head import call_with_forward

    lin = torch.nn.Linear(3, 2)
    calls: list[str] = []
    lin.register_forward_pre_hook(lambda m, a: calls.append("pre"))
    lin.register_forward_hook(lambda m, a, o: calls.append("post"))
    x = torch.randn(4, 3)
    assert call_with_forward(lin, lambda h: ("body", tuple(h.shape)), x) == ("body", (4, 3))
    assert calls == ["pre", "post"] and "forward" not in lin.__dict__
    torch.testing.assert_close(lin(x), x @ lin.weight.T + lin.bias)

    def boom(h: torch.Tensor) -> None:
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        call_with_forward(lin, boom, x)
    assert "forward" not in lin.__dict__


def test_through_root_runs_the_body_directly_for_a_plain_model():
    from ulorl.train.forward import through_root

    model = torch.nn.Linear(2, 2)
    model.forward = lambda *a, **k: (_ for _ in ()).throw(AssertionError("the model must not be called"))
    assert through_root(model, lambda: 7) == 7
