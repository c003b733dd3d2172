"""Each known cause of verifier disagreement with careful grading: must-accept and must-reject
tables (real math-verify, no mocks), plus the extraction modes and the normalisation helpers."""

from __future__ import annotations

import pytest

from ulorl.reward import RewardScorer, compute_reward, verify_answer
from ulorl.reward.compare import is_set_reference, parse_options, split_items
from ulorl.reward.extract import extract_answer, extract_boxed_answer, extract_final_statement
from ulorl.reward.normalize import normalize_answer, option_letter, plain_thousands, strip_number_decorations

OPTIONS = "Which number is prime? (A) 4 (B) 5 (C) 9 (D) 15"
ALL_SOLUTIONS = "Find all real solutions of x^2 - 5x + 6 = 0. Enter all the solutions, separated by commas."
ORDERED = "Compute f(10), f(11) and f(12), in that order."

# (cause, pred, reference, problem)
MUST_ACCEPT = [
    ("escaped dollar", r"\$31,800", "31800", None),
    ("escaped dollar", r"\$16.56", r"\$16.56", None),
    ("escaped dollar", r"\$10", "10", None),
    ("units", r"8\sqrt{3}\text{ square inches}", r"8\sqrt{3}", None),
    ("units", r"5 \text{ cm}", "5", None),
    ("units", "3 hours", "3", None),
    ("percent", r"12.5\%", "12.5", None),
    ("percent", "12.5", r"12.5\%", None),
    ("percent", "0.1", r"10\%", None),
    ("degrees", r"30^\circ", "30", None),
    ("degrees", r"30^{\circ}", "30", None),
    ("exact", r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", None),
    ("exact", "2^{10}", "1024", None),
    ("exact", "0.5", r"\frac12", None),
    ("list", "2, 4, 3", "2, 4, 3", None),
    ("set", "3, 2", "2, 3", ALL_SOLUTIONS),
    ("set", r"\{3, 2\}", r"\{2, 3\}", None),
    ("set", "(2,1),(1,2)", "(1,2),(2,1)", None),
    ("set", r"a_{37} = 19, a_3 = 2", r"a_3 = 2, a_{37} = 19", None),
    ("multiple choice", "B", "B", None),
    ("multiple choice", "(B)", "B", None),
    ("multiple choice", r"\text{(B)}", "B", None),
    ("multiple choice", "5", "B", OPTIONS),
    ("multiple choice", "B", "5", OPTIONS),
    ("thousands", "1 000", "1000", None),
    ("thousands", "1,000", "1000", None),
    ("thousands", r"12,\!000,\!023", "12000023", None),
    ("thousands", "1{,}000", "1000", None),
    ("function", "f(y)=2y", "f(x)=2x", None),
    ("function", "g(t)=t^2+1", "g(x)=x^2+1", None),
    ("two values", "5, 7", "5, 7", None),
    ("two values", "-5, 5", "5, -5", ALL_SOLUTIONS),
]

MUST_REJECT = [
    ("escaped dollar", r"\$31,700", "31800", None),
    ("escaped dollar", r"\$16.57", r"\$16.56", None),
    ("units", r"8\sqrt{3}\text{ square inches}", r"8\sqrt{2}", None),
    ("text is not a unit", r"\text{all odd } n", "n", None),
    ("text is not a unit", r"n \text{ odd}", "n", None),
    ("percent", r"12.5\%", "13", None),
    ("degrees", r"30^\circ", "60", None),
    ("exact", r"\frac{2^{1009}}{2^{1009}+2018}", r"\frac{2^{1009}}{2^{1009}+1009}", None),
    ("exact", "2^{100}+1", "2^{100}", None),
    ("exact", r"\sqrt{2}+10^{-20}", r"\sqrt{2}", None),
    ("ordered list", "2, 3, 4", "2, 4, 3", None),
    ("ordered list", "2, 3, 4", "2, 4, 3", ORDERED),
    ("ordered tuple", "(2,1)", "(1,2)", None),
    ("multiple choice", "C", "B", None),
    ("multiple choice", "4", "B", OPTIONS),
    ("multiple choice", "5", "B", None),  # no options to map the letter to
    ("multiple choice", "A", "5", OPTIONS),
    ("thousands", "1,001", "1000", None),
    ("thousands", "1 000", "100", None),
    ("function", "f(y)=2y+1", "f(x)=2x", None),
    ("function", "f(y)=2x", "f(x)=2x", None),
    ("two values", "5", "5, 7", None),
    ("two values", "5", r"\pm 5", None),
    ("two values", "5", "-5, 5", ALL_SOLUTIONS),
    ("two values", "5, 7, 9", "5, 7", None),
]


@pytest.mark.parametrize("cause, pred, ref, problem", MUST_ACCEPT)
def test_must_accept(cause, pred, ref, problem):
    assert verify_answer(pred, ref, problem) is True, cause


@pytest.mark.parametrize("cause, pred, ref, problem", MUST_REJECT)
def test_must_reject(cause, pred, ref, problem):
    assert verify_answer(pred, ref, problem) is False, cause


@pytest.mark.parametrize(
    "text, boxed, boxed_or_final",
    [
        ("... so the answer is 81.", None, "81"),
        ("Therefore the answer is (B).", None, "(B)"),
        ("Final answer: 42", None, "42"),
        (r"**Final Answer:** $\frac{1}{2}$", None, r"\frac{1}{2}"),
        ("Final Answer: The final answer is $28\\%$. I hope it is correct.", None, r"28\%"),
        ("We get 3.5 hours. So the answer is 3.5.", None, "3.5"),
        ("The answer is $\\$16.56$.", None, r"\$16.56"),
        ("Long reasoning about the options.\n\n(C)", None, "C"),
        ("$0$", None, "0"),
        ("the number is twenty seven and I am not sure what else to say", None, None),
        (r"so \boxed{-2} \quad \text{and} \quad \boxed{1}.", "-2, 1", "-2, 1"),
        (r"first \boxed{27} then \boxed{26}", "26", "26"),
        (r"\boxed{5} so the answer is \boxed{5}", "5", "5"),
        (r"the answer is 3, so \boxed{12", None, None),  # cut mid-answer: no fallback
        (r"the answer is 12 \boxed{}", "", ""),
    ],
)
def test_extraction_modes(text, boxed, boxed_or_final):
    assert extract_answer(text, "boxed") == boxed
    assert extract_answer(text, "boxed_or_final") == boxed_or_final


def test_extraction_mode_is_checked():
    with pytest.raises(ValueError, match="extraction mode"):
        extract_answer("x", "final")
    with pytest.raises(ValueError, match="extraction"):
        RewardScorer(extraction="final")


def test_boxed_helpers():
    assert extract_boxed_answer(r"$\boxed{(3,3)}$ and $\boxed{(1,1)}$") == "(3,3), (1,1)"
    assert extract_boxed_answer("no box") is None
    assert extract_final_statement("I think the final answer is $x = 2$ here.") == "x = 2"


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"\$31,800", "31800"),
        (r"8\sqrt{3}\text{ square inches}", r"8\sqrt{3}"),
        (r"\text{all odd } n", r"\text{all odd } n"),
        (r"$\boxed{1}\boxed{2}$", "1, 2"),
        (r"\left( \dfrac{1}{2} \right)", r"(\frac{1}{2})"),
        (r"32,\! 349", "32349"),
        ("{2, 3, 5}", "2, 3, 5"),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_small_helpers():
    assert plain_thousands("1,234,567.5") == "1234567.5" and plain_thousands("1,23") is None
    assert strip_number_decorations(r"x^\circ") == r"x^\circ"  # not a number: left alone
    assert option_letter(r"$\textbf{(D)}$") == "D" and option_letter("DE") is None
    assert split_items(r"[0,1), \{1,2\}, (3,4)") == ["[0,1)", r"\{1,2\}", "(3,4)"]
    assert split_items("1,000") == ["1,000"]
    assert parse_options(OPTIONS) == {"A": "4", "B": "5", "C": "9", "D": "15"}
    assert parse_options("Compute (a) and (b).") == {}
    assert is_set_reference("2, 3", ALL_SOLUTIONS) and not is_set_reference("2, 3", ORDERED)
    assert not is_set_reference("2, 3", None) and is_set_reference("(1,2), (2,1)", None)


