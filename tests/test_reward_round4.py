"""Reward fidelity, round 4 (issue 54): answers read without a box, lists, qualifiers, yes / no with a
leading word, units, equivalent forms, multiple choice, boxes joined across a longer label, rounding,
and two false positives (an unsimplified answer where the problem asks for simplest form; named
values in an order compared as a set). Every accepted form was rejected by the previous code and
every reject case guards its rule; real math-verify, no mocks.
"""

from __future__ import annotations

import pytest

from ulorl.reward import RewardScorer, compute_reward, verify_answer
from ulorl.reward.forms import (
    asks_rounding,
    asks_simplest,
    expand_plus_minus,
    names_ordered_values,
    rationalize_decimals,
    strip_condition,
    unsimplified,
    yes_no_lead,
)

MC = "Which number is prime? (A) 21 (B) 23 (C) 25 (D) 27"
SYSTEM = "Solve the system of equations x + y = 7, x - y = -1."
SIMPLEST = "What is the probability? Express your answer as a common fraction in simplest form."
RADICAL = "Find the length of the diagonal. Express your answer in simplest radical form."
ROUND = "Find the length. Round your answer to the nearest hundredth."
T_VALUES = "Find the values of T(10), T(11), and T(12)."

# (form, pred, reference, problem)
MUST_ACCEPT = [
    ("lists: a reference written a$,$b$,$c", "1, 2, 3", "1$,$2$,$3", None),  # accepted before too: a guard
    ("lists: a tuple against a bare list, solve the system", "3, 4", "(3, 4)", SYSTEM),
    ("lists: several plus-minus items", r"\pm 1, \pm 7", "1, -1, 7, -7", None),
    ("lists: several plus-minus items", "1, -1, 7, -7", r"\pm 1, \pm 7", None),
    ("qualifiers: a renamed parameter with its condition", "f(x)=x^a", r"f(x) = x^c \text{ for some } c>0", None),
    ("qualifiers: the value of a constant function", "0", r"f(x) = 0 \text{ for all } x", None),
    ("qualifiers: a definition for all x", "f(x) = 2x", r"f(x) = 2x \text{ for all } x \in \mathbb{R}", None),
    ("yes / no with a leading word", "Yes, it is possible", "Yes", None),
    ("yes / no with a leading word", r"\text{No, there is no such n}", r"\text{No}", None),
    ("units: a speed", "12 km/h", "12", None),
    ("units: a named value with a unit", r"x = 5 \text{ cm}", "5", None),
    ("equivalent forms: a one-character subscript", "E_1", "E_{1}", None),
    ("equivalent forms: a decimal base", r"1.01^{100}", r"(1+\frac{1}{100})^{100}", None),
    ("multiple choice: a letter in bold text and its option", r"\textbf{(B) } 23", "23", MC),
    ("rounding: asked for the nearest hundredth", "1.41", r"\sqrt{2}", ROUND),
    ("rounding: asked for two decimal places", "0.33", r"\frac{1}{3}", "Give the answer to two decimal places."),
    ("simplest form: the reduced fraction", r"\frac{1}{2}", r"\frac{1}{2}", SIMPLEST),
    ("simplest form: the reduced radical", r"2\sqrt{2}", r"2\sqrt{2}", RADICAL),
    ("ordered named values: in order", "5, 6, 7", "5, 6, 7", T_VALUES),
]

MUST_REJECT = [
    ("lists: a system's solution in the wrong order", "4, 3", "(3, 4)", SYSTEM),
    ("lists: a plus-minus item wrong", r"\pm 1, \pm 5", "1, -1, 7, -7", None),
    ("lists: plus-minus, one value missing", r"\pm 1, 7", "1, -1, 7, -7", None),
    ("qualifiers: another family", "f(x)=x^2", r"f(x) = x^c \text{ for some } c>0", None),
    ("qualifiers: a wrong constant", "1", r"f(x) = 0 \text{ for all } x", None),
    ("qualifiers: a value against a family", "0", r"f(x) = x^c \text{ for some } c>0", None),
    ("yes / no with a leading word: the other word", "No, it is not possible", "Yes", None),
    ("yes / no: a longer word is no answer", "Yesterday", "Yes", None),
    ("units: a different speed", "13 km/h", "12", None),
    ("units: a named value, wrong", r"x = 6 \text{ cm}", "5", None),
    ("equivalent forms: another subscript", "E_2", "E_{1}", None),
    ("equivalent forms: a decimal base, another power", r"1.01^{99}", r"(1+\frac{1}{100})^{100}", None),
    ("multiple choice: a letter in bold text, wrong option", r"\textbf{(C) } 25", "23", MC),
    ("rounding: not asked, a rounded value is no exact one", "1.41", r"\sqrt{2}", "Find the length."),
    ("rounding: asked, wrongly rounded", "1.42", r"\sqrt{2}", ROUND),
    ("simplest form: an unreduced fraction", r"\frac{2}{4}", r"\frac{1}{2}", SIMPLEST),
    ("simplest form: an unreduced fraction, slash", "6/8", r"\frac{3}{4}", SIMPLEST),
    ("simplest form: a radical with a square factor", r"\sqrt{8}", r"2\sqrt{2}", RADICAL),
    ("ordered named values: another order", "6, 5, 7", "5, 6, 7", T_VALUES),
]


