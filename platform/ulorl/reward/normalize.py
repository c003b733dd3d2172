"""String normalisation of short answers before comparison (pure string code, no sympy).

Each function does one thing and is safe on any answer; the decorations of a *number* (units,
``\\text{}``, degrees, percent, currency, thousands separators) are removed only when what is left
is a number, so ``\\text{all odd } n`` stays as it is.

    >>> normalize_answer(r"\\$31,800")
    '31800'
    >>> normalize_answer(r"8\\sqrt{3}\\text{ square inches}")
    '8\\\\sqrt{3}'
"""

from __future__ import annotations

import functools
import re
from typing import Optional

from ulorl.reward.extract import braced_group, extract_boxed_answer

# Spacing / sizing commands with no mathematical meaning.
_SPACING = re.compile(r"(?<!\\)\\[,;:! ]|\\q?quad(?![A-Za-z])|\\displaystyle(?![A-Za-z])|~")
# "12,\!000" (the MATH dataset's thousands notation) before spacing is dropped.
_LATEX_THOUSANDS = re.compile(r"(?<=\d)(?:,\\!|\{,\}|,\\,)\s*(?=\d{3}(?!\d))")
# "\\frac" written with a doubled backslash (an escaping slip in the source) -> "\frac".
_DOUBLED_BACKSLASH = re.compile(r"\\\\(?=[A-Za-z]{2,})")
_LEFT_RIGHT = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])\s*(\\?[()\[\]{}|.])")
_FRAC_VARIANTS = re.compile(r"\\[dtc]frac(?![A-Za-z])")
_DEGREES = re.compile(r"\s*(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°|\\degree|\^\s*\{\s*o\s*\})")
_PERCENT = re.compile(r"\s*(?:\\%|%|\\text\{\s*%\s*\}|\s+percent\b|\s+pct\b)\s*$")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|textit|mbox|mathrm|mathbf|operatorname)\s*\{")
# A trailing run of unit words ("cm", "square inches", "dollars", "m^2") after a number.
_UNIT_WORDS = re.compile(r"\s*(?:[A-Za-z]+(?:/[A-Za-z]+)?\.?(?:\^\{?\d\}?)?(?:\s+|$))+$")  # "km/h" too
# Units that may be written glued to the number ("5cm", "3h"); any other letters glued to a number
# are part of the answer ("2i", "2\\pi", "1/A", "2^k").
_GLUED_UNITS = frozenset(
    "m cm mm km g kg mg s ms h hr hrs min l L ml mL ft in yd mi lb lbs oz N J W V Hz K Pa mph kmh cal kcal".split()
)
# A lone one-letter word after a space is a unit only if it is one of these ("5 m", not "5 x").
_LETTER_UNITS = frozenset("m g s h l L N J W V K".split())
_THOUSANDS = re.compile(r"^([+-]?)(\d{1,3}(?:(?:,|\{,\}|\\,|\\!|\\ | )\d{3})+)(\.\d+)?$")
_THOUSANDS_SEP = re.compile(r"\{,\}|\\,|\\!|\\ |,| ")
# LaTeX commands that keep an expression numeric (constants and operators, no variables).
_NUMERIC_CMDS = ("frac", "sqrt", "pi", "cdot", "times", "div", "pm", "mp", "infty", "ln", "log", "exp", "sin",
                 "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "e")
_NUMERIC_CMD_RE = re.compile(r"\\(?:" + "|".join(_NUMERIC_CMDS) + r")(?![A-Za-z])")
_NUMBER_CHARS = re.compile(r"[\d\s.+\-*/^(){}\[\]]+")
# Decorations are only looked for in answers up to this long (the unit-word pattern is quadratic
# in the worst case, and this runs in the caller, outside the scorer's time bound).
MAX_DECORATED_CHARS = 200
_OPTION = re.compile(r"^\(?\s*([A-J])\s*\)?\s*[.:]?$")
_SCIENTIFIC = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))[eE]([+-]?\d+)$")
_LONE_DOLLAR = re.compile(r"^\$\s*(?=[\d.])")
# "\text{.088 m}^2": a text group that holds the number itself, not only its unit.
_TEXT_NUMBER = re.compile(r"^\\(?:text|textrm|mbox|mathrm)\s*\{\s*(?=[\d.])")
_WHOLE_TEXT = re.compile(r"^\\(?:text|textbf|textit|textrm|mbox|mathrm|mathbf)\s*\{")
# Prose qualifiers around a math answer: "approximately 5", "5 \text{ only}", "\frac{\sqrt3}{3} \approx 0.577".
_LEADING_QUALIFIER = re.compile(
    r"^(?:\\text\s*\{\s*)?(?:the\s+(?:final\s+)?(?:answer|value|result)\s+is|final\s+answer\s*:|answer\s*:"
    r"|approximately|approx\.|about|exactly|only)\s*\}?\s*(?=\S)", re.IGNORECASE)