@pytest.mark.parametrize(
    "response, ref, extraction, reward",
    [
        ("the answer is 27", "27", "boxed", 0.0),
        ("the answer is 27", "27", "boxed_or_final", 1.0),
        ("Therefore the answer is (B).", "B", "boxed_or_final", 1.0),
        (r"so \boxed{\$31,800}", "31800", "boxed", 1.0),
    ],
)
def test_compute_reward_modes(response, ref, extraction, reward):
    assert compute_reward(response, ref, False, extraction=extraction) == reward


def test_scorer_modes_and_problem_items():
    items = [("Answer: 5", "B", False, OPTIONS), (r"so \boxed{5}", "B", False, OPTIONS),
             ("the answer is 2, 4, 3", "2, 4, 3", False), (r"\boxed{2, 3, 4}", "2, 4, 3", False)]
    with RewardScorer(timeout_s=10.0, extraction="boxed_or_final") as s:
        assert s.score(items) == [1.0, 1.0, 1.0, 0.0]
    with RewardScorer(timeout_s=10.0) as s:  # training default: no box -> 0
        assert s.extraction == "boxed"
        assert s.score(items) == [0.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "text",
    [
        "the answer is " + "a " * 50_000 + "1",                       # unit-word pattern worst case
        r"\boxed{" + "1" * 50_000 + "x}",                              # a long almost-number
        "answer: " * 20_000,                                           # many answer statements
        r"\boxed{1}, " * 5_000 + "and more",                           # many boxes
        "$" * 30_000,                                                  # unbalanced math delimiters
        r"\boxed{" * 20_000 + "1",                                     # boxes that never close
        r"\boxed{1} " * 20_000,                                        # many joinable boxes
        r"\boxed 1 " * 20_000,                                         # many bare boxes
    ],
)
def test_extraction_and_fast_path_stay_fast_on_pathological_text(text):
    """Extraction and the string fast path run in the caller, outside the workers' time bound."""
    import time

    from ulorl.reward.compare import fast_verdict

    t0 = time.perf_counter()
    for mode in ("boxed", "boxed_or_final"):
        pred = extract_answer(text, mode)
        if pred:
            fast_verdict(pred, "12")
    assert time.perf_counter() - t0 < 2.0
