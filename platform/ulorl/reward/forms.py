"""Answer forms of round 4 (issue 54): pure string helpers the comparison (``ulorl.reward.compare``)
calls, most of them reading the problem text.

* ``yes_no_lead``: ``Yes, it is possible`` -> ``yes`` (a yes / no answer with a leading word);
* ``strip_condition``: ``f(x) = x^c \\text{ for some } c>0`` -> ``f(x) = x^c`` (a qualifier of a
  family or of the domain), with the kind of qualifier;
* ``expand_plus_minus``: ``\\pm 1, \\pm 7`` -> ``+ 1, - 1, + 7, - 7``;
* ``asks_simplest`` / ``unsimplified``: the problem asks for simplest form and the answer is a
  fraction not in lowest terms or a radical with a square factor (``\\frac{2}{4}``, ``\\sqrt{8}``);
* ``asks_rounding``: the problem asks for a rounded value (nearest hundredth, decimal places);
* ``names_ordered_values``: "the values of T(10), T(11), and T(12)": named quantities in an order,
  not a set of solutions;
* ``asks_system``: "Solve the system": its solution is an ordered tuple.
"""

from __future__ import annotations

import math
import re
from typing import Optional

_YES_NO = re.compile(r"^(?:\\text\s*\{\s*)?(yes|no)\b(?=\s*(?:[,.;:!\-]|\\text|$|\s+\w))", re.IGNORECASE)


def yes_no_lead(s: str) -> Optional[str]:
    """``yes`` / ``no`` when the answer opens with that word (``Yes, it is possible``, ``\\text{No,
    there is none}``, ``No.``); None otherwise (``Nope``, ``Yesterday``, ``x = 5``)."""
    m = _YES_NO.match(s.strip().strip("*").strip())
    return m.group(1).lower() if m else None


_CONDITION = re.compile(
    r"\s*,?\s*(?:\\text\s*\{\s*,?\s*(?P<kind1>for\s+(?:some|all|any|every|each))\b[^{}]*\}|"
    r"(?P<kind2>\\forall|\\text\s*\{\s*for\s+all\s*\}))(?P<rest>.*)$", re.IGNORECASE | re.S)


def strip_condition(s: str) -> tuple[str, Optional[str]]:
    """``(answer, kind)``: the answer without a trailing qualifier in text (``\\text{ for some } c>0``,
    ``\\text{ for all } x``, ``\\forall x``), and the qualifier's kind (``some`` / ``all``);
    ``(s, None)`` when there is none."""
    m = _CONDITION.search(s)
    if m is None or m.start() == 0:
        return s, None
    kind = (m.group("kind1") or m.group("kind2") or "").lower()
    word = "some" if "some" in kind else "all"
    return s[: m.start()].strip(), word


_PM_ITEM = re.compile(r"\\(?:pm|mp)(?![A-Za-z])")


def expand_plus_minus(items: list[str]) -> Optional[list[str]]:
    """Each item with one ``\\pm`` written as its two values (``\\pm 1, \\pm 7`` -> four items);
    None when no item has one or an item has several."""
    out: list[str] = []
    seen = False
    for x in items:
        n = len(_PM_ITEM.findall(x))
        if n > 1:
            return None
        if n == 1:
            seen = True
            out += [_PM_ITEM.sub("+", x), _PM_ITEM.sub("-", x)]
        else:
            out.append(x)
    return out if seen else None


_SIMPLEST = re.compile(r"simplest|lowest\s+terms|common\s+fraction|reduced\s+fraction|fully\s+simplified|"
                       r"irreducible\s+fraction", re.IGNORECASE)
_FRAC = re.compile(r"\\frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(\d+)\s*\}|\\frac\s*(\d)(\d)"
                   r"|(?<![\w.}])(\d+)\s*/\s*(\d+)(?![\w.])")
_SQRT = re.compile(r"\\sqrt\s*\{\s*(\d+)\s*\}|\\sqrt\s*(\d)(?!\d)")


def asks_simplest(problem: Optional[str]) -> bool:
    """The problem asks for an answer in simplest form (a common fraction, lowest terms, simplest
    radical form)."""
    return bool(problem and _SIMPLEST.search(problem))


def _square_factor(n: int) -> bool:
    return any(n % (k * k) == 0 for k in range(2, math.isqrt(n) + 1))


