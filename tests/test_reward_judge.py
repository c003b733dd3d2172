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
    assert judge.stats == {"calls": 3, "cache_hits": 1, "yes": 1, "no": 1, "unparseable": 1, "skipped_long": 0,
                           "timeouts": 0, "skipped_off": 0}
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


def test_scorer_asks_judge_only_where_rules_abstain():
    tok = byte_tokenizer()
    engine = TextScriptedEngine(tok, _reply)
    judge = GenerativeJudge(engine, tok)
    items = [
        (r"\boxed{27cm}", "0.27m", False),  # rule 0, judge YES -> 1
        (r"\boxed{\frac{1}{2}}", "0.5", False),  # rule 1: judge not asked
        (r"\boxed{28}", "27", False),  # proven integer mismatch: judge not asked
        (r"\boxed{27cm}", "0.27m", True),  # truncated: 0, judge not asked
        ("no box", "27", False),
        (r"\boxed{x+1}", "x+2", False),  # rule 0 on two formulas it reads: judge not asked (issue 54)
    ]
    with RewardScorer(timeout_s=10.0, judge=judge) as scorer:
        assert scorer.score(items) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
        st = scorer.stats
    assert st["judge_calls"] == 1 and st["judge_flips"] == 1
    assert judge.stats["calls"] == 1


# ---- cause 2 (issue 29): prose answers, the judge as a second opinion in evaluation ----------------
PROSE_YES = {("No, it is not possible to tile the board", "No"), ("Player A wins", "A"),
             (r"\text{not a rational number}", "irrational")}


def _prose_reply(prompt: str, _req) -> str:
    pred = re.search(r"Predicted answer: (.*)\n", prompt).group(1)
    ref = re.search(r"Reference answer: (.*)\n", prompt).group(1)
    return "Same meaning.\nVERDICT: YES" if (pred, ref) in PROSE_YES else "VERDICT: NO"


PROSE_ITEMS = [
    ("We colour the board. The answer is: No, it is not possible to tile the board.", "No", False),  # rule (a leading
    # no: issue 54), judge not asked
    ("Final answer: Player A wins.", "A", False),                                                   # judge YES
    (r"So $\boxed{\text{not a rational number}}$.", "irrational", False),                           # judge YES
    ("The answer is: Yes, it is possible.", "No", False),                                           # judge NO
    ("The answer is (B).", "C", False),        # proven letter mismatch: judge not asked
    ("We colour the board in two colours and count the cells of each", "No", False),  # no answer: not asked
    ("Final answer: Player A wins.", "A", True),  # truncated: 0, judge not asked
    ("The answer is 12.", "12", False),        # rule says yes: judge not asked
]


def test_judge_second_opinion_on_prose_answers_in_evaluation():
    tok = byte_tokenizer()
    engine = TextScriptedEngine(tok, _prose_reply)
    judge = GenerativeJudge(engine, tok)
    with RewardScorer(timeout_s=10.0, judge=judge, extraction="boxed_or_final") as scorer:
        assert scorer.score(PROSE_ITEMS) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
        st = scorer.stats
    assert st["judge_calls"] == 3 and st["judge_flips"] == 2
    assert judge.stats["calls"] == 3 and judge.stats["yes"] == 2 and judge.stats["no"] == 1
    asked = sorted(re.search(r"Predicted answer: (.*)\n", p).group(1) for p in engine.prompts)
    assert asked == sorted([p for p, _ in PROSE_YES if not p.startswith("No,")] + ["Yes, it is possible"])
    with RewardScorer(timeout_s=10.0, extraction="boxed_or_final") as scorer:  # no judge: the rule path alone
        assert scorer.score(PROSE_ITEMS) == [1.0] + [0.0] * 6 + [1.0]


def test_bench_reports_judge_cost_with_a_scripted_judge():
    from ulorl.bench.verifier import format_summary, score_labelled

    rows = [{"response": t, "answer": a, "label": not tr and (a, t) != ("No", PROSE_ITEMS[3][0]) and i not in (4, 5),
             "source": "prose"} for i, (t, a, tr) in enumerate(PROSE_ITEMS[:6])]
    tok = byte_tokenizer()
    engine = TextScriptedEngine(tok, _prose_reply)
    summary, per_row = score_labelled(rows, "boxed_or_final", judge=GenerativeJudge(engine, tok))
    j = summary["judge"]
    assert j["calls"] == 3 and j["flips"] == 2 and j["judge_stats"]["calls"] == 3
    assert j["seconds"] > 0 and j["seconds_per_call"] == pytest.approx(j["seconds"] / 3)
    assert j["calls_per_item"] == pytest.approx(3 / 6)
    assert summary["agreement"] == 1.0 and [p["score"] for p in per_row] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert "judge: 3 calls" in format_summary(summary)
    plain, _ = score_labelled(rows, "boxed_or_final")
    assert "judge" not in plain and plain["false_negatives"] == 2


@pytest.mark.slow
def test_bench_judge_model_cli_with_a_real_model(tmp_path, capsys):
    """``--judge-model embedded``: the shipped tiny model through the platform's loader and HF engine.
    It cannot judge (its replies are not verdicts: unparseable, no flips); the plumbing and the cost
    per call are what this checks."""
    import json

    from ulorl.cli.bench import main

    f = tmp_path / "prose.jsonl"
    f.write_text("\n".join(json.dumps({"response": t, "answer": a, "label": True, "source": "prose"})
                           for t, a, _ in PROSE_ITEMS[:3]) + "\n")
    rc = main(["verifier", str(f), "--extraction", "boxed_or_final", "--judge-model", "embedded",
               "--judge-max-new-tokens", "8", "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    j = res["judge"]
    assert j["calls"] == 2 and j["flips"] == 0 and j["judge_stats"]["unparseable"] == 2  # the first: a rule's
    assert j["seconds_per_call"] > 0 and res["false_negatives"] == 2
    assert main(["verifier", str(f), "--judge-model", str(tmp_path / "missing")]) == 2
    assert "--judge-model" in capsys.readouterr().err
