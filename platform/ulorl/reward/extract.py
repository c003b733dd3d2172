"""Final-answer extraction from a response, in one of two modes (``reward.extraction``):

``boxed``           the last ``\\boxed{...}`` (with the boxes written right before it, joined:
                    ``\\boxed{-2} \\text{ and } \\boxed{1}`` -> ``-2, 1``); no box -> no answer.
                    The training default: "no box -> 0" is a deliberate format incentive.
``boxed_or_final``  the same, and when there is no box a final-answer statement: the last
                    "final answer: X" / "the answer is X" / "Answer: X", else a response that is
                    only an answer (one short line or one math span), else a lone option letter on
                    the last line. For evaluating other models' outputs (``ulorl-eval``), judges'
                    fallbacks and data cleaning.

Pure string code (no sympy), cheap enough to run in the caller before any worker round trip.
"""

from __future__ import annotations

import re
from typing import Literal, Optional

ExtractionMode = Literal["boxed", "boxed_or_final"]
EXTRACTION_MODES: tuple[str, ...] = ("boxed", "boxed_or_final")

# \boxed or \fbox, not followed by a letter (so \boxeda is not a box command).
_BOX_CMD = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def braced_group(text: str, open_pos: int, limit: Optional[int] = None) -> Optional[str]:
    """Content of the brace group opening at ``text[open_pos] == '{'``; None if it never closes
    (before ``text[limit]`` when a limit is given).

    Escaped braces (``\\{``, ``\\}``) do not count towards the nesting depth.
    """
    depth = 0
    i = open_pos
    n = len(text) if limit is None else min(limit, len(text))
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2  # skip the escaped character (\{, \}, \\ ...)
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[open_pos + 1 : i]
        i += 1
    return None


_BARE_ARG = re.compile(r"[^\s$]+")


def _bare_argument(text: str, pos: int, endpos: Optional[int] = None) -> Optional[str]:
    """Argument of ``\\boxed 5`` style boxes: the run of characters up to whitespace or ``$``."""
    m = _BARE_ARG.match(text, pos, len(text) if endpos is None else endpos)
    return m.group(0) if m else None


