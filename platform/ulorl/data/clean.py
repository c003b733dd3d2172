"""Data cleaning of PAPER.md section 4: rule filters on questions and answers, and model filters.

Rule filters (no model), applied in this order; the first that fires drops the row:

=====================  ==========================================================================
``missing_field``      problem or answer missing / empty
(answer normalised)    ``\\boxed{}``, ``$``, ``\\(\\)``, trailing ``.``, ``^\\circ`` and thousands
                       separators stripped (counted as ``answer_normalised``, not a drop)
``true_false``         answer is true/false/yes/no, or the problem says "true or false"
``proof``              "prove", "show that", "demonstrate that" ... in the problem
``multiple_choice``    options (A)(B)(C)... that cannot be turned into a short-answer question
                       (answer is not a letter / an option's content, the option is not a short
                       answer, or the question needs its options: "which of the following",
                       "closest to"); convertible items become short-answer
                       (``multiple_choice_converted``): options removed, answer = option content
``multi_part``         two or more marked sub-questions ((a)/(b), (1)/(2), (i)/(ii)) that each ask
                       something, or a reference answer with labelled parts
``long_answer``        normalised answer longer than ``max_answer_chars`` or a matrix
=====================  ==========================================================================

Model filters (only when models are given; any ``Engine`` + tokenizer):

- ``too_easy``: a strong model answers right in all ``k`` samples.
- ``consensus_disagrees``: several models agree on one answer and it is not the reference.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TextIO

from ulorl.data.jsonl import DataError, read_json_objects
from ulorl.data.prompts import build_prompt
from ulorl.data.types import PromptItem
from ulorl.reward.extract import braced_group, extract_answer
from ulorl.reward.judge import decode_ids, encode_text
from ulorl.reward.verify import canonical_integer
from ulorl.rollout.types import Engine, GenerationRequest, SamplingParams

RULE_FILTERS = ("missing_field", "true_false", "proof", "multiple_choice", "multi_part", "long_answer")
MODEL_FILTERS = ("too_easy", "consensus_disagrees")
MODIFICATIONS = ("answer_normalised", "multiple_choice_converted")


# ---------------------------------------------------------------------------------------------
# answer normalisation
# ---------------------------------------------------------------------------------------------
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:(?:,|\{,\}|\\,|\\!|\\ )\d{3})+(?:\.\d+)?")
_THOUSANDS_SEP = re.compile(r"\{,\}|\\,|\\!|\\ |,")
_DEGREES = re.compile(r"\s*(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°|\\degree)\s*$")


def normalize_answer(answer: str) -> str:
    """Short-answer form of a reference answer: ``"$\\boxed{1,000}$."`` -> ``"1000"``.

    Strips (repeatedly, until stable) surrounding whitespace, ``\\boxed{}`` / ``\\fbox{}`` around
    the whole answer, ``$...$`` / ``\\(...\\)`` / ``\\[...\\]``, a trailing ``.``, a trailing degree
    sign (``^\\circ``, ``^{\\circ}``, ``°``), and thousands separators (``1,000``, ``1{,}000``,
    ``1\\,000``) in a plain number.
    """
    s = answer.strip()
    while True:
        before = s
        m = re.match(r"\\(?:boxed|fbox)\s*\{", s)
        if m:
            inner = braced_group(s, m.end() - 1)
            if inner is not None and m.end() + len(inner) + 1 == len(s):  # the box spans it all
                s = inner.strip()
        if len(s) >= 2 and s.startswith("$") and s.endswith("$"):
            s = s.strip("$")
        for lo, hi in (("\\(", "\\)"), ("\\[", "\\]")):
            if s.startswith(lo) and s.endswith(hi) and len(s) >= 4:
                s = s[2:-2]
        if s.endswith(".") and not s.endswith("..."):
            s = s[:-1]
        s = _DEGREES.sub("", s)
        if _THOUSANDS.fullmatch(s):
            s = _THOUSANDS_SEP.sub("", s)
        s = s.strip()
        if s == before:
            return s


# ---------------------------------------------------------------------------------------------
# detectors (pure functions over text)
# ---------------------------------------------------------------------------------------------
_ASY = re.compile(r"\[asy\].*?\[/asy\]", re.S)
_TF_ANSWERS = {"true", "false", "yes", "no", "t", "f", "\\text{true}", "\\text{false}", "\\text{yes}", "\\text{no}"}
_PROOF = re.compile(r"\b(prove|proof that|show that|demonstrate that|justify your answer|verify that)\b", re.I)
_QUESTION_CUE = re.compile(
    r"\?|\b(find|compute|determine|calculate|evaluate|what|which of|which one|how many|how much|show|prove|"
    r"express|give|list|sketch|solve|simplify)\b",
    re.I,
)
_SUB_MARKER = re.compile(
    r"(?:(?<=^)|(?<=[\s.:;,$]))(?:\\textbf\s*\{\s*)?\((?P<m>[a-h]|i{1,3}|iv|vi{0,3}|[1-9]|I{1,3}|IV|VI{0,3})\)\}?(?=\s|$|\\)",
    re.M,
)
_SEQUENCES = (list("abcdefgh"), ["i", "ii", "iii", "iv", "v", "vi", "vii", "viii"], list("123456789"),
              ["I", "II", "III", "IV", "V", "VI", "VII", "VIII"])
_OPTION_MARKER = re.compile(
    r"\\(?:textbf|text|mathrm|mathbf|textrm)\s*\{\s*\((?P<a>[A-E])\)[^{}]{0,8}\}"
    r"|(?<![A-Za-z\\])\((?P<b>[A-E])\)(?=\s)"
)
_NEEDS_OPTIONS = re.compile(r"which of the following|closest to|which one of|which statement|which is true", re.I)
_MATRIX = re.compile(r"\\begin\{(?:p|b|v|V|B)?matrix\}|\\begin\{array\}")


def is_true_false(problem: str, answer: str) -> bool:
    """A true/false (yes/no) item: such an answer, or a "true or false" question."""
    a = answer.strip().lower().rstrip(".")
    return a in _TF_ANSWERS or bool(re.search(r"\btrue or false\b", problem, re.I))


def is_proof(problem: str, answer: str) -> bool:
    """A proof item: the question asks to prove / show / demonstrate, or the answer is a proof."""
    a = answer.strip().lower()
    return bool(_PROOF.search(_ASY.sub(" ", problem))) or a in {"proof", "qed", "see proof"}


def sub_questions(problem: str) -> int:
    """Number of marked sub-questions that each ask something (0 if there is no marked list).

    A list of conditions ``(1) ... (2) ...`` under one question counts < 2 because its items do
    not each contain a question cue (``?``, find, compute, what, how many ...).
    """
    text = _ASY.sub(" ", problem)
    marks = list(_SUB_MARKER.finditer(text))
    best = 0
    for seq in _SEQUENCES:
        found: list[re.Match[str]] = []
        want = 0
        for m in marks:
            if want < len(seq) and m.group("m") == seq[want]:
                found.append(m)
                want += 1
        if len(found) < 2:
            continue
        asking = 0
        for k, m in enumerate(found):
            end = found[k + 1].start() if k + 1 < len(found) else len(text)
            if _QUESTION_CUE.search(text[m.end() : end]):
                asking += 1
        best = max(best, asking)
    return best


def answer_has_parts(answer: str) -> bool:
    """A reference answer with labelled parts: ``(a) 3, (b) 5`` or ``(1) ...; (2) ...``."""
    labels = re.findall(r"(?:^|[\s;,])\(?([a-d1-4]|i{1,3})\)\s", " " + answer + " ")
    return len(set(labels)) >= 2


@dataclass
class Options:
    """Parsed multiple-choice options: ``letters -> content`` and the span of the option block."""

    contents: dict[str, str]
    start: int
    end: int


def _clean_option(text: str) -> str:
    s = text
    s = re.sub(r"\\(?:qquad|quad|indent|hfill|hspace\{[^}]*\})", " ", s)
    s = re.sub(r"\\(?:text|mathrm|textrm|mbox)\s*\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\ ", " ").replace("~", " ").replace("$", " ")
    s = s.strip().rstrip(",;").strip()
    return normalize_answer(s)


def parse_options(problem: str) -> Optional[Options]:
    """Options ``(A) ... (B) ... (C) ...`` (plain or ``\\textbf{(A)}`` / ``\\text{(A)}`` /
    ``\\mathrm{(A)}``), at least A-C in order, each short (<= 40 chars, <= 5 words); the last
    run found wins. None if there is none."""
    marks = [(m.start(), m.end(), m.group("a") or m.group("b")) for m in _OPTION_MARKER.finditer(problem)]
    # skip markers inside [asy] blocks
    asy = [(m.start(), m.end()) for m in _ASY.finditer(problem)]
    marks = [mk for mk in marks if not any(a <= mk[0] < b for a, b in asy)]
    best: Optional[list[tuple[int, int, str]]] = None
    i = 0
    while i < len(marks):
        if marks[i][2] != "A":
            i += 1
            continue
        run = [marks[i]]
        j = i + 1
        while j < len(marks) and marks[j][2] == chr(ord(run[-1][2]) + 1):
            run.append(marks[j])
            j += 1
        if len(run) >= 3:
            best = run
        i = j if len(run) > 1 else i + 1
    if best is None:
        return None
    line_end = problem.find("\n", best[-1][1])
    end = len(problem) if line_end < 0 else line_end
    contents: dict[str, str] = {}
    for k, (_, m_end, letter) in enumerate(best):
        stop = best[k + 1][0] if k + 1 < len(best) else end
        contents[letter] = _clean_option(problem[m_end:stop])
    # labelled conditions ("(A) each digit is odd, and (B) ...") are not answer options
    if any(len(c) > 40 or len(re.findall(r"(?<![\\A-Za-z])[A-Za-z]{2,}", c)) > 5 for c in contents.values()):
        return None
    start = best[0][0]
    before = problem[:start].rstrip()
    if before.endswith("$"):
        start = len(before) - 1
    return Options(contents=contents, start=start, end=end)


def _extract(scorer: Any, text: str) -> Optional[str]:
    """A model's final answer, extracted as the scorer scores it (``RewardScorer.extract``: its
    ``reward.extraction`` mode); the last box for scorers without one."""
    fn = getattr(scorer, "extract", None)
    return fn(text) if fn is not None else extract_answer(text, "boxed")


def _same_answer(a: str, b: str) -> bool:
    ca, cb = canonical_integer(a), canonical_integer(b)
    if ca is not None and cb is not None:
        return ca == cb
    return re.sub(r"\s+", "", a) == re.sub(r"\s+", "", b)


def _letter(answer: str) -> Optional[str]:
    s = re.sub(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}", r"\1", answer).strip()
    m = re.fullmatch(r"\(?([A-E])\)?", s)
    return m.group(1) if m else None


def convert_multiple_choice(problem: str, answer: str) -> tuple[Optional[tuple[str, str]], str]:
    """``((problem, answer), "")`` in short-answer form, or ``(None, reason)`` when not convertible.

    Only call when ``parse_options(problem)`` found options.
    """
    opts = parse_options(problem)
    if opts is None:
        return (problem, answer), ""
    if _NEEDS_OPTIONS.search(problem[: opts.start]):
        return None, "the question refers to its options"
    letter = _letter(answer)
    if letter is not None:
        if letter not in opts.contents:
            return None, f"answer letter {letter} is not an option"
        content = opts.contents[letter]
    else:
        match = [c for c in opts.contents.values() if _same_answer(c, answer)]
        if not match:
            return None, "answer is neither an option letter nor an option's content"
        content = match[0]
    if not content or re.search(r"[A-Za-z]{3,}", re.sub(r"\\[A-Za-z]+", "", content)):
        return None, f"option content {content!r} is not a short answer"
    stem = (problem[: opts.start].rstrip() + "\n" + problem[opts.end :].lstrip()).strip()
    return (stem, content), ""


def is_long_answer(answer: str, max_chars: int) -> bool:
    return len(answer) > max_chars or bool(_MATRIX.search(answer))


# ---------------------------------------------------------------------------------------------
# the pipeline
# ---------------------------------------------------------------------------------------------
@dataclass
class Row:
    """One input row (its JSON object) with where it came from."""

    line: int
    data: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.data.get("id") or f"line-{self.line}")


@dataclass
class CleanReport:
    """Counts per filter and every dropped row (line, id, reason, detail)."""

    rows_in: int = 0
    rows_out: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: {k: 0 for k in RULE_FILTERS + MODEL_FILTERS})
    modified: dict[str, int] = field(default_factory=lambda: {k: 0 for k in MODIFICATIONS})
    checked: dict[str, int] = field(default_factory=dict)
    active_filters: list[str] = field(default_factory=list)
    dropped_rows: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    model_stats: dict[str, Any] = field(default_factory=dict)

    def drop(self, row: Row, reason: str, detail: str = "") -> None:
        self.dropped[reason] += 1
        self.dropped_rows.append({"line": row.line, "id": row.id, "reason": reason, "detail": detail})

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows_in": self.rows_in,
            "rows_out": self.rows_out,
            "dropped": dict(self.dropped),
            "dropped_total": sum(self.dropped.values()),
            "modified": dict(self.modified),
            "checked": dict(self.checked),
            "active_filters": list(self.active_filters),
            "settings": dict(self.settings),
            "model_stats": dict(self.model_stats),
            "dropped_rows": list(self.dropped_rows),
        }

    def table(self) -> str:
        """Plain-text table: filter, rows checked, dropped, modified."""
        lines = [f"{'filter':<22}{'checked':>9}{'dropped':>9}{'modified':>10}"]
        mod_of = {"multiple_choice": "multiple_choice_converted"}
        for name in self.active_filters:
            mod = self.modified.get(mod_of.get(name, ""), 0)
            lines.append(f"{name:<22}{self.checked.get(name, 0):>9}{self.dropped.get(name, 0):>9}{mod or '':>10}")
        lines.append(f"{'answer_normalised':<22}{self.rows_in:>9}{'':>9}{self.modified['answer_normalised']:>10}")
        lines.append(f"{'rows in / out':<22}{self.rows_in:>9}{sum(self.dropped.values()):>9}{self.rows_out:>10}")
        return "\n".join(lines)


def read_rows(path: str | Path) -> list[Row]:
    """Rows of a JSONL file; a line that is not a JSON object is a ``DataError`` (file:line).
    Missing / empty fields are *not* errors here: the ``missing_field`` filter records them."""
    return [Row(lineno, obj) for lineno, obj in read_json_objects(path, missing="input file not found")]


def _text(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return ""
    return str(v).strip() if isinstance(v, (str, int, float)) else ""


def apply_rule_filters(rows: list[Row], report: CleanReport, max_answer_chars: int = 50) -> list[Row]:
    """The model-free filters, in the module's order; returns kept rows (with cleaned fields)."""
    report.active_filters.extend(RULE_FILTERS)
    kept: list[Row] = []
    for row in rows:
        d = dict(row.data)
        problem, answer = _text(d.get("problem")), _text(d.get("answer"))
        report.checked["missing_field"] = report.checked.get("missing_field", 0) + 1
        if not problem or not answer:
            report.drop(row, "missing_field", "problem" if not problem else "answer")
            continue
        notes: list[str] = []
        norm = normalize_answer(answer)
        if norm != answer:
            report.modified["answer_normalised"] += 1
            d["answer_original"] = d.get("answer")
            notes.append("answer_normalised")
        answer = norm
        reason, detail = "", ""
        for name in RULE_FILTERS[1:]:
            report.checked[name] = report.checked.get(name, 0) + 1
            if name == "true_false" and is_true_false(problem, answer):
                reason, detail = name, f"answer {answer!r}"
            elif name == "proof" and is_proof(problem, answer):
                reason = name
            elif name == "multiple_choice" and parse_options(problem) is not None:
                converted, why = convert_multiple_choice(problem, answer)
                if converted is None:
                    reason, detail = name, why
                else:
                    problem, new_answer = converted
                    if new_answer != answer:
                        d.setdefault("answer_original", d.get("answer"))
                    answer = new_answer
                    report.modified["multiple_choice_converted"] += 1
                    notes.append("multiple_choice_converted")
            elif name == "multi_part":
                n = sub_questions(problem)
                if n >= 2:
                    reason, detail = name, f"{n} sub-questions"
                elif answer_has_parts(answer):
                    reason, detail = name, "answer has labelled parts"
            elif name == "long_answer" and is_long_answer(answer, max_answer_chars):
                reason, detail = name, f"{len(answer)} chars" if len(answer) > max_answer_chars else "matrix"
            if reason:
                break
        if reason:
            report.drop(row, reason, detail)
            continue
        d["problem"], d["answer"] = problem, answer
        if notes:
            d["clean_notes"] = notes
        kept.append(Row(row.line, d))
    return kept


