"""Comparison of a predicted short answer with a reference: structure first, math-verify last.

The order of the checks in ``answers_match``:

1. both normalised (``ulorl.reward.normalize``) and identical -> equal (words of two or more
   letters ignore case: ``YES`` = ``Yes``; two words of four or more letters are equal only so,
   never as math-verify's products of symbols); a percentage on one side of two numbers:
   ``60%`` = ``0.6`` = ``60``;
2. multiple choice: letter vs letter, a letter vs an option's text when ``problem`` lists options
   (``(A) ...``, ``A. ...``, ``A) ...``), and a letter followed by its option's text (``(E) 9:30``,
   ``B. 45 cm``: the letter counts, and the text must not contradict the option);
3. alternatives in the reference: ``\\binom{10}{3} = 120`` (a constant equal to a value) accepts
   either side; ``0.5 or \\frac12`` (two forms of one value) accepts either form;
4. lists: a reference of several top-level items (``2, 4, 3``; ``(1,2), (3,4)``) needs the same
   number of items, compared in order unless the reference is a set (``\\{...\\}``, or the problem
   asks for all / possible solutions / roots / values and not for an order); a tuple against a
   bare list of the same items (``(1, 2, 3)`` vs ``1, 2, 3``; two items only when the problem asks
   for an ordered pair or a point, as ``(1, 2)`` is also an interval) compares item by item, in order;
5. inequalities against intervals: ``1 < x \\le 3`` = ``(1, 3]``, ``x > 2`` = ``(2, \\infty)``;
6. function definitions: ``f(x)=2x`` vs ``f(y)=2y`` compare the right-hand sides after renaming
   the variable;
7. math-verify, except that two *exact* constants (no floats, no variables) compare exactly
   (math-verify's numeric test rounds ``2^{1009}/(2^{1009}+2018) - 2^{1009}/(2^{1009}+1009)`` to 0);
   ``\\ln`` and an unsubscripted ``\\log`` are one function when the two sides use one each; a
   reference rounded to two or more decimals accepts an exact non-terminating value that rounds to
   it (``\\sqrt{2}`` for ``1.41``), never a different decimal; decimals and scientific notation
   compare by value at any magnitude (``ulorl.reward.numerals``; math-verify's fixed decimal places
   made every pair of values below ~1e-7 equal, opposite signs included), also inside tuples,
   sets and intervals that math-verify accepted.

Steps 1-6 are string code; step 7 imports sympy / math-verify and is not time-bounded (the
scorer runs it in worker processes, see ``ulorl.reward.scorer``).
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal
from itertools import permutations
from typing import Any, Optional

from ulorl.reward.forms import (
    asks_rounding,
    asks_simplest,
    asks_system,
    expand_plus_minus,
    names_ordered_values,
    rationalize_decimals,
    strip_condition,
    unsimplified,
    yes_no_lead,
)
from ulorl.reward.normalize import (
    has_percent,
    is_numeric_expression,
    normalize_answer,
    option_letter,
    plain_thousands,
    strip_escaped_dollars,
    strip_math_delimiters,
)
from ulorl.reward.numerals import numeral_value, numerals_equal

_OPEN, _CLOSE = "([{", ")]}"
_SET_WORDS = re.compile(r"\ball\b|\bsolutions\b|\broots\b|\bvalues\b|\bany order\b|\bzeros\b|\bpossible\b|\bsolve\b",
                        re.I)
_ORDER_WORDS = re.compile(r"\border\b|\brespectively\b|\bordered\b|\bin that order\b", re.I)
_FUNC_DEF = re.compile(r"^([A-Za-z])\s*\(\s*([A-Za-z])\s*\)\s*=\s*(.+)$")
_OPTION_MARK = re.compile(r"(?:^|[\s$])\(?([A-J])[).:]\s+|\(([A-J])\)\s*")
_INT = re.compile(r"^[+-]?\d+$")
_WORDS = re.compile(r"^[A-Za-z]{2,}(?:[ -][A-Za-z]+)*$")
# "(E) 9:30", "B. 45 cm", "(C) $6+\\pi$ m": an option letter followed by (a copy of) its text.
_LETTER_LEAD = re.compile(r"^\(\s*([A-J])\s*\)\s*[.:]?\s*(.+)$|^([A-J])\s*[.:)]\s+(.+)$", re.S)
# "\textbf{(B) } 23": an option letter set in a text command, before its option text
_TEXT_LETTER = re.compile(r"^\\(?:textbf|text|mathrm|mathbf)\s*\{\s*(\(\s*[A-J]\s*\)|[A-J][.:)])\s*\}")
_PAIR_WORDS = re.compile(r"\bordered pairs?\b|\bpoints?\b|\bcoordinates\b|\bvectors?\b", re.I)
_REL = r"(<|>|\\leq?|\\geq?|\\le|\\ge|≤|≥)"
_CHAIN = re.compile(rf"^(.+?)\s*{_REL}\s*([A-Za-z])\s*{_REL}\s*(.+)$")
_HALF = re.compile(rf"^([A-Za-z])\s*{_REL}\s*(.+)$")
_NUMERIC_LEFT = re.compile(r"[A-Za-z]")
MAX_ITEMS_PERMUTED = 6  # set comparison tries every order up to this many items (6! = 720)


def split_items(s: str) -> list[str]:
    """Top-level comma / semicolon / "and" separated items: ``(1,2), (3,4)`` -> two tuples.

    Brackets of any kind open and close nesting (``[0,1)`` is one interval); ``\\{1,2\\}`` is one
    set. ``1,000`` style thousands are one number (see ``normalize.plain_thousands``).
    """
    t = s.strip()
    if plain_thousands(t) is not None:
        return [t]
    t = re.sub(r"\\text\s*\{\s*(and|or)\s*\}", r",", t)
    t = re.sub(r"\s+(?:and|or)\s+|(?<=[)\]}])\s*(?:and|or)\s*(?=[(\[{])", ",", t)
    out, depth, cur, i = [], 0, [], 0
    while i < len(t):
        c = t[i]
        if c == "\\" and i + 1 < len(t):
            if t[i + 1] in "{}":
                depth += 1 if t[i + 1] == "{" else -1
            cur.append(t[i : i + 2])
            i += 2
            continue
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        if c in ",;" and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    out.append("".join(cur).strip())
    return [x for x in out if x]


_TUPLE = re.compile(r"^\(.*\)$")
_NAMED = re.compile(r"^([A-Za-z])(?:_\{?([A-Za-z0-9]+)\}?)?\s*=(?!=)")
_PM = re.compile(r"\\(?:pm|mp)(?![A-Za-z])")
_TOKEN = re.compile(r"\\[A-Za-z]+|.", re.S)
_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?\s*=[^=]")


def unwrap_set(s: str) -> str:
    """``\\{1, 2\\}`` -> ``1, 2`` (the items of a set literal); other strings unchanged."""
    t = s.strip()
    if t.startswith("\\{") and t.endswith("\\}") and len(split_items(t)) == 1:
        return t[2:-2].strip()
    return t


def written_as_set(reference: str) -> bool:
    """The raw reference is a set literal: ``\\{...\\}``, or ``{...}`` in plain text."""
    t = strip_math_delimiters(strip_escaped_dollars(reference)).strip()
    return (t.startswith("\\{") and t.endswith("\\}")) or (t.startswith("{") and t.endswith("}") and "," in t)


def _dedupe(items: list[str]) -> list[str]:
    seen, out = set(), []
    for x in items:
        key = re.sub(r"\s+", "", x)
        if key not in seen:
            seen.add(key)
            out.append(x)
    return out


def is_set_reference(reference: str, problem: Optional[str]) -> bool:
    """Order-free comparison of list items: the reference is written as a set, it lists tuples
    (solutions ``(1,2), (2,1)``) or named values (``a_3 = 2, a_{37} = 19``), or the problem asks
    for all solutions / roots / values (and does not ask for an order)."""
    r = reference.strip()
    if r.startswith("\\{") and r.endswith("\\}"):
        return True
    items = split_items(r)
    if len(items) > 1 and (all(_TUPLE.match(x) for x in items) or all(_ASSIGNMENT.match(x) for x in items)):
        return True
    if problem:
        return (bool(_SET_WORDS.search(problem)) and not _ORDER_WORDS.search(problem)
                and not names_ordered_values(problem))  # "the values of T(10), T(11), T(12)": in order
    return False


def parse_options(problem: Optional[str]) -> dict[str, str]:
    """Option letter -> option text of a multiple-choice problem; {} when it lists none.

    Recognised: ``(A) 5 (B) 6``, ``A. 5\\nB. 6``, ``A) 5``, ``$\\textbf{(A) } 5$``. Options must
    run A, B, C ... in order; their text ends where the next option starts.
    """
    if not problem:
        return {}
    text = re.sub(r"\\(?:textbf|text|mathrm)\s*\{\s*(\(?[A-J]\)?[.:]?)\s*\}", r" \1 ", problem)
    marks = [(m.start(), m.end(), m.group(1) or m.group(2)) for m in _OPTION_MARK.finditer(text)]
    expected, chosen = "A", []
    for start, end, letter in marks:
        if letter == expected:
            chosen.append((start, end, letter))
            expected = chr(ord(expected) + 1)
    if len(chosen) < 2:
        return {}
    out = {}
    for j, (_start, end, letter) in enumerate(chosen):
        stop = chosen[j + 1][0] if j + 1 < len(chosen) else len(text)
        body = text[end:stop].strip().strip("$").strip().rstrip(",;").strip()
        out[letter] = body
    return out


def function_rhs(s: str) -> Optional[tuple[str, str, str]]:
    """``f(x) = 2x+1`` -> ``("f", "x", "2x+1")``; None if ``s`` is not a one-variable definition."""
    m = _FUNC_DEF.match(s.strip())
    return (m.group(1), m.group(2), m.group(3).strip()) if m else None


def named_in_order(items: list[str]) -> Optional[list[str]]:
    """``y = 2, x = 1`` -> ``["x = 1", "y = 2"]``: named values sorted by name (``a_2`` before
    ``a_{10}``); None unless every item names a different one-letter variable (optionally subscripted)."""
    keys = []
    for x in items:
        m = _NAMED.match(x.strip())
        if m is None:
            return None
        sub = m.group(2) or ""
        keys.append((m.group(1), int(sub) if sub.isdigit() else -1, sub))
    if len(items) < 2 or len(set(keys)) != len(keys):
        return None
    return [x for _, x in sorted(zip(keys, items))]


def plus_minus_items(pred_items: list[str], ref_items: list[str]) -> Optional[tuple[list[str], list[str]]]:
    """``\\pm 3`` against ``3, -3`` (or the other way round): the side with one ``\\pm`` (or ``\\mp``)
    written out as its two values, ``(pred_items, ref_items)``; None when that is not the case."""
    def expand(items: list[str]) -> Optional[list[str]]:
        if len(items) != 1 or len(_PM.findall(items[0])) != 1:
            return None
        return [_PM.sub("+", items[0]), _PM.sub("-", items[0])]

    if len(ref_items) == 2 and (both := expand(pred_items)) is not None:
        return both, ref_items
    if len(pred_items) == 2 and (both := expand(ref_items)) is not None:
        return pred_items, both
    return None


def rename_parameter(pred: str, reference: str, variable: str, problem: Optional[str] = None) -> Optional[str]:
    """``c x`` against ``k x`` (variable ``x``): ``pred`` with its one free constant renamed to the
    reference's (``k x``), for families of functions that name their parameter differently; None
    unless each side has exactly one one-letter name besides the variable, they differ, and the
    problem's formulas do not use the prediction's name (then it may be a given constant)."""
    ours, theirs = _symbols(pred) - {variable}, _symbols(reference) - {variable}
    if len(ours) != 1 or len(theirs) != 1 or ours == theirs or ours & {"e", "i"} or theirs & {"e", "i"}:
        return None
    if problem and ours & _symbols(" ".join(re.findall(r"\$[^$]*\$", problem))):
        return None
    old, new = ours.pop(), theirs.pop()
    return "".join(new if tok == old else tok for tok in _TOKEN.findall(pred))


def _symbols(expr: str) -> set[str]:
    """The one-letter names of a LaTeX expression (``cx`` is ``c`` times ``x``; commands are no names)."""
    return {tok for tok in _TOKEN.findall(expr) if len(tok) == 1 and tok.isalpha()}


def rename_variable(expr: str, old: str, new: str) -> str:
    """Rename a one-letter variable in LaTeX, leaving commands (``\\sqrt``) and longer names alone."""
    return re.sub(rf"(?<![\\A-Za-z]){re.escape(old)}(?![A-Za-z])", new, expr)


_TEXT_GROUP = re.compile(r"\\(?:text|textbf|textit|mbox|mathrm|operatorname)\s*\{([^{}]*)\}")
_CONNECTIVES = {"and", "or", "for", "of", "the", "a", "an"}


def text_words(s: str) -> frozenset[str]:
    """Lower-cased words inside ``\\text{}`` groups of an answer that is not a single text group
    (``n \\text{ odd}`` -> {"odd"}); connectives ignored. A whole-answer ``\\text{Even}`` gives {}."""
    t = s.strip()
    groups = list(_TEXT_GROUP.finditer(t))
    if not groups or (len(groups) == 1 and groups[0].start() == 0 and groups[0].end() == len(t)):
        return frozenset()
    words = {w.lower() for g in groups for w in re.findall(r"[A-Za-z]{2,}", g.group(1))}
    return frozenset(words - _CONNECTIVES)


def fast_verdict(pred: str, reference: str) -> Optional[bool]:
    """A verdict from string code alone, or None when sympy is needed.

    Exact either way: two plain integers (after normalisation) are equal iff their digits are
    (unless a percentage on one side only makes ``100%`` = ``1`` possible); two decimal or
    scientific-notation numerals of the same value are equal (``ulorl.reward.numerals``; a mismatch
    is left to ``math_equal``, which decides it the same way, so a judge may still be asked about
    ``27cm`` against ``0.27m``); identical normalised strings are equal, words of two or more
    letters in any case; two option letters are equal iff they are the same.
    """
    p, r = normalize_answer(pred), normalize_answer(reference)
    if not p or not r:
        return False
    if p == r or (_WORDS.match(p) and _WORDS.match(r) and p.lower() == r.lower() and (len(p) > 2 or p.lower() == "no")):
        return True
    if _INT.match(p) and _INT.match(r):
        if has_percent(pred) != has_percent(reference):
            return None
        return int(p) == int(r)
    vp, vr = numeral_value(p), numeral_value(r)
    if vp is not None and vr is not None and has_percent(pred) == has_percent(reference) and numerals_equal(vp, vr):
        return True  # decimals / scientific notation by value; a mismatch goes on (units: a judge's case)
    lp, lr = option_letter(p), option_letter(r)
    if lp is not None and lr is not None:
        return lp == lr
    return None


def letter_lead(s: str) -> Optional[tuple[str, str]]:
    """``(E) 9:30`` -> ``("E", "9:30")``; None unless ``s`` is an option letter followed by text."""
    m = _LETTER_LEAD.match(_TEXT_LETTER.sub(r"\1 ", s.strip()).strip())
    if m is None:
        return None
    letter, text = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    text = text.strip().rstrip(".").strip()
    if re.match(r"(?:[,;&]|and\b|or\b)", text) or re.search(r"\(\s*[A-J]\s*\)", text):
        return None  # "(A), (C) and (E)": several options, not one option and its text
    return letter, text


def enclosed_items(s: str) -> Optional[list[str]]:
    """Items of ``(1, 2, 3)`` / ``[1, 2, 3]`` when one pair of matching brackets spans the whole
    string (so not ``(x, y) = (1, 2)``, not ``[0, 1)``); None otherwise."""
    t = s.strip()
    if len(t) < 2 or (t[0], t[-1]) not in (("(", ")"), ("[", "]")):
        return None
    depth = 0
    for i, c in enumerate(t):
        depth += 1 if c in _OPEN else -1 if c in _CLOSE else 0
        if depth == 0 and i < len(t) - 1:
            return None
    return split_items(t[1:-1])


def _bound(rel: str) -> tuple[bool, bool]:
    """(closed, less-than) of a relation symbol."""
    closed = rel in ("\\le", "\\leq", "\\ge", "\\geq", "≤", "≥")
    less = rel in ("<", "\\le", "\\leq", "≤")
    return closed, less


def _is_bound(s: str) -> bool:
    """A constant interval end: a number or a constant expression (``\\frac{1}{2}``, ``\\sqrt{3}``,
    ``2\\pi``, ``-\\infty``); not a variable (the letters of ``\\frac`` are no variable)."""
    t = normalize_answer(s).replace("\\infty", "1").replace("\\pi", "1")
    return not _NUMERIC_LEFT.search(t) or is_numeric_expression(t)


def inequality_to_interval(s: str) -> Optional[str]:
    """``1 < x \\le 3`` -> ``(1, 3]``; ``x > 2`` -> ``(2, \\infty)``; ``x \\le -1`` -> ``(-\\infty, -1]``;
    None for anything else (two variables, a relation of expressions, mixed directions)."""
    t = s.strip()
    m = _CHAIN.match(t)
    if m:
        lo, r1, _var, r2, hi = m.groups()
        (c1, l1), (c2, l2) = _bound(r1), _bound(r2)
        if l1 != l2 or not (_is_bound(lo) and _is_bound(hi)):
            return None
        if not l1:  # 3 > x > 1
            lo, hi, c1, c2 = hi, lo, c2, c1
        return f"{'[' if c1 else '('}{lo.strip()}, {hi.strip()}{']' if c2 else ')'}"
    m = _HALF.match(t)
    if m:
        _var, rel, val = m.groups()
        if not _is_bound(val):
            return None
        closed, less = _bound(rel)
        if less:
            return f"(-\\infty, {val.strip()}{']' if closed else ')'}"
        return f"{'[' if closed else '('}{val.strip()}, \\infty)"
    return None


def _looks_like_interval(s: str) -> bool:
    t = s.strip()
    return len(t) > 2 and t[0] in "([" and t[-1] in ")]" and ("," in t or "\\cup" in t)


def reference_alternatives(reference: str) -> tuple[list[str], bool]:
    """(forms, stated equal) of a reference that gives one answer in two forms: ``\\binom{10}{3} =
    120`` -> both sides, stated equal (both sides are constants, so the reference asserts it);
    ``0.5 or \\frac12`` -> both forms, not stated equal (the caller checks that they are one value,
    as ``2 or 3`` lists two answers); ([], False) otherwise."""
    t = normalize_answer(reference)
    parts = [x.strip() for x in re.split(r"(?<![<>!\\])=(?!=)", t)]
    if len(parts) == 2 and all(parts) and not any(_NUMERIC_LEFT.search(re.sub(r"\\[A-Za-z]+", "", x)) for x in parts):
        return parts, True  # both sides constants: "7 = 11a + c" is an equation, not two forms
    alts = [x.strip() for x in re.split(r"\s+or\s+|\\text\s*\{\s*or\s*\}", t) if x.strip()]
    return (alts, False) if len(alts) == 2 and "=" not in t else ([], False)


def _consistent_option_text(text: str, option: str) -> bool:
    """The text written after an option letter agrees with that option (or is a prefix of it)."""
    a = re.sub(r"[\s$]|\\[,;!~ ]", "", normalize_answer(text)).lower()
    b = re.sub(r"[\s$]|\\[,;!~ ]", "", normalize_answer(option)).lower()
    return bool(a) and (a == b or b.startswith(a) or answers_match(text, option, None, 2))


def answers_match(pred: str, reference: str, problem: Optional[str] = None, depth: int = 0) -> bool:
    """True iff ``pred`` is the same answer as ``reference`` (see module doc for the rules)."""
    p, r = normalize_answer(pred), normalize_answer(reference)
    if not p or not r:
        return False
    quick = fast_verdict(p, r)
    if quick is True or (quick is False and not has_percent(reference) and not has_percent(pred)):
        return True if quick else False
    if r.lower() in ("yes", "no") and (lead_word := yes_no_lead(p)) is not None:
        return lead_word == r.lower()  # "Yes, it is possible" against "Yes"; "No, ..." against "Yes" is wrong
    if problem and asks_simplest(problem) and unsimplified(p) and not unsimplified(r):
        return False  # "\frac{2}{4}" where the problem asks for simplest form
    condition = None
    if depth == 0:
        (p, _), (r, condition) = strip_condition(p), strip_condition(r)  # "x^c \text{ for some } c>0"
    if _WORDS.match(p) and _WORDS.match(r) and max(len(p), len(r)) > 3:
        # words are not products of symbols: KILIMANJARO is not an anagram of it; a lost space is no new word
        return re.sub(r"[\s-]", "", p).lower() == re.sub(r"[\s-]", "", r).lower()
    if depth == 0 and has_percent(reference) != has_percent(pred) and is_numeric_expression(p) \
            and is_numeric_expression(r):
        # 10\% may be answered as 10 or as 0.1; 60% is 0.6 (and, as written, 60)
        scaled = (p, f"\\frac{{{r}}}{{100}}") if has_percent(reference) else (f"\\frac{{{p}}}{{100}}", r)
        return answers_match(p, r, None, depth + 1) or answers_match(*scaled, None, depth + 1)
    p, r = p.replace(";", ","), r.replace(";", ",")
    options = parse_options(problem)
    lp, lr = option_letter(p), option_letter(r)
    lead = letter_lead(p) if lp is None and depth == 0 else None
    if lead is not None and lr is not None and _TEXT_LETTER.match(p):
        lead = None  # "\\text{(A)} 11 m" against a letter: left as before (graders disagree on it; see rewards.md)
    if lead is not None and (lr is not None or lead[0] in options):
        letter, text = lead
        if letter in options and not _consistent_option_text(text, options[letter]):
            return False  # "(B) 45" where (B) is 54: the response contradicts itself
        if lr is not None:
            return letter == lr
        return answers_match(options[letter], r, None, depth + 1)
    rlead = letter_lead(r) if lr is None and depth == 0 else None
    if rlead is not None and lp is not None:  # a reference written as "C. x = 42" against "C"
        return lp == rlead[0]
    if options and depth == 0:
        if lr is not None and lp is None and lr in options:
            return answers_match(p, options[lr], None, depth + 1)
        if lp is not None and lr is None and lp in options:
            return answers_match(options[lp], r, None, depth + 1)
    if lr is not None and lp is None and not options:
        return False  # a letter reference needs a letter (or the option texts to map to)
    if depth == 0:
        alts, stated = reference_alternatives(r)
        if alts and len(split_items(p)) == 1:
            if stated or answers_match(alts[0], alts[1], None, depth + 1):  # "or": one value, two forms
                return any(answers_match(p, a, None, depth + 1) for a in alts)
    ref_items, pred_items = split_items(unwrap_set(r)), split_items(unwrap_set(p))
    if depth == 0 and len(ref_items) != len(pred_items):
        pm = plus_minus_items(pred_items, ref_items)
        if pm is not None:  # "\\pm 3" against "3, -3": both values, in any order
            return items_match(*pm, True, depth)
        many_pm = (expand_plus_minus(pred_items) or pred_items, expand_plus_minus(ref_items) or ref_items)
        if len(many_pm[0]) == len(many_pm[1]) > 1 and many_pm != (pred_items, ref_items):
            return items_match(*many_pm, True, depth)  # "\\pm 1, \\pm 7" against "1, -1, 7, -7"
    if (len(ref_items) > 1) != (len(pred_items) > 1):  # (1, 2, 3) vs 1, 2, 3
        single, many = (ref_items, pred_items) if len(ref_items) == 1 else (pred_items, ref_items)
        inner = enclosed_items(single[0])
        named = named_in_order(many)
        if inner is not None and named is not None and len(inner) == len(named):
            # "x = 1, y = 2" against "(1, 2)": the names give the order (alphabetical, as a tuple lists them)
            ref_items, pred_items = (inner, named) if single is ref_items else (named, inner)
            return items_match(pred_items, ref_items, False, depth)
        if inner is not None and len(inner) == len(many) and (
                len(many) >= 3 or (problem is not None and (_PAIR_WORDS.search(problem) or asks_system(problem)))):
            ref_items, pred_items = (inner, many) if single is ref_items else (many, inner)
            return items_match(pred_items, ref_items, False, depth)
    if len(ref_items) > 1 or len(pred_items) > 1:
        as_set = written_as_set(reference) or is_set_reference(r, problem)
        if as_set:  # a set lists each element once
            ref_items, pred_items = _dedupe(ref_items), _dedupe(pred_items)
        if len(pred_items) > 1 and len(ref_items) == 1 and len(_dedupe(pred_items)) == 1:
            pred_items = pred_items[:1]  # \boxed{2} and \boxed{2}: one value, written twice
        if len(ref_items) != len(pred_items):
            return False
        return items_match(pred_items, ref_items, as_set, depth)
    if _looks_like_interval(r) or _looks_like_interval(p):
        ip, ir = inequality_to_interval(p), inequality_to_interval(r)
        if (ip is not None) != (ir is not None):
            return answers_match(ip or p, ir or r, None, depth + 1)
    if text_words(p) != text_words(r):
        return False  # "n \\text{ odd}" is not "n": words of a non-numeric answer must match
    fp, fr = function_rhs(p), function_rhs(r)
    if fp is None and fr is not None and condition == "all" and "=" not in p:
        return math_equal(p, fr[2])  # "f(x) = \\boxed{0}" against "f(x) = 0 \\text{ for all } x"
    if fp is not None and fr is not None:
        if fp[1] != fr[1] and rename_variable(fp[2], fr[1], "\0") != fp[2]:
            return False  # f(y) = 2x: the reference's variable is free in the prediction
        rhs = rename_variable(fp[2], fp[1], fr[1])
        if math_equal(rhs, fr[2]):
            return True
        renamed = rename_parameter(rhs, fr[2], fr[1], problem)  # f(x) = cx against f(x) = kx
        return renamed is not None and math_equal(renamed, fr[2])
    if math_equal(p, r):
        return True
    # "1.41" for "\\sqrt{2}" when the problem asks for a rounded value
    return depth == 0 and asks_rounding(problem) and numeral_value(p) is not None and "." in p and rounded_equal(p, r)


def items_match(pred_items: list[str], ref_items: list[str], as_set: bool, depth: int) -> bool:
    """Item-wise comparison: in order, or (``as_set``) in some order (all orders up to
    ``MAX_ITEMS_PERMUTED`` items, else sorted pairing by normalised text)."""
    def eq(a: str, b: str) -> bool:
        return answers_match(a, b, None, depth + 1)

    if not as_set:
        return all(eq(a, b) for a, b in zip(pred_items, ref_items))
    if len(ref_items) > MAX_ITEMS_PERMUTED:
        return all(eq(a, b) for a, b in zip(sorted(pred_items), sorted(ref_items)))
    cache: dict[tuple[int, int], bool] = {}

    def eq_ij(i: int, j: int) -> bool:
        if (i, j) not in cache:
            cache[(i, j)] = eq(pred_items[i], ref_items[j])
        return cache[(i, j)]

    n = len(ref_items)
    return any(all(eq_ij(i, perm[i]) for i in range(n)) for perm in permutations(range(n)))


# ---- sympy / math-verify (worker side) ---------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _extraction_config() -> tuple[Any, ...]:
    """math-verify's default extraction targets, with its unit removal off (see ``parse_answer``)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, LatexNormalizationConfig

    latex = LatexExtractionConfig(normalization_config=LatexNormalizationConfig(
        basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="all", equations=False))
    return (latex, ExprExtractionConfig())


