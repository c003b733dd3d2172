"""Final-answer extraction from a response, in one of two modes (``reward.extraction``):

``boxed``           the last ``\\boxed{...}`` (with the boxes written right before it, joined:
                    ``\\boxed{-2} \\text{ and } \\boxed{1}`` -> ``-2, 1``; ``max \\boxed{3}, min
                    \\boxed{1}`` -> ``3, 1``); no box -> no answer. The training default: "no box ->
                    0" is a deliberate format incentive.
``boxed_or_final``  the same, and when there is no box a final-answer statement: the last
                    "final answer: X" / "the answer is X" / "the correct answer is (B)" / "Answer: X"
                    (at a line start, after a sentence, or in bold anywhere), else a response that is
                    only an answer (one short line or one math span), else a lone option letter on
                    the last line, else -- only when the problem is known -- a closing sentence
                    (``closing_statement``). For evaluating other models' outputs (``ulorl-eval``),
                    judges' fallbacks and data cleaning.

Truncation nobody flagged (a labelled set, an external log, a response that stops mid-derivation
with ``truncated=False``) must not earn a reward from a number in its last sentence: the closing-
sentence rule takes a value only from a last sentence that ends the text with a full stop, opens
with a conclusion ("Therefore", "Thus", "So", ...; an option letter in brackets needs none), names
the quantity the problem asks for (its head noun appears in the problem's question) and ends with
the value (a number, a math span or an option letter, then at most three unit words).

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
# ... or a separator and the label of the next box: "max \boxed{3}, min \boxed{1}", "x = \boxed{3}, y = \boxed{4}".
_LABEL_GAP = re.compile(r"^[\s$]*(?:[,;][\s$]*(?:and\s+)?|,?\s*\band\s+)"
                        r"(?P<label>\\text\s*\{[^{}]{1,24}\}|\\[A-Za-z]+|[A-Za-z]+(?: [A-Za-z]+){0,5}"
                        r"(?:_\{?[A-Za-z0-9]+\}?)?)\s*(?:[:=]|\bis\b)?[\s$]*(?:\\[(\[])?\s*$")
# Words that make the next box a correction, a new step or a restatement ("which is answer choice
# \boxed{(B)}"), not a labelled part of one answer.
_NOT_A_LABEL = frozenset("then so but not no wait actually correction instead hence therefore thus sorry oops "
                         "however rather again finally next now which that answer choice option i e ie or "
                         "equivalently namely correct corrected revised".split())
_MAX_BOX_GAP = 60
_MAX_JOINED_BOXES = 16  # one final answer has a few parts; a run of hundreds of boxes is not one answer
_ANSWER_MARK = re.compile(
    r"(?:final\s+answer|the\s+(?:(?:correct|best|right)\s+(?:answer|option|choice)|answer)"
    r"(?:\s+to\s+(?:the|this|our)\s+(?:given\s+|original\s+)?(?:question|problem))?"
    r"(?=\**\s*(?:is\b|would\s+be|should\s+be|must\s+be|[:=]))"
    r"|^[ \t*#]*answer|\*\*\s*answer|(?<=[.!?]\s)answer(?=\**\s*:))"
    r"\**\s*(?:is|would\s+be|should\s+be|must\s+be|[:=])?\s*:?\s*\**\s*",
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

    None when there is no box or the last box never closes; at most ``_MAX_JOINED_BOXES`` earlier
    boxes are joined. Each earlier box is only read up to the next one, so this stays linear in
    ``len(text)``.
    """
    matches = list(_BOX_CMD.finditer(text))
    if not matches:
        return None
    _, last = _box_at(text, matches[-1])
    if last is None:
        return None
    parts = [last.strip()]
    for j in range(len(matches) - 2, max(-1, len(matches) - 2 - _MAX_JOINED_BOXES), -1):
        nxt = matches[j + 1].start()
        end, content = _box_at(text, matches[j], nxt)
        gap = text[end:nxt] if content is not None else ""
        if content is None or len(gap) > _MAX_BOX_GAP or not (_BOX_GAP.match(gap) or _is_label_gap(gap)):
            break
        parts.append(content.strip())
    parts = [p for p in reversed(parts) if p]
    # equal boxes are kept: "\boxed{2} and \boxed{2}" may answer a reference "2, 2" (the comparison
    # reads a repeated single value as that value)
    return ", ".join(parts) if parts else ""


