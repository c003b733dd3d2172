"""Reward fidelity, round 2: each cause of a missed correct answer on hard, real responses, with
must-accept and must-reject cases (real math-verify, no mocks), and the guard against truncation
nobody flagged (a response that stops mid-derivation with ``truncated=False``).

Causes (issue 29): 1 no box (closing sentence, ``**Answer:**`` mid-line); 3 list references;
4 multiple-choice phrasing; 5 the unit stripper eating symbols; 6 small forms. Cause 2 (prose
answers, the generative judge) is in ``test_reward_judge.py``.
"""

from __future__ import annotations

import time

import pytest

from ulorl.reward import RewardScorer, compute_reward, verify_answer
from ulorl.reward.compare import enclosed_items, inequality_to_interval, letter_lead, reference_alternatives
from ulorl.reward.extract import closing_statement, extract_answer
from ulorl.reward.normalize import is_complete_expression, normalize_answer, strip_unit_words

OPTIONS = (r"How long is it? Choices: (A) $50 \mathrm{~cm}$ (B) $45 \mathrm{~cm}$ (C) $6+\pi \mathrm{~m}$ (D) 9:30 "
           "(E) 5 and 8")
PAIR = "Find the ordered pair (x, y) that solves the system."
POSSIBLE = "What are the possible values of n?"
IN_ORDER = "Compute a and b, in that order."

# (cause, pred, reference, problem)
MUST_ACCEPT = [
    # 3: list references
    ("list in $,$", "1, 2", "$1$,$2$", None),
    ("list in $, $", "3, 5, 7", "$3$, $5$, $7$", None),
    ("list in $ and $", "3, 5", "$3$ and $5$", None),
    ("reordered set: possible values", "3, 1", "1, 3", POSSIBLE),
    ("alternatives X = Y", "120", r"\binom{10}{3} = 120", None),
    ("alternatives X = Y", r"\binom{10}{3}", r"\binom{10}{3} = 120", None),
    ("alternatives A or B, one value", r"\frac{1}{2}", r"0.5 or \frac12", None),
    ("tuple vs bare list", "1, 2, 3", "(1, 2, 3)", None),
    ("tuple vs bare list", "(1, 2, 3)", "1, 2, 3", None),
    ("bracket list vs bare list", "[2, 4, 6]", "2, 4, 6", None),
    ("ordered pair vs bare pair", "3, 4", "(3, 4)", PAIR),
    # 4: multiple choice
    ("letter and its text, no options known", "(E) 9:30", "E", None),
    ("letter and its text", r"B. 45 \text{ cm}", "B", OPTIONS),
    ("letter and its text", r"(C) $6+\pi \mathrm{~m}$", "C", OPTIONS),
    ("letter and its text", "(E) 5 and 8", "E", OPTIONS),
    ("letter and its text in a box", r"(D) \ 9:30", "D", OPTIONS),
    ("reference written as letter and text", "C", "C. x = 42", None),
    ("option text for a letter reference", r"45 \mathrm{~cm}", "B", OPTIONS),
    # 5: the normaliser keeps symbols that are part of the answer
    ("symbol after a slash", "1/A", "1/A", None),
    ("fraction with a power", r"-\frac{5}{x^6}", r"-\frac{5}{x^{6}}", None),
    ("power of a letter", "2^k", "2^{k}", None),
    ("imaginary unit", "3+2i", "3+2i", None),
    ("glued unit", "5cm", "5", None),
    ("one-letter unit", "5 m", "5", None),
    # 6: small forms
    ("currency in the box", r"\$129{,}200", "129200", None),
    ("currency in the box", r"\$15", "15", None),
    ("unescaped currency", "$15", "15", None),
    ("text wrapper and case", r"\text{Yes}", "yes", None),
    ("letter case", "YES", "Yes", None),
    ("qualifier", "approximately 5", "5", None),
    ("qualifier", r"5 \text{ only}", "5", None),
    ("qualifier", r"\frac{\sqrt{3}}{3} \approx 0.577", r"\frac{\sqrt{3}}{3}", None),
    ("an approximation that is the answer", r"x \approx 11", "11", None),
    ("ln vs log", r"\ln 2", r"\log 2", None),
    ("ln vs log", r"\log(x+1)", r"\ln(x+1)", None),
    ("inequality chain vs interval", "1 < x < 3", "(1,3)", None),
    ("inequality chain vs interval", r"-2 \le x < 5", "[-2,5)", None),
    ("inequality chain vs interval", "3 > x > 1", "(1,3)", None),
    ("half line vs interval", "x > 2", r"(2,\infty)", None),
    ("half line vs interval", r"x \le -1", r"(-\infty,-1]", None),
    ("e notation", "1e-5", "10^{-5}", None),
    ("e notation", "2.5E3", "2500", None),
    ("rounded reference", r"\sqrt{2}", "1.41", None),
    ("rounded reference", "1/3", "0.33", None),
    ("rounded reference", r"\pi", "3.14", None),
    ("percent for a decimal", "60%", "0.6", None),
    ("percent for a decimal", r"100\%", "1", None),
    ("percent for an option letter", r"25\%", "C", "What percentage? (A) 20 (B) 22 (C) 25 (D) 30 (E) 50"),
    ("percent for an option letter", r"50\%", "E", r"What percentage? (A) $30 \%$ (B) $35 \%$ (C) $40 \%$ "
     r"(D) $45 \%$ (E) $50 \%$"),
    ("number in a text group", r"\text{.088 m}^2", "0.088", None),
    ("squared unit in mathrm", r"45 \mathrm{~cm}^{2}", "45", None),
    ("repeated value", "2, 2", "2", None),
]