def extract_last_boxed(text: str) -> Optional[str]:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed 5`` in ``text``.

    Nested braces are handled (``\\boxed{\\frac{a}{b}}`` -> ``\\frac{a}{b}``). Returns None when
    there is no box or when the last box is never closed (a response cut mid-answer); an empty
    box gives ``""``. The result is stripped of surrounding whitespace.
    """
    matches = list(_BOX_CMD.finditer(text))
    if not matches:
        return None
    end = matches[-1].end()
    rest = text[end:]
    stripped = rest.lstrip()
    pos = end + (len(rest) - len(stripped))
    if stripped.startswith("{"):
        content = braced_group(text, pos)
        return None if content is None else content.strip()
    arg = _bare_argument(text, pos)
    return None if arg is None else arg.strip()


# Text allowed between two boxes of one final answer: separators, "and"/"or", spacing, delimiters.
_BOX_GAP = re.compile(r"^(?:\s|[,;$.]|\\quad|\\qquad|\\[,;!]|\\[\[\]()]"
                      r"|\\text\s*\{\s*(?:and|or|,)?\s*\}|\band\b|\bor\b)*$")
_MAX_BOX_GAP = 60
_ANSWER_MARK = re.compile(
    r"(?:final\s+answer|the\s+answer|^[ \t*#]*answer)\**\s*(?:is|would\s+be|should\s+be|[:=])?\s*:?\s*\**\s*",
    re.IGNORECASE | re.MULTILINE,
)
_LONE_LETTER = re.compile(r"^\s*\**\s*\(?([A-J])\)?\s*\**\.?\s*$")
_MAX_LONE_CHARS = 40
_MAX_STATEMENT_CHARS = 200


def _box_at(text: str, m: re.Match[str], limit: Optional[int] = None) -> tuple[int, Optional[str]]:
    """(end, content) of the box command matched by ``m``; content None when it does not close
    (before ``limit``)."""
    rest = text[m.end():limit]
    stripped = rest.lstrip()
    pos = m.end() + (len(rest) - len(stripped))
    if stripped.startswith("{"):
        content = braced_group(text, pos, limit)
        return (pos + len(content) + 2 if content is not None else len(text)), content
    content = _bare_argument(text, pos, limit)
    return (pos + len(content) if content is not None else len(text)), content


def extract_boxed_answer(text: str) -> Optional[str]:
    """The last box, joined with the boxes written right before it (only separators, "and",
    spacing between them): ``\\boxed{(3,3)} \\text{ and } \\boxed{(1,1)}`` -> ``(3,3), (1,1)``.

    None when there is no box or the last box never closes; identical boxes count once. Each
    earlier box is only read up to the next one, so this stays linear in ``len(text)``.
    """
    matches = list(_BOX_CMD.finditer(text))
    if not matches:
        return None
    _, last = _box_at(text, matches[-1])
    if last is None:
        return None
    parts = [last.strip()]
    for j in range(len(matches) - 2, -1, -1):
        nxt = matches[j + 1].start()
        end, content = _box_at(text, matches[j], nxt)
        gap = text[end:nxt] if content is not None else ""
        if content is None or len(gap) > _MAX_BOX_GAP or not _BOX_GAP.match(gap):
            break
        parts.insert(0, content.strip())
    parts = [p for p in parts if p]
    if len(set(parts)) <= 1:
        return parts[0] if parts else ""
    return ", ".join(parts)


def _math_span(s: str) -> Optional[str]:
    """Content of the math span ``s`` starts with (``$..$``, ``$$..$$``, ``\\(..\\)``, ``\\[..\\]``)."""
    for lo, hi in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")):
        if s.startswith(lo):
            i = len(lo)
            while True:
                j = s.find(hi, i)
                if j < 0:
                    return None
                if hi == "$" and s[j - 1] == "\\":  # an escaped dollar (currency) inside
                    i = j + 1
                    continue
                return s[len(lo):j].strip()
    return None


def _statement_value(tail: str) -> Optional[str]:
    """The answer at the start of ``tail`` (the text after "the answer is"): a math span, else
    the text up to the end of the sentence or line."""
    t = tail.lstrip()
    span = _math_span(t)
    if span is not None:
        return span or None
    m = re.search(r"\n|(?<!\d)\.(?=\s|$)|\.(?=\s+[A-Z])|[!?](?=\s|$)|\s+I hope\b", t)
    value = (t[: m.start()] if m else t).strip().strip("*").strip()
    value = value.rstrip(".").strip()
    return value if value and len(value) <= _MAX_STATEMENT_CHARS else None


def extract_final_statement(text: str) -> Optional[str]:
    """The answer of a response without a box: the last "final answer: X" / "the answer is X" /
    "Answer: X"; else the whole response when it is only an answer (one short line, or one math
    span); else a lone option letter on the last line. None when none of these is there."""
    marks = list(_ANSWER_MARK.finditer(text))
    for m in reversed(marks):
        value = _statement_value(text[m.end():])
        if value:
            return value
    s = text.strip()
    if s:
        span = _math_span(s)
        if span is not None and len(span) + 4 >= len(s) - 2 and (
                s.endswith("$") or s.endswith("\\)") or s.endswith("\\]")):
            return span or None
        if "\n" not in s and len(s) <= _MAX_LONE_CHARS:
            return s.rstrip(".").strip() or None
        last = s.splitlines()[-1]
        lm = _LONE_LETTER.match(last)
        if lm:
            return lm.group(1)
    return None


def extract_answer(text: str, mode: str = "boxed") -> Optional[str]:
    """The final answer of ``text`` under extraction ``mode`` (see module doc); None = no answer."""
    if mode not in EXTRACTION_MODES:
        raise ValueError(f"unknown extraction mode {mode!r}; expected one of {EXTRACTION_MODES}")
    boxed = extract_boxed_answer(text)
    if boxed is not None or mode == "boxed":
        return boxed
    if _BOX_CMD.search(text):  # a box that never closes: cut mid-answer, no fallback
        return None
    return extract_final_statement(text)