def _is_label_gap(gap: str) -> bool:
    m = _LABEL_GAP.match(gap)
    if m is None:
        return False
    words = {w.lower() for w in re.findall(r"[A-Za-z]+", m.group("label"))}
    return not words & _NOT_A_LABEL


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
    m = re.search(r"\n|(?<!\d)\.(?=\s|$)|\.(?=\s+[A-Z])|(?<![\d)}!])!(?=\s|$)|\?(?=\s|$)|\s+I hope\b", t)
    value = (t[: m.start()] if m else t).strip().strip("*").strip()
    value = value.rstrip(".").strip()
    return value if value and len(value) <= _MAX_STATEMENT_CHARS else None


def extract_final_statement(text: str, problem: Optional[str] = None) -> Optional[str]:
    """The answer of a response without a box: the last "final answer: X" / "the answer is X" /
    "the correct answer is X" / "Answer: X"; else the whole response when it is only an answer (one
    short line, or one math span); else a lone option letter on the last line; else (``problem``
    given) the value of a closing sentence (``closing_statement``). None when none of these is there."""
    marks = list(_ANSWER_MARK.finditer(text))
    for m in reversed(marks):
        value = _statement_value(text[m.end():])
        if value:
            return _sentence_value(value)
    s = text.strip()
    if s:
        span = _math_span(s)
        if span is not None and len(span) + 4 >= len(s) - 2 and (
                s.endswith("$") or s.endswith("\\)") or s.endswith("\\]")):
            return span or None
        if "\n" not in s and len(s) <= _MAX_LONE_CHARS and not re.search(r"[.!?]\s+\S", s):
            return s.rstrip(".").strip() or None  # one short sentence: "42", "x = 5", "(B)"
        last = s.splitlines()[-1]
        lm = _LONE_LETTER.match(last)
        if lm:
            return lm.group(1)
        return (conclusion_value(s, problem) or bold_closing_value(s) or closing_display(s, problem)
                or closing_statement(s, problem))
    return None


def _sentence_value(value: str) -> str:
    """The value a whole sentence after "Final Answer:" states ("The area of the square is 25" ->
    ``25``); other values unchanged."""
    if len(value.split()) < 4:
        return value
    m = _CLOSING.match(f"So {value.rstrip('.')}.")
    if m is None or re.fullmatch(r"\(?[A-J]\)?", m.group("value")):
        return value
    items = re.findall(_ITEM, m.group("value"))
    units = m.group("unit").split()
    if len(items) != 1 or any(w.lower().rstrip(".") in _NOT_UNIT for w in units):
        return value
    return (_equation_value(_unwrap_math(m.group("value"))) + (" " + " ".join(units) if units else "")).strip()


_CONCLUSION = re.compile(r"(?:^|\n)[ \t#]*(?:\*\*)?conclusion(?:\*\*)?\s*:?\s*(?:\*\*)?\s*:?\s*(?P<rest>[^\n]+)\s*$",
                         re.IGNORECASE)