def unsimplified(s: str) -> bool:
    """A fraction of integers not in lowest terms (``\\frac{2}{4}``, ``6/8``, a denominator 1) or a
    square root of an integer with a square factor (``\\sqrt{8}``) somewhere in ``s``."""
    for m in _FRAC.finditer(s):
        a, b = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4)) if m.group(3) else (
            m.group(5), m.group(6))
        num, den = abs(int(a)), int(b)
        if den == 1 or (den and math.gcd(num, den) > 1):
            return True
    for m in _SQRT.finditer(s):
        n = int(m.group(1) or m.group(2))
        if n > 3 and _square_factor(n):
            return True
    return False


_ROUNDING = re.compile(r"\bnearest\s+(?:tenth|hundredth|thousandth|ten-thousandth)|\bdecimal\s+places?\b|"
                       r"\bround(?:ed)?\b[^.?!]{0,40}\b(?:tenth|hundredth|thousandth|decimal|places?)\b|"
                       r"\bsignificant\s+(?:figures|digits)\b|\bas\s+a\s+decimal\b", re.IGNORECASE)


def asks_rounding(problem: Optional[str]) -> bool:
    """The problem asks for a value rounded to some decimals ("to the nearest hundredth", "to two
    decimal places", "as a decimal")."""
    return bool(problem and _ROUNDING.search(problem))


_NAME = r"(?:\$[^$]{1,40}\$|\\\((?:(?!\\\)).){1,40}\\\)|[A-Za-z](?:_\{?\w+\}?)?(?:\(\s*[\w+\-]{1,8}\s*\))?)"
_NAMED_VALUES = re.compile(rf"\bvalues?\s+of\s+{_NAME}(?:\s*,\s*{_NAME})*(?:\s*,?\s*and\s+){_NAME}", re.IGNORECASE)


def names_ordered_values(problem: Optional[str]) -> bool:
    """The problem asks for the values of several named quantities ("the values of T(10), T(11), and
    T(12)", "the values of $a$ and $b$"): an answer lists them in that order, not as a set."""
    return bool(problem and _NAMED_VALUES.search(problem))


_SYSTEM = re.compile(r"\bsystem\s+of\s+(?:linear\s+)?equations\b|\bsolve\s+the\s+(?:following\s+)?system\b",
                     re.IGNORECASE)


def asks_system(problem: Optional[str]) -> bool:
    """The problem asks to solve a system of equations (its solution is a tuple of the unknowns)."""
    return bool(problem and _SYSTEM.search(problem))


_DECIMAL_LITERAL = re.compile(r"(?<![\d.])(\d+)\.(\d+)(?![\d.])")


def rationalize_decimals(s: str) -> Optional[str]:
    """``1.01^{100}`` -> ``(\\frac{101}{100})^{100}``: decimal literals as exact fractions (a decimal
    written in an answer is that number); None when ``s`` has none."""
    if not _DECIMAL_LITERAL.search(s):
        return None
    return _DECIMAL_LITERAL.sub(lambda m: f"(\\frac{{{int(m.group(1) + m.group(2))}}}{{{10 ** len(m.group(2))}}})", s)


_MATH_WORDS = frozenset("sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln exp max min gcd lcm mod "
                        "det lim sup inf deg arg dim ker".split())


def _prose(s: str) -> bool:
    """A word of three or more letters that is no LaTeX command and no function name (``Player A
    wins``, ``\\text{not a rational number}``); ``\\frac{x}{2}``, ``\\sin x`` are no prose."""
    words = re.findall(r"(?<![\\A-Za-z])[A-Za-z]{3,}", s)
    return any(w.lower() not in _MATH_WORDS for w in words)


def beyond_rules(pred: str, reference: str) -> bool:
    """Where the rules abstain after saying "not equivalent": either side is prose, or a number whose
    units or words were removed to compare it (``27cm`` against ``0.27m``: no rule converts units).
    The generative judge is asked about these pairs only (``ulorl.reward.scorer``)."""
    from ulorl.reward.normalize import normalize_answer

    for side in (pred, reference):
        if _prose(side):
            return True
        bare = re.sub(r"\\[A-Za-z]+", "", side)
        if re.search(r"[A-Za-z]", bare) and not re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "",
                                                                              normalize_answer(side))):
            return True
    return False
