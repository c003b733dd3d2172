"""Final-answer extraction: the content of the last ``\\boxed{...}`` of a response.

Pure string code (no sympy), cheap enough to run in the caller before any worker round trip.
"""

from __future__ import annotations

import re
from typing import Optional

# \boxed or \fbox, not followed by a letter (so \boxeda is not a box command).
_BOX_CMD = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def braced_group(text: str, open_pos: int) -> Optional[str]:
    """Content of the brace group opening at ``text[open_pos] == '{'``; None if it never closes.

    Escaped braces (``\\{``, ``\\}``) do not count towards the nesting depth.
    """
    depth = 0
    i = open_pos
    n = len(text)
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


def _bare_argument(text: str, pos: int) -> Optional[str]:
    """Argument of ``\\boxed 5`` style boxes: the run of characters up to whitespace or ``$``."""
    m = re.match(r"[^\s$]+", text[pos:])
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