def conclusion_value(text: str, problem: Optional[str]) -> Optional[str]:
    """The answer on a closing "Conclusion:" line: a lone value (``**Conclusion:** 25``) or a
    sentence read as a closing sentence with its conclusion word (``Conclusion: the area of the
    square is 25.``); None when the response does not end so."""
    m = _CONCLUSION.search(text.rstrip())
    if m is None:
        return None
    rest = m.group("rest").strip()
    span = _math_span(rest)
    if span is not None and len(span) + 4 >= len(rest.rstrip(".")) - 2:
        return span or None
    if re.fullmatch(r"(?:\\\$\s?)?[-+]?\d[\d,]*(?:\.\d+)?(?:/\d+)?\s*\.?", rest):
        return rest.rstrip(".").strip()
    return _closing_value("Therefore, " + rest[0].lower() + rest[1:], text, problem) if rest.endswith(".") else None


_CUE = r"(?:therefore|thus|hence|so|in conclusion|in total|in all|altogether|consequently|finally|overall)"
_VERB = (r"(?:is|are|was|were|equals|=|must be|will be|would be|should be|has|have|had|gets?|needs?|takes?|"
         r"makes?|weighs?|costs?|measures?|comes? to|becomes?|remains?|totals?|amounts? to)")
# a value: a math span, or a number (a currency sign before it allowed: "costs \$25")
_ITEM = r"(?:\$[^$]{1,80}\$|\\\((?:(?!\\\)).){1,80}\\\)|(?:\\\$\s?)?[-+]?\d[\d,]*(?:\.\d+)?(?:/\d+)?!?)"
# one value, or several ("3 and 5", "$1$, $2$, and $4$"), or an option letter
_VALUE = (rf"(?P<value>{_ITEM}(?:(?:\s*,\s*(?:and\s+)?|\s+and\s+){_ITEM}){{0,7}}|\([A-J]\)"
          r"|(?<![\w.])[A-J](?=\s*[.!]$))")
_CLOSING = re.compile(
    rf"^(?:\*\*)?(?:(?P<cue>{_CUE})\b\s*,?\s*)?(?P<subject>(?:[^.!?$=]|\$[^$=]{{1,40}}\$){{3,160}}?)\s+{_VERB}\s+"
    r"(?:equal to\s+|exactly\s+|approximately\s+|about\s+|a total of\s+|only\s+|option\s+|choice\s+)?"
    rf"{_VALUE}(?P<unit>(?:\s+[A-Za-z][A-Za-z-]*\.?){{0,3}})\s*(?:\*\*)?\s*(?:\.|(?<![\d}}])!)$",
    re.IGNORECASE,
)
_NOT_UNIT = frozenset("the a an of times more less than as per and or to in for by from with at on if when because "
                      "since which that this so".split())
_STOP = frozenset("the a an of for to in on at by with from and or that which this these those there their its it "
                  "is are what which how many much does do did find determine compute calculate given then than each "
                  "total final required resulting desired correct answer".split())
_MAX_CLOSING_TAIL = 400


def _content_words(text: str) -> list[str]:
    """Lower-cased words of three or more letters, stop words dropped, a plural "s" removed."""
    out = []
    for w in re.findall(r"[A-Za-z]{3,}", text.lower()):
        if w not in _STOP:
            out.append(w[:-1] if w.endswith("s") and len(w) > 3 and not w.endswith("ss") else w)
    return out


def _question_words(problem: str) -> set[str]:
    """Content words of the problem's question: its sentences with a "?" or an imperative
    (find / determine / compute / ...), else its last sentence."""
    sentences = [x for x in re.split(r"(?<=[.?!])\s+|\n+", problem) if x.strip()]
    asks = [x for x in sentences if "?" in x or re.match(
        r"\s*(?:find|determine|compute|calculate|evaluate|what|which|how|give|express|show)\b", x, re.I)]
    return set(_content_words(" ".join(asks or sentences[-1:])))


_GOAL = re.compile(
    r"\b(?:to|we\s+(?:need|want|have)\s+to|we\s+are\s+asked\s+to|let(?:'s|\s+us)|i\s+(?:need|want)\s+to)\s+"
    r"(?:find|determine|compute|calculate|evaluate)\s+(?P<goal>[^.,;:$\n]{3,100})", re.IGNORECASE)
