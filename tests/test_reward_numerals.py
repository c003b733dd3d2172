"""Scientific notation and small decimals compare by value, never by an absolute epsilon.

math-verify rounds an atomic float to six decimals and chops a float difference below ~1e-15, so
before this rule a 3-significant-figure answer near 1e-19 that differed from the reference in its
sign or its last digit earned a reward. Real math-verify, the real scorer's workers; no mocks.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from ulorl.reward import RewardScorer, compute_reward, verify_answer
from ulorl.reward.numerals import numeral_value, numerals_equal

MAGNITUDES = (-19, -30, 30)


def _forms(mantissa: str, exp: int) -> list[str]:
    """One value written in the notations a response uses."""
    return [f"{mantissa}\\times 10^{{{exp}}}", f"{mantissa}e{exp}", f"{mantissa} \\cdot 10^{{{exp}}}",
            f"{mantissa}\\times10^{{{exp}}}", f"{mantissa}E{exp:+d}"]


def _wrong_pairs() -> list[tuple[str, str, str]]:
    out = []
    for exp in MAGNITUDES:
        for ref in (f"1.23\\times 10^{{{exp}}}", f"1.23e{exp}"):
            for kind, mantissa in (("sign flip", "-1.23"), ("last digit", "1.24"), ("last digit down", "1.22")):
                out += [(kind, pred, ref) for pred in _forms(mantissa, exp)]
    return out


def _equal_pairs() -> list[tuple[str, str]]:
    out = []
    for exp in MAGNITUDES:
        for ref in (f"1.23\\times 10^{{{exp}}}", f"1.23e{exp}"):
            out += [(pred, ref) for pred in _forms("1.23", exp)]
            out += [(f"12.3\\times 10^{{{exp - 1}}}", ref), (f"0.0123e{exp + 2}", ref),
                    (f"1.230\\times 10^{{{exp}}}", ref)]
    out += [("-1.6\\times 10^{-19}", "-1.6e-19"), ("0.00000000000000000016", "1.6\\times 10^{-19}"),
            ("1.6\\times 10^{-19}", "\\frac{1.6}{10^{19}}"), ("10^{-7}", "0.0000001"),
            ("6.02\\times 10^{23}", "602000000000000000000000")]
    return out


WRONG = _wrong_pairs()
EQUAL = _equal_pairs()


@pytest.mark.parametrize("kind, pred, ref", WRONG)
def test_sign_flip_or_last_digit_earns_nothing(kind, pred, ref):
    assert verify_answer(pred, ref) is False, kind
    assert compute_reward(f"So the charge is \\boxed{{{pred}}}.", ref, False, "boxed") == 0.0, kind
    assert compute_reward(f"The answer is ${pred}$.", ref, False, "boxed_or_final") == 0.0, kind


@pytest.mark.parametrize("pred, ref", EQUAL)
def test_equal_values_in_other_notations_still_earn_it(pred, ref):
    assert verify_answer(pred, ref) is True
    assert compute_reward(f"So the charge is \\boxed{{{pred}}}.", ref, False, "boxed") == 1.0
    assert compute_reward(f"The answer is ${pred}$.", ref, False, "boxed_or_final") == 1.0


@pytest.mark.parametrize("pred, ref", [
    ("0.0000002", "0.0000001"), ("-0.0000001", "0.0000001"), ("0.000000123", "0.000000124"),
    ("(1.2\\times 10^{-19}, 2)", "(-1.2\\times 10^{-19}, 2)"), ("\\frac{1.6}{10^{19}}", "-1.6\\times 10^{-19}"),
    ("x = 1.6\\times 10^{-19}", "-1.6\\times 10^{-19}"), ("[1.2e-19, 1]", "[1.3e-19, 1]"),
    ("1e-20", "0"),
])
def test_small_decimals_and_floats_in_structures_compare_by_value(pred, ref):
    """The same absolute epsilon behind plain small decimals, tuples, intervals and fractions."""
    assert verify_answer(pred, ref) is False


@pytest.mark.parametrize("pred, ref", [
    ("0.333333", "\\frac{1}{3}"), ("0.3333333", "0.333333"), ("3.0", "3"), (".5", "0.5"),
    ("(1.5, 2)", "(\\frac{3}{2}, 2)"), ("2.5E3", "2500"),
])
def test_ordinary_decimals_keep_their_verdicts(pred, ref):
    """math-verify's six-decimal rounding still applies to numbers of ordinary size."""
    assert verify_answer(pred, ref) is True


def test_through_the_scorer_in_both_modes():
    """The trainer's path: extraction, the string fast path and the worker processes."""
    wrong = [(f"... so \\boxed{{{p}}}", r, False) for _, p, r in WRONG]
    right = [(f"... so \\boxed{{{p}}}", r, False) for p, r in EQUAL]
    final_wrong = [(f"Thus the answer is {p}.", r, False) for _, p, r in WRONG if "\\" not in p]
    for mode in ("boxed", "boxed_or_final"):
        with RewardScorer(timeout_s=10.0, extraction=mode) as scorer:
            assert scorer.score(wrong) == [0.0] * len(wrong), mode
            assert scorer.score(right) == [1.0] * len(right), mode
            assert scorer.score(final_wrong) == [0.0] * len(final_wrong), mode


def test_numeral_helpers():
    assert numeral_value("1.6\\times 10^{-19}") == Decimal("1.6e-19")
    assert numeral_value("-2.5e3") == Decimal(-2500) and numeral_value("10^{-7}") == Decimal("1e-7")
    assert numeral_value("\\frac{1}{2}") is None and numeral_value("1.6x") is None
    assert numeral_value("1e100000") is None  # no numeral anyone writes; left to math-verify
    assert numerals_equal(Decimal("1.23e-19"), Decimal("12.3e-20"))
    assert not numerals_equal(Decimal("1.23e-19"), Decimal("-1.23e-19"))
    assert numerals_equal(Decimal("0.3333333"), Decimal("0.333333"))
    assert not numerals_equal(Decimal("1.2300001e30"), Decimal("1.23e30"))