@pytest.mark.parametrize("form, pred, ref, problem", MUST_ACCEPT)
def test_must_accept(form, pred, ref, problem):
    assert verify_answer(pred, ref, problem) is True, form


@pytest.mark.parametrize("form, pred, ref, problem", MUST_REJECT)
def test_must_reject(form, pred, ref, problem):
    assert verify_answer(pred, ref, problem) is False, form


def test_rules_that_need_the_problem_need_it():
    """Without the problem the comparison keeps the previous verdicts: the rounding and simplest-form
    rules read the problem's request, the ordered-values guard its wording."""
    assert verify_answer("1.41", r"\sqrt{2}") is False
    assert verify_answer(r"\frac{2}{4}", r"\frac{1}{2}") is True
    assert verify_answer("3, 4", "(3, 4)") is False  # two items: (3, 4) may be an interval


STEPS = "We work through the problem step by step.\n\n"
AREA_Q = "A square has perimeter 20. What is the area of the square?"
WAYS_Q = "In how many ways can the five books be arranged on the shelf?"
X_Q = "Find $x$ if $2x = 10$."
ORDERS_Q = "How many orders are there?"
SUM_Q = "What is the sum of the first three positive integers?"

# (form, response, reference, problem): final answers without a box (boxed_or_final only)
ACCEPT_RESPONSES = [
    ("no box: there are N ...", STEPS + "Therefore, there are 120 ways to arrange the books.", "120", WAYS_Q),
    ("no box: a trailing phrase", STEPS + "Therefore, the area of the square is 25 square units in total.", "25",
     AREA_Q),
    ("no box: a currency sign", STEPS + "So the shirt costs \\$25.", "25", "How much does the shirt cost?"),
    ("no box: a verb outside the list", STEPS + "Thus, the area of the square becomes 25.", "25", AREA_Q),
    ("no box: commentary after the answer",
     STEPS + "Therefore, the area of the square is 25. This makes sense because a square is regular.", "25", AREA_Q),
    ("no box: a math span in the subject", STEPS + "Therefore, the value of $x$ is 5.", "5", X_Q),
    ("no box: the solution of a solved equation", STEPS + "Therefore, the solution of the equation is 5.", "5",
     "Solve $2x = 10$."),
    ("no box: a closing equation of the asked quantity", STEPS + "Therefore, $x = 5$.", "5", X_Q),
    ("no box: a conclusion line", STEPS + "Conclusion: the area of the square is 25.", "25", AREA_Q),
    ("no box: a conclusion line with the value", STEPS + "**Conclusion:** 25", "25", AREA_Q),
    ("no box: a bold value mid-sentence", STEPS + "Adding up, the total is **42** dollars.", "42",
     "How many dollars in total?"),
    ("no box: a displayed computation after a colon", STEPS + "We compute the sum:\n\\[ 1 + 2 + 3 = 6 \\]", "6",
     SUM_Q),
    ("no box: a sentence right after a display", STEPS + "We get \\[ 2x = 10 \\] Therefore, the value of $x$ is 5.",
     "5", X_Q),
    ("no box: Final Answer with a sentence", STEPS + "Final Answer: The area of the square is 25.", "25", AREA_Q),
    ("no box: a factorial in a math span", STEPS + "Thus, the number of orders is \\(5! = 120\\).", "120", ORDERS_Q),
    ("box: joined across a longer labelled clause",
     "The maximum value is $\\boxed{3}$ and the minimum value of the function is $\\boxed{1}$.", "3, 1",
     "Find the maximum and the minimum of the function."),
]