_MAX_GOAL_OFFSET = 400


def goal_words(text: str) -> set[str]:
    """Content words of what the response sets out to find in its opening ("To find the area of
    the square, ..." -> {area, square}); empty when its first lines state no such goal."""
    m = _GOAL.search(text[:_MAX_GOAL_OFFSET])
    return set(_content_words(m.group("goal"))) if m else set()


def closing_statement(text: str, problem: Optional[str]) -> Optional[str]:
    """The value of the response's closing sentence, or None.

    "Therefore, the length of the side is 20 centimeters." -> ``20 centimeters`` when the problem
    asks for "the length of the side"; "The pattern that cannot be folded is (D)." -> ``(D)``. The
    last sentence must end the text with a full stop, open with a conclusion word (an option letter
    in brackets needs none), name the asked quantity (the first content word of its subject is a
    content word of the problem's question; a generic head -- "the value of $x$", "the number of
    ways" -- passes on to what follows it) and end with the value and at most three unit words ("in
    total" and the like may close it). Also read: "Thus, there are 12 ways to ..." (the noun after
    the value is the asked quantity), "Therefore, $x = 5$." (the left side is a math span of the
    problem), and a closing sentence followed by at most two sentences of commentary without a
    number or formula. Equations about other quantities and statements about other quantities give
    None, as does any text that does not end in a full stop -- a response cut mid-derivation.
    """
    t = text.rstrip()
    if not t or t[-1] not in ".!":
        return None
    tail = t[-_MAX_CLOSING_TAIL:].split("\n")[-1]
    masked = _mask_math(tail)
    cuts = [m.end() for m in _SENTENCE_CUT.finditer(masked[:-1])]
    if cuts == [] and len(tail) == _MAX_CLOSING_TAIL:
        return None  # no sentence start in reach
    sentences = [tail[a:b].strip() for a, b in zip([0, *cuts], [*cuts, len(tail)])]
    for drop in range(min(_MAX_COMMENTARY, len(sentences) - 1) + 1):
        if drop and _NOT_COMMENTARY.search(sentences[-drop]):
            return None  # a later sentence holds a number or a formula: not a closing sentence
        value = _closing_value(sentences[-1 - drop], text, problem)
        if value is not None:
            return value
    return None


# a sentence ends at ". " / "! " / "? " before a capital, a bracket, a backslash or a dollar, or after a display
_SENTENCE_CUT = re.compile(r"[.!?](?:\*\*)?\s+(?=[A-Z*(\\$])|\\\]\s*(?=[A-Z])")
_MAX_COMMENTARY = 2
_NOT_COMMENTARY = re.compile(r"[\d$=]|\\[(\[]")
_TRAILING_PHRASE = re.compile(r",?\s+(?:in\s+total|in\s+all|altogether|overall|in\s+the\s+end)(?=\s*(?:\*\*)?\s*[.!]$)",
                              re.IGNORECASE)
_GENERIC_HEADS = frozenset("value solution number result".split())
_THERE = re.compile(
    rf"^(?:\*\*)?(?P<cue>{_CUE})\b\s*,?\s*there\s+(?:are|is|were|was|will\s+be)\s+"
    r"(?:exactly\s+|a\s+total\s+of\s+|only\s+)?(?P<value>[-+]?\d[\d,]*|\$\d[\d,]*\$|\\\(\d[\d,]*\\\))\s+"
    r"(?P<noun>[A-Za-z][^.!?$]{0,80}?)\s*(?:\*\*)?\s*\.$", re.IGNORECASE)
_EQUATION = re.compile(
    rf"^(?:\*\*)?(?P<cue>{_CUE})\b\s*,?\s*(?:we\s+(?:have|get|find)\s+(?:that\s+)?)?"
    r"(?:\$(?P<a>[^$=]{1,30})=(?P<b>[^$=]{1,60})\$|\\\((?P<c>[^=]{1,30}?)=(?P<d>(?:(?!\\\)|=).){1,60})\\\))"
    r"\s*(?:\*\*)?\s*\.$", re.IGNORECASE)