MUST_REJECT = [
    # 3: a wrong item, a reordered ordered list, alternatives that are two answers
    ("list: a wrong item", "1, 3", "$1$,$2$", None),
    ("list: a wrong item", "3, 5, 9", "$3$, $5$, $7$", None),
    ("list: a missing item", "3, 5", "$3$, $5$, $7$", None),
    ("reordered ordered list", "2, 1", "$1$, $2$", None),
    ("reordered where order is asked", "3, 1", "1, 3", IN_ORDER),
    ("reordered tuple vs bare list", "(3, 1, 2)", "1, 2, 3", None),
    ("tuple vs bare list: a wrong item", "1, 2, 4", "(1, 2, 3)", None),
    ("two items: an interval, not a pair", "1, 2", "(1, 2)", None),
    ("alternatives X = Y: a wrong value", "121", r"\binom{10}{3} = 120", None),
    ("a line is not its intercept", "5", "y = 2x + 5", None),
    ("an equation is not two forms of a value", "11a+c", "7 = 11a+c", None),
    ("A or B: two answers, one given", "2", "2 or 3", None),
    ("A or B: two solutions, one given", "x=1", "x=1 or x=2", None),
    # 4: a wrong letter, a letter whose text contradicts the option, several letters
    ("wrong letter with text", "(D) 9:30", "E", None),
    ("wrong letter", "(A) 5 and 8", "E", OPTIONS),
    ("letter contradicted by its text", r"(B) 54 \text{ cm}", "B", OPTIONS),
    ("several letters", "(A), (C), and (E)", "A", None),
    ("several letters", "(A) and (C)", "A", None),
    ("wrong option text", r"50 \mathrm{~cm}", "B", OPTIONS),
    # 5: symbols are not units
    ("symbol after a slash", "1/A", "1/B", None),
    ("fraction with a power", r"-\frac{5}{x^6}", r"-\frac{5}{x^7}", None),
    ("power of a letter", "2^k", "2^m", None),
    ("imaginary unit", "3+2i", "3+2", None),
    ("imaginary unit", "3+2i", "3-2i", None),
    ("imaginary unit", "2i", "2", None),
    ("pi", r"2\pi", "2", None),
    ("a variable after a space", "2 x", "2", None),
    # 6: small forms keep their values
    ("currency", r"\$129{,}300", "129200", None),
    ("unescaped currency", "$16", "15", None),
    ("text wrapper", r"\text{No}", "yes", None),
    ("qualifier that changes the meaning", "at least 5", "5", None),
    ("qualifier", r"5 \text{ only}", "6", None),
    ("ln vs log: another value", r"\ln 3", r"\log 2", None),
    ("log with a base", r"\log_{10} 2", r"\ln 2", None),
    ("inequality: wrong bracket", "1 < x < 3", "[1,3)", None),
    ("half line: wrong bracket", r"x \ge 2", r"(2,\infty)", None),
    ("e notation", "1e-5", "0.0001", None),
    ("rounded reference: another value", r"\sqrt{2}", "1.42", None),
    ("rounding: a terminating decimal is exact", "1/4", "0.24", None),
    ("rounding: one decimal is too coarse", "1/3", "0.3", None),
    ("rounding: a decimal for an exact value", "0.333", r"\frac{1}{3}", None),
    ("rounding: a decimal for a decimal", "0.249", "0.25", None),
    ("percent", "60%", "0.7", None),
    ("words are not products of letters", "KILIMANJARO", "ANMAIKOLIRJ", None),
    ("words are not products of letters", "KILIMANJARO", "E", "Which word? (A) KILIMANJAROS (B) AJNAM (C) X (D) Y "
     "(E) ANMAIKOLIRJ"),
    ("a list for a repeated value", "2, 3", "2, 2", None),
    ("one value for a repeated value", "2", "2, 2", None),
]