# ---- model filters ---------------------------------------------------------------------------
@dataclass
class ModelHandle:
    """A model for the model-based filters: a name (for reports), an engine and its tokenizer."""

    name: str
    engine: Engine
    tokenizer: Any


def _generate_answers(
    rows: list[Row],
    model: ModelHandle,
    n: int,
    sampling: SamplingParams,
    max_new_tokens: int,
    batch_prompts: int,
    progress: Optional[Callable[[str], None]],
    label: str,
) -> list[list[tuple[str, bool]]]:
    """``n`` responses per row from ``model``: ``[(text, truncated)] * n`` per row."""
    out: list[list[tuple[str, bool]]] = []
    eos = model.engine.eos_token_id
    rid = 0
    for start in range(0, len(rows), batch_prompts):
        chunk = rows[start : start + batch_prompts]
        reqs: list[GenerationRequest] = []
        for row in chunk:
            item = PromptItem(id=row.id, problem=str(row.data["problem"]), answer=str(row.data["answer"]))
            ids = encode_text(model.tokenizer, build_prompt(item, model.tokenizer))
            for j in range(n):
                seed = sampling.seed + 1000003 * row.line + j  # distinct, reproducible per (row, sample)
                reqs.append(GenerationRequest(rid, ids, [], max_new_tokens, seed=seed))
                rid += 1
        results = model.engine.generate(reqs, sampling)
        for k in range(len(chunk)):
            group = results[k * n : (k + 1) * n]
            out.append([(decode_ids(model.tokenizer, r.token_ids, eos), r.finish_reason == "length") for r in group])
        if progress:
            progress(f"{label}: {min(start + batch_prompts, len(rows))}/{len(rows)} rows")
    return out