REJECT_RESPONSES = [
    ("no box: there are N of another thing", STEPS + "Therefore, there are 4 sides in the square.", "4", WAYS_Q),
    ("no box: a trailing phrase, wrong value", STEPS + "Therefore, the area of the square is 24 square units in total.",
     "25", AREA_Q),
    ("no box: a currency sign, wrong value", STEPS + "So the shirt costs \\$26.", "25",
     "How much does the shirt cost?"),
    ("no box: commentary with a number is not commentary",
     STEPS + "Therefore, the area of the square is 25. But the side is 6.", "6", AREA_Q),
    ("no box: the value of another quantity", STEPS + "Therefore, the value of $y$ is 5.", "5", X_Q),
    ("no box: a closing equation of another quantity", STEPS + "Therefore, $y = 5$.", "5", X_Q),
    ("no box: a conclusion line about another quantity", STEPS + "Conclusion: the side of the square is 5.", "5",
     AREA_Q),
    ("no box: a bold value, wrong", STEPS + "Adding up, the total is **41** dollars.", "42",
     "How many dollars in total?"),
    ("no box: a bold value multiplied", STEPS + "So the area is **3** times the side.", "3", AREA_Q),
    ("no box: a displayed computation of another quantity", STEPS + "We compute the product:\n\\[ 1 \\cdot 2 = 2 \\]",
     "2", SUM_Q),
    ("no box: Final Answer with a wrong sentence", STEPS + "Final Answer: The area of the square is 24.", "25", AREA_Q),
    ("no box: a factorial is not its result", STEPS + "Thus, the number of orders is \\(5!\\).", "5", ORDERS_Q),
    ("box: a correction across a longer clause is no label",
     "First $\\boxed{27}$, and then the corrected value of the sum is $\\boxed{26}$.", "27, 26", None),
]


@pytest.mark.parametrize("form, response, ref, problem", ACCEPT_RESPONSES)
def test_responses_accepted(form, response, ref, problem):
    assert compute_reward(response, ref, False, "boxed_or_final", problem) == 1.0, form


@pytest.mark.parametrize("form, response, ref, problem", REJECT_RESPONSES)
def test_responses_rejected(form, response, ref, problem):
    assert compute_reward(response, ref, False, "boxed_or_final", problem) == 0.0, form


def test_training_mode_still_needs_a_box():
    for form, response, ref, problem in ACCEPT_RESPONSES:
        expected = 1.0 if "\\boxed" in response else 0.0
        assert compute_reward(response, ref, False, "boxed", problem) == expected, form


def test_cut_responses_earn_nothing():
    """A response cut mid-sentence (no full stop) is never read by the new closing rules."""
    for form, response, ref, problem in ACCEPT_RESPONSES:
        if "\\boxed" in response or "**" in response or response.rstrip().endswith(("]", "25")):
            continue
        cut = response.rstrip().rstrip(".")
        cut = cut[: cut.rfind(" ")]
        assert compute_reward(cut, ref, False, "boxed_or_final", problem) == 0.0, form


def test_through_the_scorer():
    items = [(r, ref, False, p) for _, r, ref, p in ACCEPT_RESPONSES + REJECT_RESPONSES]
    items += [(f"\\boxed{{{pred}}}", ref, False, p) for _, pred, ref, p in MUST_ACCEPT + MUST_REJECT]
    with RewardScorer(timeout_s=20.0, extraction="boxed_or_final") as s:
        expected = ([1.0] * len(ACCEPT_RESPONSES) + [0.0] * len(REJECT_RESPONSES)
                    + [1.0] * len(MUST_ACCEPT) + [0.0] * len(MUST_REJECT))
        assert s.score(items) == expected


def test_helpers():
    assert yes_no_lead("Yes, it is") == "yes" and yes_no_lead(r"\text{No.}") == "no"
    assert yes_no_lead("Yesterday") is None and yes_no_lead("Nope") is None
    assert strip_condition(r"x^c \text{ for some } c>0") == ("x^c", "some")
    assert strip_condition(r"0 \text{ for all } x") == ("0", "all") and strip_condition("x + 1") == ("x + 1", None)
    assert expand_plus_minus([r"\pm 1", "3"]) == ["+ 1", "- 1", "3"] and expand_plus_minus(["1"]) is None
    assert unsimplified(r"\frac{2}{4}") and unsimplified("6/8") and unsimplified(r"\sqrt{12}")
    assert not unsimplified(r"\frac{1}{2}") and not unsimplified(r"2\sqrt{3}") and not unsimplified("1.5")
    assert asks_simplest(SIMPLEST) and asks_simplest(RADICAL) and not asks_simplest("Find x.")
    assert asks_rounding(ROUND) and not asks_rounding("Round the table has 4 legs; how many?")
    assert names_ordered_values(T_VALUES) and names_ordered_values("Find the values of $a$ and $b$.")
    assert not names_ordered_values("Find all possible values of n.")
    assert rationalize_decimals("1.01^{2}") == r"(\frac{101}{100})^{2}" and rationalize_decimals("x^2") is None
