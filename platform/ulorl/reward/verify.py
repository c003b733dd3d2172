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
from typing import Optional

from ulorl.reward.compare import answers_match, fast_verdict
from ulorl.reward.extract import extract_answer

_INT_RE = re.compile(r"^([+-]?)(\d+)$")


class _DropTimeoutWarning(logging.Filter):
    """math-verify warns once that its timeout is off; here that is deliberate (see module doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


def canonical_integer(text: str) -> Optional[str]:
    """``"+0042 "`` -> ``"42"``; ``"$-7$"`` -> ``"-7"``; None unless ``text`` is a plain integer.

    Two plain integers are equal iff their canonical strings are. Thousands separators, decimals
    and units are *not* handled here (``ulorl.reward.compare.fast_verdict`` normalises first).
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


def verify_answer(pred: str, reference: str, problem: Optional[str] = None) -> bool:
    """True iff the predicted short answer is equivalent to the reference.

    ``pred`` is the answer itself (e.g. the content of the last box), not a whole response;
    ``problem`` (optional) gives option texts and tells an ordered answer from a set. The rules
    are in ``ulorl.reward.compare``. Not time-bounded (see module doc); works from any thread.
    """
    if not pred.strip() or not reference.strip():
        return False
    quick = fast_verdict(pred, reference)
    if quick is not None:
        return quick
    return answers_match(pred, reference, problem)


def compute_reward(
    response_text: str, reference: str, truncated: bool, extraction: str = "boxed", problem: Optional[str] = None
) -> float:
    """Binary reward of one response: 1.0 iff not truncated and its final answer matches.

    ``extraction`` is ``boxed`` (training default: no box -> 0.0) or ``boxed_or_final`` (a final
    answer statement when there is no box, and with ``problem`` a closing sentence that names the
    asked quantity; ``ulorl.reward.extract``). An empty / unclosed last box
    -> 0.0; truncated at the global max length -> 0.0 ("overlong = wrong", PAPER.md). Not
    time-bounded (see module doc).
    """
    if truncated:
        return 0.0
    pred = extract_answer(response_text, extraction, problem)
    if not pred:
        return 0.0
    return 1.0 if verify_answer(pred, reference, problem) else 0.0