def _mask_math(text: str) -> str:
    """``text`` with the inside of each ``$...$`` / ``\\(...\\)`` span replaced by ``_`` (same length):
    a "!" or "." in a formula ends no sentence."""
    return re.sub(r"\$[^$]*\$|\\\((?:(?!\\\)).)*\\\)", lambda m: "_" * len(m.group(0)), text)


def _names_the_asked(subject: str, text: str, problem: Optional[str]) -> bool:
    """The subject of a closing sentence names what the problem asks for (its first content word,
    past a generic head such as "value" / "number", is a content word of the problem's question, or
    a math span of it is one of the problem's), or, without the problem, what the response set out to find."""
    asked = _question_words(problem) if problem else goal_words(text)
    words = _content_words(re.sub(r"\$[^$]*\$", " ", subject))
    if words and words[0] in asked:
        return True
    if not words or words[0] not in _GENERIC_HEADS:
        return False
    if words[0] == "solution" and problem and re.search(r"\bsolve\b", problem, re.IGNORECASE):
        return True  # "Solve ...": "the solution (of the equation) is 5"
    if len(words) > 1 and words[1] in asked:
        return True
    spans = {re.sub(r"\s+", "", x) for x in re.findall(r"\$([^$]+)\$", subject)}
    return bool(problem and spans and spans & {re.sub(r"\s+", "", x) for x in re.findall(r"\$([^$]+)\$", problem)})


def _closing_value(sentence: str, text: str, problem: Optional[str]) -> Optional[str]:
    """The value one closing sentence states (``closing_statement``), or None."""
    sentence = _TRAILING_PHRASE.sub("", sentence.strip())
    there = _THERE.match(sentence)
    if there is not None:
        noun = _content_words(there.group("noun"))
        asked = _question_words(problem) if problem else goal_words(text)
        return _unwrap_math(there.group("value")) if noun and noun[0] in asked else None
    eq = _EQUATION.match(sentence)
    if eq is not None:
        lhs = re.sub(r"\s+", "", eq.group("a") or eq.group("c") or "")
        spans = {re.sub(r"\s+", "", x) for x in re.findall(r"\$([^$]+)\$|\\\((.+?)\\\)", problem or "") for x in x if x}
        return (eq.group("b") or eq.group("d") or "").strip() if problem and lhs in spans else None
    m = _CLOSING.match(sentence)
    if m is None:
        return None
    value = m.group("value")
    letter = re.fullmatch(r"\(?([A-J])\)?", value)
    if m.group("cue") is None and not (letter and value.startswith("(")):
        return None
    if not _names_the_asked(m.group("subject"), text, problem):
        return None
    if letter:
        return letter.group(1)
    units = [w for w in m.group("unit").split() if w.lower().rstrip(".") not in _NOT_UNIT]
    if len(units) != len(m.group("unit").split()):
        return None  # "20 times the side": not a value with units
    items = re.findall(_ITEM, value)
    if len(items) > 1:  # several values: their list (no units)
        return None if units else ", ".join(_unwrap_math(x) for x in items)
    return (_equation_value(_unwrap_math(value)) + (" " + " ".join(units) if units else "")).strip()


def _equation_value(value: str) -> str:
    """``5! = 120`` -> ``120``: a value written as a computation of numbers ends with its result."""
    parts = value.split("=")
    if len(parts) == 2 and parts[1].strip() and not re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", parts[0])):
        return parts[1].strip()
    return value


def _unwrap_math(value: str) -> str:
    v = value.strip()
    return (v[1:-1] if v.startswith("$") else v[2:-2] if v.startswith("\\(") else v).strip()


