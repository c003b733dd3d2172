"""Warm-start pieces: batching, loss, cache key, build + reuse of a (tiny) cached build."""

from __future__ import annotations

import json
import time

import pytest
import torch

from ulorl.data.task import make_item
from ulorl.models.tiny import build_tiny_model
from ulorl.models.tokenizer import build_tokenizer
from ulorl.models.warmstart import (
    MANIFEST,
    WarmStartConfig,
    batch_loss,
    batch_stream,
    encode_example,
    ensure_warmstart,
    generate_responses,
    group_by_length,
    pad_batch,
    warmstart_dir,
)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_encode_example_masks_response(tok) -> None:
    it = make_item([12, 34], "a")
    ids, mask = encode_example(tok, it)
    n_prompt = len(tok(it.prompt, add_special_tokens=False)["input_ids"])
    assert ids[-1] == tok.eos_token_id
    assert mask == [0] * n_prompt + [1] * (len(ids) - n_prompt)
    assert tok.decode(ids[n_prompt:], skip_special_tokens=True) == "12+34=46\n\\boxed{46}"


def test_pad_batch_and_grouping() -> None:
    exs = [([1, 2, 3], [0, 1, 1]), ([4, 5], [0, 1]), ([6, 7, 8, 9, 10], [0, 0, 1, 1, 1])]
    b = pad_batch(exs, pad_id=0)
    assert b.ids.tolist() == [[1, 2, 3, 0, 0], [4, 5, 0, 0, 0], [6, 7, 8, 9, 10]]
    assert b.loss_mask.tolist() == [[0, 1, 1, 0, 0], [0, 1, 0, 0, 0], [0, 0, 1, 1, 1]]
    assert b.n_real == 10
    # sorted by length 2,3,5; budget 6 padded tokens: [2,3] costs 2x3=6, adding 5 would cost 15
    groups = group_by_length(exs, tokens_per_batch=6)
    assert [[len(e[0]) for e in g] for g in groups] == [[2, 3], [5]]
    assert [[len(e[0]) for e in g] for g in group_by_length(exs, 1)] == [[2], [3], [5]]


def test_batch_loss_equals_per_example_loss(tok) -> None:
    """Right padding + causal attention: the batch loss is the token-weighted mean of the
    per-example losses computed without any padding."""
    model = build_tiny_model(tok, seed=0).eval()
    exs = [encode_example(tok, make_item(t, str(i))) for i, t in enumerate([[12, 34], [10, 20, 30, 40], [55, 66, 77]])]
    with torch.no_grad():
        total = batch_loss(model, pad_batch(exs, tok.pad_token_id))
        num, den = 0.0, 0.0
        for ids, mask in exs:
            logits = model(input_ids=torch.tensor([ids])).logits[0]
            logp = torch.log_softmax(logits[:-1], -1)
            nll = -logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
            m = torch.tensor(mask[1:], dtype=torch.float32)
            num += float((nll * m).sum())
            den += float(m.sum())
    assert float(total) == pytest.approx(num / den, rel=1e-5)


def test_batch_stream_budget(tok) -> None:
    cfg = WarmStartConfig(tokens_per_step=2048)
    s = batch_stream(tok, cfg, pool_batches=2)
    for _ in range(6):
        b = next(s)
        assert b.ids.shape[0] == 1 or b.ids.numel() <= 2048
        assert int(b.loss_mask.sum()) > 0


def test_cache_key() -> None:
    a = WarmStartConfig()
    assert a.cache_key() == WarmStartConfig().cache_key()
    assert a.cache_key() == WarmStartConfig(threads=7).cache_key()  # threads do not change weights
    assert a.cache_key() != WarmStartConfig(lr=1e-3).cache_key()
    assert a.cache_key() != WarmStartConfig(seed=1).cache_key()


def test_build_then_reuse(tmp_path, monkeypatch) -> None:
    """A 2-step build into a temp cache writes a loadable model + manifest; the second call reuses it."""
    monkeypatch.setenv("ULORL_CACHE_DIR", str(tmp_path / "cache"))
    cfg = WarmStartConfig(max_steps=2, eval_every=2, eval_n=2, tokens_per_step=1024, threads=1)
    d = warmstart_dir(cfg)
    assert str(d).startswith(str(tmp_path / "cache" / "warmstart"))
    folder, manifest, reused = ensure_warmstart(cfg, quiet=True)
    assert folder == d and not reused
    assert manifest["status"] == "max_steps" and manifest["steps"] == 2
    assert json.loads((d / MANIFEST).read_text())["cache_key"] == cfg.cache_key()
    t0 = time.time()
    out = tmp_path / "copy"
    folder2, manifest2, reused2 = ensure_warmstart(cfg, out=out, quiet=True)
    assert reused2 and folder2 == out and time.time() - t0 < 10
    assert manifest2 == manifest
    from ulorl.models.loading import load_policy

    model, t = load_policy(str(out))
    res = generate_responses(model, t, ["Add: 12+34\n"], max_new_tokens=4, seed=0)
    assert len(res) == 1 and isinstance(res[0][0], str) and isinstance(res[0][1], bool)