_TRAILING_QUALIFIER = re.compile(
    r"(?<=\S)\s*(?:\\text\s*\{\s*\(?\s*(?:only|exactly|approximately|approx\.?)\s*\)?\s*\}"
    r"|\\approx\s*-?[\d.]+(?:\\ldots|\.\.\.)?)$")


def strip_math_delimiters(s: str) -> str:
    """``$x$`` / ``$$x$$`` / ``\\(x\\)`` / ``\\[x\\]`` around the whole string -> ``x`` (repeatedly)."""
    s = s.strip()
    while True:
        before = s
        if len(s) >= 4 and s.startswith("$$") and s.endswith("$$"):
            s = s[2:-2].strip()
        elif len(s) >= 2 and s.startswith("$") and s.endswith("$") and not s.endswith("\\$"):
            s = s[1:-1].strip()
        for lo, hi in (("\\(", "\\)"), ("\\[", "\\]")):
            if len(s) >= 4 and s.startswith(lo) and s.endswith(hi):
                s = s[2:-2].strip()
        if s == before:
            return s


def strip_outer_braces(s: str) -> str:
    """A plain ``{...}`` group around the whole string (LaTeX grouping, not a set) -> its content."""
    if s.startswith("{") and s.endswith("}"):
        inner = braced_group(s, 0)
        if inner is not None and len(inner) + 2 == len(s):
            return inner.strip()
    return s


def boxed_content(s: str) -> str:
    """A reference written with boxes (``$\\boxed{1}\\boxed{2}$``, a worked solution ending in a
    box) -> the boxed answer (``1, 2``); other strings unchanged."""
    if "\\boxed" not in s and "\\fbox" not in s:
        return s
    inner = extract_boxed_answer(s)
    return inner if inner else s


def strip_escaped_dollars(s: str) -> str:
    """Remove currency signs: ``\\$16.56`` -> ``16.56`` (``\\$`` is text, never a math delimiter)."""
    return s.replace("\\$", "")


def strip_spacing(s: str) -> str:
    """Drop spacing / sizing commands and ``\\dfrac``/``\\tfrac`` variants (``\\left(`` -> ``(``)."""
    s = _LEFT_RIGHT.sub(r"\1", s)
    s = _FRAC_VARIANTS.sub(r"\\frac", s)
    s = _SPACING.sub(" ", s)
    s = re.sub(r"(?<!\\)([(\[])\s+", r"\1", s)
    s = re.sub(r"\s+([)\]])", r"\1", s)
    return re.sub(r"\s+", " ", s).strip()


def strip_trailing_period(s: str) -> str:
    return s[:-1].rstrip() if s.endswith(".") and not s.endswith("...") else s


def is_numeric_expression(s: str) -> bool:
    """True for a constant expression: digits, operators, ``\\frac``/``\\sqrt``/``\\pi`` ..., no variables."""
    t = _NUMERIC_CMD_RE.sub(" ", s)
    return bool(_NUMBER_CHARS.fullmatch(t)) and any(c.isdigit() for c in t)


def is_complete_expression(s: str) -> bool:
    """Balanced brackets and no dangling operator at the end: ``-\\frac{5}{`` / ``1/`` / ``2^`` are
    pieces of an expression (what is left when a variable is mistaken for a unit), not a number."""
    t = s.rstrip()
    if not t or t[-1] in "+-*/^_{(.,=\\" or t.endswith("\\cdot") or t.endswith("\\times"):
        return False
    depth = 0
    for c in t:
        depth += 1 if c in "({[" else -1 if c in ")}]" else 0
        if depth < 0:
            return False
    return depth == 0


def strip_unit_words(t: str) -> str:
    """``t`` without a trailing run of unit words when what is left is a complete constant
    expression; else ``t``. A unit glued to the number must be a known one (``5cm``), a lone letter
    after a space a one-letter unit (``5 m``): ``2i``, ``2\\pi``, ``1/A``, ``-\\frac{5}{x^6}`` stay."""
    m = _UNIT_WORDS.search(t)
    if m is None or m.start() == 0:
        return t
    head, unit = t[: m.start()], t[m.start():]
    words = re.findall(r"[A-Za-z]+", unit)
    glued = not unit[:1].isspace()
    if head.endswith(("\\", "^", "_", "/", "{")):
        return t
    if glued and (words[0] not in _GLUED_UNITS or not (head[-1:].isdigit() or head.endswith("}"))):
        return t
    if not glued and len(words) == 1 and len(words[0]) == 1 and words[0] not in _LETTER_UNITS:
        return t
    head = head.strip()
    return head if is_numeric_expression(head) and is_complete_expression(head) else t


