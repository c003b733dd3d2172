"""Decimal and scientific-notation numerals compared by value, at any magnitude (pure ``decimal`` code).

math-verify compares a float with another number at a fixed number of decimal places (six for an
atomic float) or by chopping a difference below 1e-15, so every pair of values below those sizes
compares equal -- ``1.23\\times 10^{-19}`` and ``-1.23\\times 10^{-19}`` alike. Here a numeral is
read exactly (mantissa and power of ten) and two numerals are equal when they are the same number,
or when they agree both to six decimal places (math-verify's own rounding, so ``0.333333`` still
equals ``0.3333333``) and to six significant digits (so the tolerance shrinks with the value):

    >>> numerals_equal(numeral_value(r"1.23\\times 10^{-19}"), numeral_value("12.3e-20"))
    True
    >>> numerals_equal(numeral_value(r"1.23\\times 10^{-19}"), numeral_value(r"-1.23\\times 10^{-19}"))
    False
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation, localcontext
from typing import Optional

SIGNIFICANT_DIGITS = 6
DECIMAL_PLACES = 6  # math-verify's float_rounding default
MAX_EXPONENT = 10_000  # a larger power of ten is not a numeral anyone writes as an answer

_MANTISSA = r"(?P<m>\d+(?:\.\d*)?|\.\d+)"
_EXP = r"(?:\{\s*(?P<e1>[+-]?\d+)\s*\}|\(\s*(?P<e2>[+-]?\d+)\s*\)|(?P<e3>\d))"
_NUMERAL = re.compile(
    rf"^(?P<sign>[+-]?)\s*(?:{_MANTISSA}\s*(?:(?:\\times|\\cdot|\*|×)\s*10\s*\^\s*{_EXP}|[eE](?P<e4>[+-]?\d+))?"
    rf"|10\s*\^\s*(?:\{{\s*(?P<p1>[+-]?\d+)\s*\}}|(?P<p2>\d)))$"
)


def numeral_value(s: str) -> Optional[Decimal]:
    """The exact value of a real numeral: ``-0.5``, ``.25``, ``1.6\\times 10^{-19}``, ``1.6 \\cdot
    10^{-19}``, ``2.5e3``, ``10^{-7}``; None for anything else (fractions, radicals, variables)."""
    m = _NUMERAL.match(s.strip())
    if m is None:
        return None
    exp_text = next((m.group(k) for k in ("e1", "e2", "e3", "e4", "p1", "p2") if m.group(k) is not None), "0")
    exp = int(exp_text)
    if abs(exp) > MAX_EXPONENT:
        return None
    mantissa = Decimal(m.group("m")) if m.group("m") is not None else Decimal(1)
    value = mantissa.scaleb(exp)
    return -value if m.group("sign") == "-" else value


def _rounded(x: Decimal, exponent: int) -> Decimal:
    """``x`` rounded half-up to a multiple of ``10**exponent``."""
    with localcontext(Context(prec=max(x.adjusted() - exponent + 2, 2) + 2)):
        return x.quantize(Decimal(1).scaleb(exponent), rounding=ROUND_HALF_UP)


def numerals_equal(a: Decimal, b: Decimal) -> bool:
    """Same number, or the same to ``DECIMAL_PLACES`` decimals *and* ``SIGNIFICANT_DIGITS`` digits."""
    if a == b:
        return True
    if a.is_zero() or b.is_zero() or (a < 0) != (b < 0):
        return False
    try:
        if max(a.adjusted(), b.adjusted()) > 3 * DECIMAL_PLACES + SIGNIFICANT_DIGITS:
            return False  # six decimals of a number this large are all of its digits: only a == b counts
        same_places = _rounded(a, -DECIMAL_PLACES) == _rounded(b, -DECIMAL_PLACES)
        return same_places and (_rounded(a, a.adjusted() - SIGNIFICANT_DIGITS + 1)
                                == _rounded(b, b.adjusted() - SIGNIFICANT_DIGITS + 1))
    except InvalidOperation:
        return False