@pytest.mark.parametrize("cause, pred, ref, problem", MUST_ACCEPT)
def test_must_accept(cause, pred, ref, problem):
    assert verify_answer(pred, ref, problem) is True, cause


@pytest.mark.parametrize("cause, pred, ref, problem", MUST_REJECT)
def test_must_reject(cause, pred, ref, problem):
    assert verify_answer(pred, ref, problem) is False, cause


SIDE = "A square has a perimeter of 80 cm. What is the length of the side?"
AREA = "A square has a perimeter of 80 cm. What is the area of the square?"
CARDS = "Michael's card shows no animals. Which card is Michael's?"
CUBE = "Which pattern could NOT be folded along the lines shown to form a cube?"

# (cause, response, reference, problem): right answers the rule path used to miss
ACCEPT_RESPONSES = [
    ("1: closing sentence", "The perimeter is 4 sides.\n\nTherefore, the length of the side is 20 centimeters.",
     "20", SIDE),
    ("1: closing sentence, math", "We add the parts. Hence, the length of the side is $20$.", "20", SIDE),
    ("1: closing sentence, letter", "It cannot be B, C, D or E.\n\nSo the card for Michael must be A.", "A", CARDS),
    ("1: closing sentence, letter in brackets", "Faces overlap in (D).\nThe pattern that could NOT be folded along "
     "the lines shown to form a cube is (D).", "D", CUBE),
    ("1: bold answer mid-line", "We solve and find the side. **Answer:** 20 cm", "20", None),
    ("1: answer after a sentence", "We solve and find the side. Answer: $20$", "20", None),
    ("4: the correct answer is", "Long reasoning.\nThe correct answer is (C).", "C", None),
    ("4: the best answer is", "Long reasoning.\n\nThe best answer is (A).", "A", None),
    ("4: correct answer, then explanation", "The correct answer is (B).\nIt is the only one with a square.", "B", None),
    ("4: the correct option is", "So, the correct option is B.", "B", None),
    ("4: letter and its text", r"Thus the answer is (B) $45 \mathrm{~cm}$.", "B", OPTIONS),
    ("6: labelled boxes", r"The maximum is $\boxed{3}$, min $\boxed{1}$", "3, 1", None),
    ("6: labelled boxes", r"$x = \boxed{3}$, $y = \boxed{4}$", "3, 4", None),
    ("6: two equal boxes for a list of two", r"Both roots are $\boxed{2}$ and $\boxed{2}$.", "2, 2", None),
    ("6: a restatement is not a label", r"The area is $\boxed{45 \text{ cm}^2}$, which is answer choice "
     r"$\boxed{\text{(B)}}$.", "B", OPTIONS),
]

# (cause, response, reference, problem): wrong answers that must stay wrong
REJECT_RESPONSES = [
    ("4: the correct answer is, wrong letter", "Long reasoning.\nThe correct answer is (C).", "B", None),
    ("4: the best answer is, wrong letter", "The best answer is (A).", "D", None),
    ("4: several letters", "The correct answer is (A), (C), and (E).", "A", None),
    ("1: closing sentence, wrong value", "Therefore, the length of the side is 21 centimeters.", "20", SIDE),
    ("1: closing sentence, wrong letter", "So the card for Michael must be B.", "A", CARDS),
    ("6: labelled boxes, a correction", r"First $\boxed{27}$, then $\boxed{26}$", "27, 26", None),
    ("6: labelled boxes, wrong order", r"min $\boxed{1}$, max $\boxed{3}$", "3, 1", None),
]


@pytest.mark.parametrize("cause, response, ref, problem", ACCEPT_RESPONSES)
def test_responses_accepted(cause, response, ref, problem):
    assert compute_reward(response, ref, False, "boxed_or_final", problem) == 1.0, cause


@pytest.mark.parametrize("cause, response, ref, problem", REJECT_RESPONSES)
def test_responses_rejected(cause, response, ref, problem):
    assert compute_reward(response, ref, False, "boxed_or_final", problem) == 0.0, cause


# Responses that stop mid-derivation, scored with truncated=False (a labelled set, an external log):
# the number in the last sentence is the reference, and none of them may earn a reward.
TRUNCATED_UNFLAGGED = [
    ("cut before the full stop", "The perimeter is 4 sides. Therefore, the length of the side is 20", "20", SIDE),
    ("cut mid-sentence after the value", "Each side is 80 / 4. So the side is 20 and the area of the", "20", AREA),
    ("an intermediate quantity", "First we need the side.\n\nTherefore, the side is 20 centimeters.", "20", AREA),
    ("an intermediate quantity, no cue", "First we need the side. The length of the side is 20.", "20", SIDE),
    ("an equation", "Let x be the side. Then 4x = 80. So x = 20.", "20", SIDE),
    ("a short cut response", "We divide by 4. So x = 20.", "20", SIDE),
    ("a formula line", "The side satisfies\n$$4s = 80 \\implies s = 20.$$", "20", SIDE),
    ("a marker with nothing after it", "The side is 80 / 4 = 20, so the answer is", "20", SIDE),
    ("a value followed by words", "Therefore, the length of the side is 20 times the width.", "20", SIDE),
    ("a repeated list cut off", "The triples are:\n- 14, 17, 20\n- 17, 20", "20", SIDE),
    ("a letter cut mid-sentence", "So the card for Michael must be A and the card for", "A", CARDS),
    ("a letter without brackets or cue", "The card for Michael is A.", "A", CARDS),
]


