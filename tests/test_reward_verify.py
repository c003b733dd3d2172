"""Answer extraction, math-verify rule check and the binary reward (real math-verify, no mocks)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from ulorl.reward import canonical_integer, compute_reward, extract_last_boxed, verify_answer


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so the answer is \boxed{27}.", "27"),
        (r"\boxed{1} then \boxed{2}", "2"),
        (r"\boxed{\frac{a}{b}}", r"\frac{a}{b}"),
        (r"\boxed{\frac{\sqrt{3}}{2}} done", r"\frac{\sqrt{3}}{2}"),
        (r"\boxed{ 33124147 }", "33124147"),
        (r"$\boxed 5$", "5"),
        (r"\fbox{12}", "12"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces do not close the box
        (r"\boxed{}", ""),
        ("no box here, answer 27", None),
        (r"\boxed{12", None),  # cut mid-answer
        (r"\boxedx{3}", None),  # not a box command
    ],
)
def test_extract_last_boxed(text, expected):
    assert extract_last_boxed(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [("27", "27"), (" +0042 ", "42"), ("$-7$", "-7"), ("-0", "0"), ("1,000", None), ("2.0", None), ("x", None)],
)
def test_canonical_integer(text, expected):
    assert canonical_integer(text) == expected


@pytest.mark.parametrize(
    "pred, ref, expected",
    [
        ("27", "27", True),
        (r"\frac{1}{2}", "1/2", True),
        ("1/2", r"\frac{1}{2}", True),
        (r"\frac12", "1/2", True),  # bare \frac12 needs $...$ / \boxed wrapping to parse
        ("0.5", r"\frac{1}{2}", True),
        ("33124147", "33124147", True),  # BeyondAIME answers go far above 999
        ("33124148", "33124147", False),
        (r"\frac{a}{b}", "a/b", True),
        ("a/b", r"\frac{a}{b}", True),
        (r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}", True),
        ("1,000", "1000", True),
        ("28", "27", False),
        ("27cm", "0.27m", False),  # no units in the rule check: a case for the generative judge
        ("", "27", False),
    ],
)
def test_verify_answer(pred, ref, expected):
    assert verify_answer(pred, ref) is expected


@pytest.mark.parametrize(
    "response, ref, truncated, reward",
    [
        (r"... so \boxed{27}", "27", False, 1.0),
        (r"\boxed{\frac{1}{2}}", "1/2", False, 1.0),
        (r"\boxed{33124147}", "33124147", False, 1.0),
        (r"\boxed{\frac{a}{b}}", r"\frac{a}{b}", False, 1.0),
        ("the answer is 27", "27", False, 0.0),  # no box
        (r"\boxed{27}", "27", True, 0.0),  # truncated at the global max = wrong
        (r"\boxed{26}", "27", False, 0.0),
        (r"\boxed{}", "27", False, 0.0),
        (r"first \boxed{27} then \boxed{26}", "27", False, 0.0),  # the last box counts
    ],
)
def test_compute_reward(response, ref, truncated, reward):
    assert compute_reward(response, ref, truncated) == reward


def test_compute_reward_off_main_thread():
    """math-verify's signal-based timeouts would raise here; ours are off."""
    cases = [(r"\boxed{\frac{1}{2}}", "0.5", False), (r"\boxed{x^2}", "x^2", False), (r"\boxed{3}", "4", False)]
    out: list[float] = []
    t = threading.Thread(target=lambda: out.extend(compute_reward(*c) for c in cases))
    t.start()
    t.join(timeout=60)
    assert out == [1.0, 1.0, 0.0]
    with ThreadPoolExecutor(max_workers=2) as ex:
        assert list(ex.map(lambda c: compute_reward(*c), cases * 2)) == [1.0, 1.0, 0.0] * 2
