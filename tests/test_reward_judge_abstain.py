"""The generative judge where the rules abstain (issue 54): which pairs reach it, the problem text in
its prompt, and its time bound -- against a scripted judge engine (real tokenizer, real scorer)."""

from __future__ import annotations

import re
import time

import pytest
from reward_fakes import TextScriptedEngine, byte_tokenizer

from ulorl.reward import GenerativeJudge, RewardScorer
from ulorl.reward.forms import beyond_rules

MC = "Which number is prime? (A) 21 (B) 23 (C) 25"


@pytest.mark.parametrize("pred, ref, abstain", [
    ("27cm", "0.27m", True),                         # units: no rule converts them
    ("No, it is not possible", "No", True),          # prose
    (r"\text{not a rational number}", "irrational", True),
    (r"\{x : x > 2\}", r"\text{all reals above two}", True),
    ("x+1", "x+2", False),                           # two formulas the rules read
    (r"\frac{\sin x}{2}", r"\cos x", False),         # function names are no prose
    ("28", "27", False),
])
def test_beyond_rules(pred, ref, abstain):
    assert beyond_rules(pred, ref) is abstain


def _reply(prompt: str, _req) -> str:
    problem = re.search(r"Problem: (.*)\n", prompt)
    pred = re.search(r"Predicted answer: (.*)\n", prompt).group(1)
    if "the prime one" in pred and problem and "(B) 23" in problem.group(1):
        return "The prime option is 23.\nVERDICT: YES"
    return "VERDICT: NO"


def test_problem_reaches_the_judge_prompt_through_the_scorer():
    tok = byte_tokenizer()
    engine = TextScriptedEngine(tok, _reply)
    judge = GenerativeJudge(engine, tok)
    items = [(r"\boxed{\text{the prime one}}", "23", False, MC), (r"\boxed{\text{the prime one}}", "23", False)]
    with RewardScorer(timeout_s=10.0, judge=judge) as scorer:
        assert scorer.score(items) == [1.0, 0.0]  # only with the problem can the judge tell
    assert "Problem: " + MC in engine.prompts[0] and "Problem:" not in engine.prompts[1]
    assert judge.stats["calls"] == 2  # (pred, ref, problem) and (pred, ref, "") are different questions


class SlowEngine(TextScriptedEngine):
    def __init__(self, tok, delay_s: float) -> None:
        super().__init__(tok, lambda p, r: "VERDICT: YES")
        self.delay_s = delay_s

    def generate(self, requests, sampling):
        time.sleep(self.delay_s)
        return super().generate(requests, sampling)


def test_time_bound_answers_no_and_switches_the_judge_off():
    tok = byte_tokenizer()
    engine = SlowEngine(tok, delay_s=2.0)
    judge = GenerativeJudge(engine, tok, timeout_s=0.2)
    t0 = time.perf_counter()
    assert judge.judge_many([("27cm", "0.27m")]) == [False]
    assert time.perf_counter() - t0 < 1.5  # did not wait for the engine
    assert judge.stats["timeouts"] == 1 and judge.disabled
    assert judge.judge("one half", "1/2") is False  # off: not sent to a busy engine
    assert judge.stats["skipped_off"] == 1 and len(engine.calls) <= 1


def test_time_bound_not_hit():
    tok = byte_tokenizer()
    judge = GenerativeJudge(SlowEngine(tok, delay_s=0.0), tok, timeout_s=30.0)
    assert judge.judge("27cm", "0.27m") is True and judge.stats["timeouts"] == 0
    with pytest.raises(ValueError):
        GenerativeJudge(SlowEngine(tok, 0.0), tok, timeout_s=0.0)