def too_easy_filter(
    rows: list[Row],
    model: ModelHandle,
    scorer: Any,
    report: CleanReport,
    k: int = 8,
    sampling: Optional[SamplingParams] = None,
    max_new_tokens: int = 4096,
    batch_prompts: int = 8,
    progress: Optional[Callable[[str], None]] = None,
) -> list[Row]:
    """Drop rows that ``model`` answers right in all ``k`` samples (scored by ``scorer``, a
    ``RewardScorer``, with its judge if it has one)."""
    report.active_filters.append("too_easy")
    sampling = sampling or SamplingParams(temperature=0.85, seed=0)
    responses = _generate_answers(rows, model, k, sampling, max_new_tokens, batch_prompts, progress, "too_easy")
    kept: list[Row] = []
    for row, resp in zip(rows, responses):
        report.checked["too_easy"] = report.checked.get("too_easy", 0) + 1
        problem = str(row.data["problem"])
        rewards = scorer.score([(text, str(row.data["answer"]), trunc, problem) for text, trunc in resp])
        if rewards and all(r == 1.0 for r in rewards):
            report.drop(row, "too_easy", f"{model.name}: {k}/{k} right")
        else:
            kept.append(row)
    return kept


def consensus_filter(
    rows: list[Row],
    models: list[ModelHandle],
    scorer: Any,
    report: CleanReport,
    judge: Any = None,
    max_new_tokens: int = 4096,
    batch_prompts: int = 8,
    progress: Optional[Callable[[str], None]] = None,
) -> list[Row]:
    """Drop rows where every model gives an answer, the answers agree with each other and the
    common answer is not equivalent to the reference (rule check, then ``judge`` if given).
    Each model answers once, greedily. Undecidable comparisons (timeouts) keep the row."""
    report.active_filters.append("consensus_disagrees")
    greedy = SamplingParams(temperature=1.0, greedy=True, seed=0)
    per_model = [
        _generate_answers(rows, m, 1, greedy, max_new_tokens, batch_prompts, progress, f"consensus {m.name}")
        for m in models
    ]
    kept: list[Row] = []
    for idx, row in enumerate(rows):
        report.checked["consensus_disagrees"] = report.checked.get("consensus_disagrees", 0) + 1
        answers = []
        for resp in per_model:
            text, trunc = resp[idx][0]
            answers.append(None if trunc else _extract(scorer, text))
        ref = str(row.data["answer"])
        if any(not a for a in answers):
            kept.append(row)
            continue
        first = answers[0]
        agree = scorer.verify_many([(a, first) for a in answers[1:]]) if len(answers) > 1 else []
        if not all(v is True for v in agree):
            kept.append(row)
            continue
        (matches_ref,) = scorer.verify_many([(first, ref, str(row.data["problem"]))])
        if matches_ref is False and judge is not None and judge.judge(first, ref):
            matches_ref = True
        if matches_ref is False:
            report.drop(row, "consensus_disagrees", f"models agree on {first!r}, reference {ref!r}")
        else:
            kept.append(row)
    return kept


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary sibling renamed into place: a write cut short
    (full disk, kill) leaves the earlier file, never half of the new one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)