def plain_thousands(s: str) -> Optional[str]:
    """``1,000`` / ``1 000`` / ``12,\\!000`` / ``1{,}000.5`` -> ``1000`` / ``1000.5``; None if not one."""
    m = _THOUSANDS.match(s.strip())
    if m is None:
        return None
    return m.group(1) + _THOUSANDS_SEP.sub("", m.group(2)) + (m.group(3) or "")


_POWER_TAIL = re.compile(r"\s*\^\s*(?:\{\s*[23]\s*\}|[23])$")


def _strip_trailing_text(s: str) -> str:
    """Remove a trailing ``\\text{...}`` group, squared / cubed or not (``8\\sqrt{3}\\text{ square
    inches}`` -> ``8\\sqrt{3}``, ``45 \\mathrm{ cm}^{2}`` -> ``45``)."""
    for m in reversed(list(_TEXT_CMD.finditer(s))):
        inner = braced_group(s, m.end() - 1)
        if inner is None:
            continue
        end = m.end() + len(inner) + 1
        if end == len(s) or _POWER_TAIL.fullmatch(s[end:]):
            return s[: m.start()].rstrip()
    return s


def strip_number_decorations(s: str) -> str:
    """Units, ``\\text{}``, degrees, percent and thousands separators around a *number* removed.

    Only applied when the result is a numeric expression; otherwise ``s`` comes back unchanged,
    so ``\\text{all odd } n`` or ``x^\\circ`` of a variable keep their meaning.
    """
    t = s.strip()
    if len(t) > MAX_DECORATED_CHARS:
        return t
    for _ in range(4):  # "12.5\%", "30^\circ", "5 \text{ cm}^2", "\$1,000 dollars" ...
        before = t
        t = _DEGREES.sub("", t).strip()
        t = _PERCENT.sub("", t).strip()
        t = _strip_trailing_text(t)
        if re.search(r"[A-Za-z]\^\{?\d\}?$", t) and "\\" not in t:  # "cm^2", not "x^{6}}" of a \\frac
            squared = re.sub(r"\^\{?\d\}?$", "", t)
            if strip_unit_words(squared) != squared:
                t = squared
        t = strip_unit_words(t)
        if t == before:
            break
    plain = plain_thousands(t)
    if plain is not None:
        t = plain
    if t and is_numeric_expression(t) and is_complete_expression(t):
        return t
    plain = plain_thousands(s.strip())
    return plain if plain is not None else s.strip()


def scientific_to_latex(s: str) -> str:
    """``1e-5`` / ``2.5E3`` -> ``1\\times 10^{-5}`` / ``2.5\\times 10^{3}`` (math-verify would read
    ``e`` as Euler's number)."""
    m = _SCIENTIFIC.match(s.strip())
    return f"{m.group(1)}\\times 10^{{{int(m.group(2))}}}" if m else s


def unwrap_text_number(s: str) -> str:
    """``\\text{.088 m}^2`` -> ``.088 m^2``: a text group that starts with the number itself (so
    the number's decorations can be removed); ``\\text{all odd } n`` stays."""
    m = _TEXT_NUMBER.match(s)
    if m is None:
        return s
    inner = braced_group(s, m.end() - 1)
    if inner is None:
        return s
    return (inner + s[m.end() + len(inner) + 1:]).strip()


def unwrap_whole_text(s: str) -> str:
    """``\\text{Yes}`` / ``\\textbf{(B)}`` spanning the whole answer -> its content."""
    m = _WHOLE_TEXT.match(s)
    if m is None:
        return s
    inner = braced_group(s, m.end() - 1)
    if inner is not None and m.end() + len(inner) + 1 == len(s):
        return inner.strip()
    return s


def strip_qualifiers(s: str) -> str:
    """Prose around a math answer: ``approximately 5`` / ``the answer is 5`` / ``5 \\text{ only}`` /
    ``\\frac{\\sqrt{3}}{3} \\approx 0.577`` -> the answer. Qualifiers that change the meaning
    ("at least", "at most") are kept."""
    t = _TRAILING_QUALIFIER.sub("", s).strip()
    if not re.search(r"[\d\\]", t):
        t = s  # "x \\approx 11": the approximation is the answer, not a qualifier of one
    t = _LEADING_QUALIFIER.sub("", t).strip()
    return t or s