# M: "..., the total is **42**." -- a value in bold that ends the response's last sentence
_BOLD_CLOSING = re.compile(r"(?:\bis|\bare|\bequals|\bbe|=|:)\s*\*\*(?P<value>[^*\n]{1,80})\*\*"
                           r"(?P<unit>(?:\s+[A-Za-z][A-Za-z-]*){0,3})\s*\.?\s*$")
_BOLD_VALUE = re.compile(r"\$[^$]+\$|\\\(.+\\\)|[-+]?\d[\d,]*(?:\.\d+)?(?:/\d+)?|\([A-J]\)")


def bold_closing_value(text: str) -> Optional[str]:
    """The bold value that ends the last sentence (``Therefore, the total is **42**.``): a number,
    a math span or an option letter in brackets after "is" / "are" / "=" / ":"; else None."""
    last = text.rstrip().split("\n")[-1]
    m = _BOLD_CLOSING.search(last)
    if m is None or not _BOLD_VALUE.fullmatch(m.group("value").strip()):
        return None
    if any(w.lower() in _NOT_UNIT for w in m.group("unit").split()):
        return None  # "**3** times the side": not a value and its unit
    if m.group("unit").strip() and not last.rstrip().endswith("."):
        return None  # words after the value: the sentence must be complete
    value = _unwrap_math(m.group("value"))
    letter = re.fullmatch(r"\(([A-J])\)", value)
    return letter.group(1) if letter else value or None


# O: a response that ends with a displayed formula introduced by a conclusion ("Thus,\n$$x = 5$$")
_DISPLAY_END = re.compile(r"(?:\$\$(?P<a>[^$]{1,120})\$\$|\\\[(?P<b>(?:(?!\\\]).){1,120})\\\])\s*\.?\s*$", re.S)
_DISPLAY_LEAD = re.compile(rf"(?:^|[.!?]\s+|\n)(?:\*\*)?{_CUE}\b[^.!?$\n]{{0,80}}[:,]?\s*$", re.IGNORECASE)


def closing_display(text: str, problem: Optional[str] = None) -> Optional[str]:
    """The formula of a final display (``$$...$$`` / ``\\[...\\]``) that a conclusion word introduces
    and nothing follows; one relation at most (``x = 5``), no derivation chain. With the problem, a
    lead that ends with ":" and names the asked quantity introduces it too ("We compute the sum:"),
    and a computation of numbers gives its result (``1 + 2 + 3 = 6`` -> ``6``). Else None."""
    t = text.rstrip()
    m = _DISPLAY_END.search(t)
    if m is None:
        return None
    formula = (m.group("a") or m.group("b") or "").strip().rstrip(".").strip()
    if (not formula or formula.count("=") > 1 or re.search(r"\\(?:implies|Rightarrow|Longrightarrow)|\\\\|&|[<>]",
                                                          formula)):
        return None
    lead = t[max(0, m.start() - 120):m.start()]
    if _DISPLAY_LEAD.search(lead):
        return formula
    colon = _COLON_LEAD.search(lead)
    if problem and colon and set(_content_words(colon.group("lead"))) & _question_words(problem):
        return _equation_value(formula)
    return None


_COLON_LEAD = re.compile(r"(?:^|[.!?]\s+|\n)(?P<lead>[^.!?$\n]{3,80}):\s*$")


def extract_answer(text: str, mode: str = "boxed", problem: Optional[str] = None) -> Optional[str]:
    """The final answer of ``text`` under extraction ``mode`` (see module doc); None = no answer.
    ``problem`` (optional) enables the closing-sentence rule of ``boxed_or_final``."""
    if mode not in EXTRACTION_MODES:
        raise ValueError(f"unknown extraction mode {mode!r}; expected one of {EXTRACTION_MODES}")
    boxed = extract_boxed_answer(text)
    if boxed is not None or mode == "boxed":
        return boxed
    if _BOX_CMD.search(text):  # a box that never closes: cut mid-answer, no fallback
        return None
    return extract_final_statement(text, problem)