@pytest.mark.parametrize("case, response, ref, problem", TRUNCATED_UNFLAGGED)
def test_unflagged_truncation_never_earns_a_reward(case, response, ref, problem):
    assert compute_reward(response, ref, False, "boxed_or_final", problem) == 0.0, case
    assert compute_reward(response, ref, False, "boxed", problem) == 0.0, case


def test_truncation_guard_through_the_scorer():
    """The same responses through the trainer's scorer (workers, fast path), in both modes."""
    items = [(text, ref, False, problem) for _, text, ref, problem in TRUNCATED_UNFLAGGED]
    items += [(ACCEPT_RESPONSES[0][1], "20", False, SIDE), (ACCEPT_RESPONSES[0][1], "20", True, SIDE)]
    with RewardScorer(timeout_s=10.0, extraction="boxed_or_final") as s:
        assert s.score(items) == [0.0] * len(TRUNCATED_UNFLAGGED) + [1.0, 0.0]
    with RewardScorer(timeout_s=10.0) as s:
        assert s.score(items) == [0.0] * len(items)


def test_closing_sentence_needs_the_problem():
    text = ACCEPT_RESPONSES[0][1]
    assert extract_answer(text, "boxed_or_final") is None  # no problem: no closing-sentence rule
    assert extract_answer(text, "boxed_or_final", SIDE) == "20 centimeters"
    assert extract_answer(text, "boxed", SIDE) is None
    assert closing_statement(text, AREA) is None  # "the length of the side" is not what AREA asks for
    assert closing_statement("So the card for Michael must be A.", CARDS) == "A"


def test_helpers():
    assert letter_lead("(E) 9:30") == ("E", "9:30") and letter_lead("B. 45 cm") == ("B", "45 cm")
    assert letter_lead("(A), (C)") is None and letter_lead("(2, 3)") is None
    assert enclosed_items("(1, 2, 3)") == ["1", "2", "3"] and enclosed_items("(x, y) = (1, 2)") is None
    assert enclosed_items("[0, 1)") is None
    assert inequality_to_interval(r"1 < x \le 3") == "(1, 3]" and inequality_to_interval("x > 2") == r"(2, \infty)"
    assert inequality_to_interval("x < y < 3") is None and inequality_to_interval("1 < x > 3") is None
    assert reference_alternatives(r"\binom{10}{3} = 120") == ([r"\binom{10}{3}", "120"], True)
    assert reference_alternatives("x + y = 5") == ([], False)
    assert reference_alternatives("2 or 3") == (["2", "3"], False)
    assert strip_unit_words("5 cm") == "5" and strip_unit_words("1/A") == "1/A" and strip_unit_words("3+2i") == "3+2i"
    assert not is_complete_expression(r"-\frac{5}{") and not is_complete_expression("2^")
    assert is_complete_expression(r"\frac{1}{2}")
    assert normalize_answer(r"-\frac{5}{x^6}") == r"-\frac{5}{x^6}" and normalize_answer("1e-5") == r"1\times 10^{-5}"


@pytest.mark.parametrize(
    "text",
    [
        "Therefore, the " + "long " * 40_000 + "side is 20.",                # closing sentence, long subject
        "So " + "x = 1. " * 20_000,                                          # many short sentences
        "(A) " + "9:30 " * 20_000,                                           # a letter and a huge text
        r"\boxed{1}, min " * 10_000,                                         # many labelled boxes
        "$1$, " * 20_000 + "$2$",                                            # many math items
        "1 < " * 20_000 + "x",                                               # a long relation chain
        "The correct answer is " * 10_000,                                   # many answer marks
    ],
)
def test_new_rules_stay_fast_on_pathological_text(text):
    """Extraction and the string fast path run in the caller, outside the workers' time bound."""
    from ulorl.reward.compare import fast_verdict

    t0 = time.perf_counter()
    for mode in ("boxed", "boxed_or_final"):
        pred = extract_answer(text, mode, SIDE)
        if pred:
            fast_verdict(pred, "12")
        fast_verdict(text[:5000], "1, 2")
    assert time.perf_counter() - t0 < 2.0