def option_letter(s: str) -> Optional[str]:
    """The option letter of a multiple-choice answer: ``(B)``, ``B``, ``\\text{(B)}``, ``B.`` -> ``B``."""
    t = strip_math_delimiters(s.strip())
    t = re.sub(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}", r"\1", t).strip().strip("*").strip()
    m = _OPTION.match(t)
    return m.group(1) if m else None


_PLAIN_NUMBER = re.compile(r"\s*[+-]?\d+(?:\.\d+)?\s*")
_CACHED_CHARS = 400  # answers up to this long are cached (G responses of a prompt share its reference)


def normalize_answer(s: str) -> str:
    """A short answer in comparable form: delimiters, an outer box, currency, spacing, a trailing
    period and the decorations of a number removed. Pure; short answers are cached."""
    if _PLAIN_NUMBER.fullmatch(s):
        return s.strip()  # the common case (integer answers) needs none of the steps below
    return _normalize_cached(s) if len(s) <= _CACHED_CHARS else _normalize(s)


@functools.lru_cache(maxsize=4096)
def _normalize_cached(s: str) -> str:
    return _normalize(s)


def _normalize(s: str) -> str:
    t = _DOUBLED_BACKSLASH.sub(r"\\", s)
    t = strip_escaped_dollars(t)
    t = join_math_items(t.strip())
    t = strip_math_delimiters(t)
    t = boxed_content(t)
    t = strip_math_delimiters(t)
    if t.count("$") == 1:  # "$15": an unescaped currency sign, not a math delimiter
        t = _LONE_DOLLAR.sub("", t)
    t = _LATEX_THOUSANDS.sub(",", t)
    t = strip_spacing(t)
    t = strip_outer_braces(t)
    t = strip_trailing_period(t)
    t = strip_qualifiers(t)
    t = unwrap_whole_text(t)
    t = unwrap_text_number(t)
    t = scientific_to_latex(t)
    t = _ONE_CHAR_SUBSCRIPT.sub(r"_{\1}", t)  # E_1 = E_{1} (math-verify reads them as two symbols)
    return unwrap_text_symbols(strip_assignment_decorations(strip_number_decorations(t)))


_ONE_CHAR_SUBSCRIPT = re.compile(r"(?<=[A-Za-z}])_([A-Za-z0-9])")
_ASSIGNED = re.compile(r"^([A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?\s*=\s*)(?!.*=)(.+)$")


def strip_assignment_decorations(s: str) -> str:
    """``x = 5 \\text{ cm}`` -> ``x = 5``: the decorations of the number a named value is set to."""
    m = _ASSIGNED.match(s)
    if m is None:
        return s
    value = strip_number_decorations(m.group(2))
    return m.group(1) + value if value != m.group(2).strip() and is_numeric_expression(value) else s


# "\text{ML}", "\mathrm{A}": points / segments (capitals) set in text; lower case may be a unit ("\mathrm{~m}")
_TEXT_SYMBOL = re.compile(r"\\(?:text|textrm|mathrm|mbox)\s*\{\s*([A-Z]{1,4}'*)\s*\}")


def unwrap_text_symbols(s: str) -> str:
    """``\\text{ML} \\perp \\text{NK}`` -> ``ML \\perp NK``: symbols (up to four capitals: points,
    segments) set in a text group, inside a longer answer; words and units stay as they are.
    Runs after a number's decorations are gone, so ``5 \\text{A}`` has already lost its unit."""
    return _TEXT_SYMBOL.sub(r"\1", s) if "\\" in s and _TEXT_SYMBOL.search(s) else s


def join_math_items(s: str) -> str:
    """``$1$, $2$`` / ``$1$ and $2$`` (items each in its own math span) -> ``$1, 2$`` / ``$1 and 2$``."""
    if len(s) >= 2 and s.startswith("$") and s.endswith("$") and not s.startswith("$$"):
        return re.sub(r"\$\s*(,|;|\band\b|\bor\b)\s*\$",
                      lambda m: m.group(1) + " " if m.group(1) in ",;" else f" {m.group(1)} ", s)
    return s


def has_percent(s: str) -> bool:
    """True when the answer is a number followed by a percent sign (``12.5\\%``, ``12.5%``)."""
    return bool(_PERCENT.search(strip_math_delimiters(s.strip()).rstrip(".")))
