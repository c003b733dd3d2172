"""Generative verifier with a scripted fake engine (real transformers tokenizer, real math-verify)."""

from __future__ import annotations

import re

import pytest
from reward_fakes import CHAT_TEMPLATE, TextScriptedEngine, byte_tokenizer

from ulorl.config import RewardConfig
from ulorl.reward import GenerativeJudge, RewardScorer, judge_from_config, parse_verdict


@pytest.mark.parametrize(
    "reply, verdict",
    [
        ("VERDICT: YES", True),
        ("27 cm is 0.27 m.\nVERDICT: YES\n\n", True),
        ("They differ.\n  VERDICT: NO  ", False),
        ("verdict: yes", None),  # case matters
        ("VERDICT: YES.", None),
        ("VERDICT: YES\nbut maybe not", None),  # the verdict must be the last line
        ("VERDICT: MAYBE", None),
        ("YES", None),
        ("", None),
    ],
)
def test_parse_verdict_is_strict(reply, verdict):
    assert parse_verdict(reply) is verdict


def _reply(prompt: str, _req) -> str:
    pred = re.search(r"Predicted answer: (.*)\n", prompt).group(1)
    if pred == "27cm":
        return "27 cm = 0.27 m.\nVERDICT: YES"
    if pred == "one half":
        return "VERDICT: YES"
    if pred == "weird":
        return "I am not sure."
    return "Different values.\nVERDICT: NO"


def test_judge_verdicts_counters_and_cache():
    tok = byte_tokenizer()
    engine = TextScriptedEngine(tok, _reply)
    judge = GenerativeJudge(engine, tok, max_new_tokens=64)
    pairs = [("27cm", "0.27m"), ("28", "27"), ("weird", "1"), ("27cm", "0.27m")]
    assert judge.judge_many(pairs) == [True, False, False, True]
    assert len(engine.calls) == 1 and engine.calls[0][0] == 3  # duplicates sent once
    assert engine.calls[0][1].greedy
    assert judge.stats == {"calls": 3, "cache_hits": 1, "yes": 1, "no": 1, "unparseable": 1, "skipped_long": 0}
    assert judge.judge("28", "27") is False and judge.judge("one half", "1/2") is True
    assert len(engine.calls) == 2  # ("28", "27") came from the cache
    st = judge.stats
    assert st["calls"] == 4 and st["cache_hits"] == 2 and st["yes"] == 2
    prompt = engine.prompts[0]
    assert "Predicted answer: 27cm" in prompt and "Reference answer: 0.27m" in prompt
    assert "VERDICT: YES or VERDICT: NO" in prompt


def test_judge_uses_chat_template_and_handles_truncation():
    tok = byte_tokenizer(CHAT_TEMPLATE)
    engine = TextScriptedEngine(tok, lambda p, r: "a long rambling reply that never ends\nVERDICT: YES", truncate_at=10)
    judge = GenerativeJudge(engine, tok, max_new_tokens=64, max_answer_chars=20)
    assert judge.judge("1/2", "0.5") is False  # cut before the verdict: unparseable
    assert engine.prompts[0].startswith("<|user|>") and engine.prompts[0].endswith("<|assistant|>")
    assert judge.judge("x" * 21, "1") is False  # too long to send
    assert judge.stats["unparseable"] == 1 and judge.stats["skipped_long"] == 1 and judge.stats["calls"] == 1


def test_judge_off_without_model():
    assert judge_from_config(RewardConfig(), lambda name: pytest.fail("must not load")) is None
    tok = byte_tokenizer()
    loaded = []

    def load(name):
        loaded.append(name)
        return TextScriptedEngine(tok, _reply), tok

    judge = judge_from_config(RewardConfig(judge_model="judge-m", judge_max_new_tokens=32), load)
    assert isinstance(judge, GenerativeJudge) and judge.max_new_tokens == 32 and loaded == ["judge-m"]


def test_scorer_asks_judge_only_when_rule_says_no():
    tok = byte_tokenizer()
    engine = TextScriptedEngine(tok, _reply)
    judge = GenerativeJudge(engine, tok)
    items = [
        (r"\boxed{27cm}", "0.27m", False),  # rule 0, judge YES -> 1
        (r"\boxed{\frac{1}{2}}", "0.5", False),  # rule 1: judge not asked
        (r"\boxed{28}", "27", False),  # proven integer mismatch: judge not asked
        (r"\boxed{27cm}", "0.27m", True),  # truncated: 0, judge not asked
        ("no box", "27", False),
        (r"\boxed{x+1}", "x+2", False),  # rule 0, judge NO -> 0
    ]
    with RewardScorer(timeout_s=10.0, judge=judge) as scorer:
        assert scorer.score(items) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
        st = scorer.stats
    assert st["judge_calls"] == 2 and st["judge_flips"] == 1
    assert judge.stats["calls"] == 2