def parse_answer(text: str) -> list[Any]:
    """Parse a short answer into math-verify's representation; [] = unparseable.

    Bare LaTeX such as ``\\frac12`` parses to nothing unless delimited, so the text is tried as
    ``\\boxed{text}`` first, then as plain text, then inside ``$...$``. math-verify's own unit
    removal is off: it drops a trailing one-letter "unit" (``t``, ``c``, ``m``, ``s`` ...) after a
    space or a brace, so ``\\frac{1}{m} t`` read as ``1/m`` and ``x + c`` as ``x +``; the decorations of
    numbers are removed before (``ulorl.reward.normalize``).
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
        parsed = parse(cand, extraction_config=_extraction_config(), parsing_timeout=None)
        if parsed:
            return parsed
    return []


def _is_exact_constant(x: Any) -> bool:
    import sympy

    return (isinstance(x, sympy.Expr) and not x.free_symbols and not x.atoms(sympy.Float)
            and not isinstance(x, sympy.logic.boolalg.Boolean))


def exact_equal(a: Any, b: Any) -> Optional[bool]:
    """Exact verdict for two exact constants (no floats, no variables); None otherwise."""
    import sympy

    if not (_is_exact_constant(a) and _is_exact_constant(b)):
        return None
    diff = a - b
    if diff == 0:
        return True
    if diff.is_Rational:  # sympy already evaluated it exactly: a nonzero rational
        return False
    try:
        if sympy.simplify(diff) == 0:
            return True
        # A nonzero value at high precision (no chop) proves a difference, however small.
        val = diff.evalf(30)
        if val.is_Number and val != 0:
            return False
    except Exception:  # noqa: BLE001 -- undecided: let math-verify judge
        return None
    return None


_LOG = re.compile(r"\\log(?![A-Za-z_])")
_DECIMAL = re.compile(r"^[+-]?\d*\.(\d+)$")


def same_log(pred: str, reference: str) -> tuple[str, str]:
    """``\\ln`` on one side and an unsubscripted ``\\log`` on the other: both read as ``\\ln``."""
    if ("\\ln" in pred and _LOG.search(reference)) or ("\\ln" in reference and _LOG.search(pred)):
        return _LOG.sub(r"\\ln", pred), _LOG.sub(r"\\ln", reference)
    return pred, reference


def rounded_equal(pred: str, reference: str) -> bool:
    """The exact constant ``reference`` rounded to the decimals of ``pred`` (at least one) is ``pred``."""
    gold = parse_answer(reference)
    return bool(gold) and rounds_to(gold[0], pred.strip(), min_decimals=1)


def rounds_to(value: Any, reference: str, min_decimals: int = 2) -> bool:
    """An exact constant whose decimal expansion does not stop, rounded half-up to the decimals of
    ``reference`` (at least ``min_decimals``), is ``reference``: ``\\sqrt{2}`` -> ``1.41``, ``1/3`` -> ``0.33``."""
    from decimal import ROUND_HALF_UP, Decimal

    import sympy

    m = _DECIMAL.match(reference.strip())
    if m is None or len(m.group(1)) < min_decimals or not _is_exact_constant(value):
        return False
    try:
        if value.is_Rational:
            q = int(sympy.Rational(value).q)
            while q % 2 == 0:
                q //= 2
            while q % 5 == 0:
                q //= 5
            if q == 1:  # a terminating decimal: compared exactly elsewhere, never rounded
                return False
        elif not value.is_real:
            return False
        digits = Decimal(str(sympy.N(value, 40)))
        step = Decimal(1).scaleb(-len(m.group(1)))
        return digits.quantize(step, rounding=ROUND_HALF_UP) == Decimal(reference.strip())
    except (TypeError, ValueError, ArithmeticError):
        return False


def _numeric_leaves(x: Any) -> Optional[list[Decimal]]:
    """The real constants ``x`` is made of, as decimals (30 digits): a number -> [it]; a tuple,
    interval or matrix -> its entries in order; a finite set -> its entries by value; ``v = c`` ->
    those of ``c``. None when ``x`` holds anything else (a variable, a complex value)."""
    import sympy

    if isinstance(x, sympy.Eq) and isinstance(x.lhs, sympy.Symbol):
        return _numeric_leaves(x.rhs)
    if isinstance(x, (sympy.Tuple, sympy.Interval, sympy.MatrixBase)):
        parts = list(x.args[:2]) if isinstance(x, sympy.Interval) else list(x) if isinstance(
            x, sympy.MatrixBase) else list(x.args)
        leaves = [_numeric_leaves(p) for p in parts]
        return None if any(v is None for v in leaves) else [d for v in leaves for d in v]  # type: ignore[union-attr]
    if isinstance(x, sympy.FiniteSet):
        leaves = [_numeric_leaves(p) for p in x.args]
        if any(v is None or len(v) != 1 for v in leaves):
            return None
        return sorted(v[0] for v in leaves)  # type: ignore[index]
    if isinstance(x, sympy.Expr) and x.is_number and not x.free_symbols:
        try:
            val = sympy.N(x, 30)
            if val.is_real and val.is_finite:
                return [Decimal(str(val))]
        except (TypeError, ValueError, ArithmeticError):
            return None
    return None


def floats_agree(gold: Any, target: Any) -> bool:
    """False when both sides are numbers (or tuples / sets / intervals of numbers) with a float in
    them and some pair of entries differs by value (``ulorl.reward.numerals.numerals_equal``):
    math-verify compares floats to an absolute number of decimals, so ``1.6\\times 10^{-19}`` and
    ``-1.6\\times 10^{-19}`` pass it. True otherwise (nothing to check)."""
    import sympy

    if not any(isinstance(e, sympy.Basic) and e.atoms(sympy.Float) for e in (gold, target)):
        return True
    a, b = _numeric_leaves(gold), _numeric_leaves(target)
    if a is None or b is None or len(a) != len(b):
        return True
    return all(numerals_equal(x, y) for x, y in zip(a, b))


def math_equal(pred: str, reference: str) -> bool:
    """math-verify's verdict on two short answers, exact for exact constants and by value for
    numerals and floats (``ulorl.reward.numerals``). Not time-bounded."""
    from math_verify import verify

    vp, vr = numeral_value(pred), numeral_value(reference)
    if vp is not None and vr is not None:
        return numerals_equal(vp, vr)
    pred, reference = same_log(pred, reference)
    gold, target = parse_answer(reference), parse_answer(pred)
    if not gold or not target:
        return False
    exact = exact_equal(gold[0], target[0])
    if exact is not None:
        return exact
    if bool(verify(gold, target, timeout_seconds=None)):
        return floats_agree(gold[0], target[0])
    if rounds_to(target[0], reference):
        return True
    return exact_decimals_equal(pred, reference)


def exact_decimals_equal(pred: str, reference: str) -> bool:
    """``1.01^{100}`` = ``(1+\\frac{1}{100})^{100}``: with every decimal literal read as the exact
    fraction it is, the two sides are equal exact constants (math-verify's float arithmetic misses
    such powers). Only ever accepts; a plain numeral is left to the numeral rules."""
    if numeral_value(pred) is not None or numeral_value(reference) is not None or "^" not in pred + reference:
        return False  # a power is where float arithmetic drifts; elsewhere math-verify's floats suffice
    rp, rr = rationalize_decimals(pred), rationalize_decimals(reference)
    if rp is None and rr is None:
        return False
    gold, target = parse_answer(rr or reference), parse_answer(rp or pred)
    return bool(gold and target) and exact_equal(gold[0], target[0]) is True