def write_jsonl(rows: list[dict[str, Any]], path: str | Path) -> None:
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def clean_file(
    input_path: str | Path,
    max_answer_chars: int = 50,
    strong_model: Optional[ModelHandle] = None,
    too_easy_k: int = 8,
    consensus_models: Optional[list[ModelHandle]] = None,
    scorer: Any = None,
    judge: Any = None,
    max_new_tokens: int = 4096,
    batch_prompts: int = 8,
    temperature: float = 0.85,
    log: Optional[TextIO] = None,
) -> tuple[list[dict[str, Any]], CleanReport]:
    """Run the pipeline on a JSONL file: rule filters, then (when models are given) ``too_easy``
    with ``strong_model`` and ``consensus_disagrees`` with ``consensus_models``. The model filters
    need ``scorer`` (a ``RewardScorer``). Returns ``(kept rows, report)``."""
    log = log or sys.stderr

    def progress(msg: str) -> None:
        print(f"[ulorl-clean] {msg}", file=log, flush=True)

    rows = read_rows(input_path)
    if not rows:   # as ulorl-eval and training refuse it: a clean of nothing is a wrong path, not a result
        raise DataError(f"{input_path}: no rows (the file is empty); give the JSONL file of problems to clean "
                        "(one JSON object per line with problem and answer)")
    report = CleanReport(rows_in=len(rows))
    report.settings = {
        "input": str(input_path),
        "max_answer_chars": max_answer_chars,
        "too_easy_model": strong_model.name if strong_model else None,
        "too_easy_k": too_easy_k if strong_model else None,
        "consensus_models": [m.name for m in consensus_models] if consensus_models else [],
        "max_new_tokens": max_new_tokens if (strong_model or consensus_models) else None,
        "temperature": temperature if strong_model else None,
    }
    progress(f"read {len(rows)} rows from {input_path}")
    kept = apply_rule_filters(rows, report, max_answer_chars=max_answer_chars)
    progress(f"rule filters: {len(kept)}/{len(rows)} rows kept")
    if (strong_model is not None and too_easy_k > 0) or consensus_models:
        if scorer is None:
            raise ValueError("model-based filters need a scorer (ulorl.reward.RewardScorer)")
    if strong_model is not None and too_easy_k > 0:
        kept = too_easy_filter(kept, strong_model, scorer, report, k=too_easy_k, max_new_tokens=max_new_tokens,
                               sampling=SamplingParams(temperature=temperature, seed=0),
                               batch_prompts=batch_prompts, progress=progress)
    if consensus_models:
        kept = consensus_filter(kept, consensus_models, scorer, report, judge=judge, max_new_tokens=max_new_tokens,
                                batch_prompts=batch_prompts, progress=progress)
    report.rows_out = len(kept)
    if scorer is not None and hasattr(scorer, "stats"):
        report.model_stats["scorer"] = scorer.stats
    if judge is not None and hasattr(judge, "stats"):
        report.model_stats["judge"] = judge.stats
    return [r.data for r in kept], report
