"""Warm start of the ``choice`` profile: varied targets, entropy bookkeeping, a short smoke rebuild."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ulorl.algo.entropy import token_entropy
from ulorl.data.task import is_correct
from ulorl.models.tokenizer import build_tokenizer
from ulorl.models.warmstart import (
    MANIFEST,
    SampledResponse,
    WarmStartConfig,
    batch_stream,
    ensure_warmstart,
    meets_targets,
    profile_config,
    sample_responses,
)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_default_key_unchanged_and_profiles_differ() -> None:
    # the shipped default asset was built under this key; adding the second profile must not move it
    assert WarmStartConfig().cache_key() == "c87d7b336443c5f0"
    assert profile_config("default") == WarmStartConfig()
    assert profile_config("choice").cache_key() != WarmStartConfig().cache_key()
    with pytest.raises(ValueError, match="choose one of"):
        profile_config("nope")


def test_choice_batches_carry_varied_correct_targets(tok) -> None:
    cfg = profile_config("choice")
    b = next(batch_stream(tok, cfg, pool_batches=1))
    texts = []
    for row, m in zip(b.ids, b.loss_mask):
        prompt = tok.decode(row[(m == 0) & (row != tok.pad_token_id)].tolist())
        resp = tok.decode(row[m == 1].tolist(), skip_special_tokens=True)
        terms = [int(x) for x in prompt.strip().removeprefix("Add: ").split("+")]
        assert is_correct(resp, str(sum(terms))), resp
        texts.append(resp)
    assert any(t.startswith("\\boxed") for t in texts) or len(texts) < 10
    assert any(" = " in t for t in texts) and any("; " in t for t in texts)  # line forms vary


def test_token_entropy_of_generate_scores_hand_derived() -> None:
    """What ``sample_responses`` asks of ``ulorl.algo.entropy.token_entropy``: the entropy of the
    softmax of generate's processed scores [B, V], where ``-inf`` marks filtered-out tokens."""
    sc = torch.tensor([[0.0, 0.0, float("-inf")], [math.log(3.0), 0.0, float("-inf")]])
    h = token_entropy(sc)
    assert h.shape == (2,) and torch.isfinite(h).all()
    assert h[0] == pytest.approx(math.log(2))                   # two equal survivors
    assert h[1] == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))   # p = (3/4, 1/4, 0)
    assert torch.equal(sc, torch.tensor([[0.0, 0.0, float("-inf")], [math.log(3.0), 0.0, float("-inf")]]))


def test_sample_responses_counts_tokens_and_entropy(tok) -> None:
    from ulorl.models.tiny import build_tiny_model

    model = build_tiny_model(tok, seed=0)
    res = sample_responses(model, tok, ["Add: 12+34\n", "Add: 50+61+72\n"], max_new_tokens=6, seed=0)
    assert all(isinstance(r, SampledResponse) for r in res)
    for r in res:
        assert 1 <= r.n_tokens <= 6
        assert 0.0 < r.entropy_sum <= r.n_tokens * math.log(model.config.vocab_size) + 1e-4  # at most uniform


def test_stopping_rule_needs_every_bucket() -> None:
    cfg = WarmStartConfig(profile="choice", target_acc=0.4, min_bucket_acc=0.25)
    ev = {"acc": 0.5, "acc_by_length": {"<=32": 0.8, "33-64": 0.3, "129-256": 0.2, ">256": None}}
    assert not meets_targets(ev, cfg)
    ev["acc_by_length"]["129-256"] = 0.25
    assert meets_targets(ev, cfg)
    assert not meets_targets({**ev, "acc": 0.39}, cfg)


def test_smoke_rebuild_runs_and_loss_falls(tmp_path, monkeypatch) -> None:
    """A few steps of the choice recipe (shrunk): the pipeline builds, evaluates, checkpoints, and the loss falls."""
    monkeypatch.setenv("ULORL_CACHE_DIR", str(tmp_path / "cache"))
    cfg = WarmStartConfig(**{**profile_config("choice").__dict__, "max_steps": 12, "eval_every": 6, "eval_n": 4,
                             "tokens_per_step": 1024, "warmup_steps": 2, "threads": 1, "checkpoints": True})
    folder, manifest, reused = ensure_warmstart(cfg, quiet=True)
    assert not reused and manifest["status"] == "max_steps" and manifest["steps"] == 12
    hist = manifest["history"]
    assert [h["step"] for h in hist] == [6, 12]
    assert hist[1]["loss"] < hist[0]["loss"] < math.log(len(build_tokenizer()))
    assert set(hist[0]["acc_by_length"]) == {"<=32", "33-64", "65-128", ">128"}
    assert hist[0]["entropy"] > 0
    assert manifest["config"]["profile"] == "choice"
    part = folder.with_name(folder.name + ".partial")
    assert json.loads((part / "step00012" / "eval.json").read_text())["step"] == 12
    assert (folder / MANIFEST).is_file() and (part / "step00006" / "config.json").is_file()
