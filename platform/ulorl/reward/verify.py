"""Rule-based answer check with math-verify, safe off the main thread.

math-verify's own time limits use ``signal.alarm``, which raises in threads, thread pools and
threaded Ray actors. Every call here passes ``parsing_timeout=None`` and ``timeout_seconds=None``,
so these functions run anywhere but are *not time-bounded*: a pathological expression (an
exponent tower) can make sympy run for ever. Callers that need a bound use
``ulorl.reward.scorer.RewardScorer`` (a process pool that kills hung workers).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Optional

from ulorl.reward.extract import extract_last_boxed

_INT_RE = re.compile(r"^([+-]?)(\d+)$")


class _DropTimeoutWarning(logging.Filter):
    """math-verify warns once that its timeout is off; here that is deliberate (see module doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


def canonical_integer(text: str) -> Optional[str]:
    """``"+0042 "`` -> ``"42"``; ``"$-7$"`` -> ``"-7"``; None unless ``text`` is a plain integer.

    Used by the scorer's fast path: two plain integers are equal iff their canonical strings are.
    Thousands separators, decimals and units are *not* handled here (those go to math-verify).
    """
    s = text.strip()
    if s.startswith("$") and s.endswith("$") and len(s) >= 2:
        s = s.strip("$").strip()
    m = _INT_RE.match(s)
    if m is None:
        return None
    digits = m.group(2).lstrip("0") or "0"
    sign = "-" if m.group(1) == "-" and digits != "0" else ""
    return sign + digits


def parse_answer(text: str) -> list[Any]:
    """Parse a short answer (box content or a reference) into math-verify's representation.

    Bare LaTeX such as ``\\frac12`` parses to nothing unless delimited, so the text is tried as
    ``\\boxed{text}`` first, then as plain text, then inside ``$...$``. Empty list = unparseable.
    """
    from math_verify import parse

    s = text.strip()
    if not s:
        return []
    if "\\boxed" in s or "$" in s or "\\(" in s or "\\[" in s:
        candidates = [s]
    else:
        candidates = [f"\\boxed{{{s}}}", s, f"${s}$"]
    for cand in candidates:
        parsed = parse(cand, parsing_timeout=None)
        if parsed:
            return parsed
    return []


def verify_answer(pred: str, reference: str) -> bool:
    """True iff the predicted short answer is equivalent to the reference (math-verify rules).

    ``pred`` is the answer itself (e.g. the content of the last box), not a whole response.
    Not time-bounded (see module doc); works from any thread.
    """
    if not pred.strip() or not reference.strip():
        return False
    a, b = canonical_integer(pred), canonical_integer(reference)
    if a is not None and b is not None:
        return a == b
    from math_verify import verify

    gold = parse_answer(reference)
    target = parse_answer(pred)
    if not gold or not target:
        return False
    return bool(verify(gold, target, timeout_seconds=None))


def compute_reward(response_text: str, reference: str, truncated: bool) -> float:
    """Binary reward of one response: 1.0 iff not truncated and its last box matches the reference.

    No box (or an empty / unclosed last box) -> 0.0; truncated at the global max length -> 0.0
    ("overlong = wrong", PAPER.md). Not time-bounded (see module doc).
    """
    if truncated:
        return 0.0
    pred = extract_last_boxed(response_text)
    if not pred:
        return 0.0
    return 1.0 if verify_answer(pred, reference) else 0.0
