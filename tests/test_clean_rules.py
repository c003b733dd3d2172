"""Model-free cleaning filters, the pipeline and the ulorl-clean command."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from ulorl.cli.clean import main as clean_main
from ulorl.data.clean import (
    CleanReport,
    answer_has_parts,
    apply_rule_filters,
    clean_file,
    convert_multiple_choice,
    is_long_answer,
    is_proof,
    is_true_false,
    normalize_answer,
    parse_options,
    read_rows,
    sub_questions,
)
from ulorl.data.jsonl import PACKAGED_DIR, DataError

DATA_DIR = PACKAGED_DIR  # the 2,000-row sample ships with the package (its README: origin, licence)


@pytest.mark.parametrize(
    "raw, norm",
    [
        (r"\boxed{1,000}", "1000"),
        ("$336^\\circ$", "336"),
        (r"90^{\circ}", "90"),
        ("45°", "45"),
        ("27.", "27"),
        (r"1{,}234{,}567", "1234567"),
        (r"1\,000", "1000"),
        (r"$\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"\(5\)", "5"),
        ("(1,2)", "(1,2)"),  # a pair, not a thousands separator
        ("3.5", "3.5"),
        (r"\boxed{1}+\boxed{2}", r"\boxed{1}+\boxed{2}"),  # the box does not span the answer
        ("  70 ", "70"),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_question_type_detectors():
    assert is_true_false("Is 7 prime?", "Yes") and is_true_false("True or false: 2 is even.", "T")
    assert not is_true_false("For how many a is it true that a < 5?", "4")
    assert is_proof("Prove that there are infinitely many primes.", "")
    assert is_proof("Show that $n^2 - n$ is even.", "0")
    assert not is_proof("Find the number of proofs... of 12 ways", "12")
    assert sub_questions("(a) Find $x$.\n(b) Compute $x+y$.") == 2
    assert sub_questions("Part (i) what is $a$? Part (ii) what is $b$?") == 2
    # a list of conditions under one question is one question
    assert sub_questions("Find k such that\n (1) a is positive\n (2) a_9 = k\n are satisfied.") < 2
    assert sub_questions("Compute f(1) + f(2).") == 0
    assert answer_has_parts("(a) 3, (b) 5") and not answer_has_parts("(3, 5)")
    assert is_long_answer(r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", 50)
    assert is_long_answer("x" * 51, 50) and not is_long_answer("x" * 50, 50)


AMC = (
    "How many triangles are there?\n"
    r"$\textbf{(A)}\ 2128 \qquad\textbf{(B)}\ 2148 \qquad\textbf{(C)}\ 2160 \qquad\textbf{(D)}\ 2200 \qquad"
    r"\textbf{(E)}\ \text{none of these}$"
)


def test_multiple_choice_parse_and_convert():
    opts = parse_options(AMC)
    assert opts is not None and opts.contents == {
        "A": "2128", "B": "2148", "C": "2160", "D": "2200", "E": "none of these"
    }
    assert convert_multiple_choice(AMC, "2148") == (("How many triangles are there?", "2148"), "")
    assert convert_multiple_choice(AMC, r"\text{(B)}") == (("How many triangles are there?", "2148"), "")
    assert convert_multiple_choice(AMC, "B") == (("How many triangles are there?", "2148"), "")
    assert convert_multiple_choice(AMC, "E")[0] is None  # "none of these" is not a short answer
    assert convert_multiple_choice(AMC, "9999")[0] is None
    which = AMC.replace("How many triangles are there?", "Which of the following is prime?")
    assert convert_multiple_choice(which, "B") == (None, "the question refers to its options")
    plain = "What is 6*7?\n(A) 40 (B) 41 (C) 42 (D) 43"
    assert convert_multiple_choice(plain, "C") == (("What is 6*7?", "42"), "")
    conditions = (
        "How many 4-digit integers satisfy: (A) Each of the first two digits must be 1, 4, or 5, and "
        "(B) the last two digits cannot be the same digit, and (C) each of the last two digits must be 5, 7, or 8?"
    )
    assert parse_options(conditions) is None  # labelled conditions, not options
    asy = "[asy] dot (A); dot (B); dot (C); [/asy] Find AB."
    assert parse_options(asy) is None


def _rows_file(tmp_path: Path) -> Path:
    rows = [
        {"id": "ok", "problem": "What is 2+2?", "answer": "$4$."},
        {"id": "noans", "problem": "What is 2+2?", "answer": ""},
        {"id": "tf", "problem": "Is 91 prime?", "answer": "No"},
        {"id": "proof", "problem": "Prove that sqrt(2) is irrational.", "answer": "proof"},
        {"id": "mc", "problem": AMC, "answer": "B"},
        {"id": "mcbad", "problem": AMC, "answer": "E"},
        {"id": "multi", "problem": "(a) Find x. (b) Find y.", "answer": "3"},
        {"id": "long", "problem": "Find the matrix.", "answer": r"\begin{pmatrix}1&0\\0&1\end{pmatrix}"},
        {"id": "big", "problem": "Compute N.", "answer": "33,124,147"},
    ]
    p = tmp_path / "raw.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return p


def test_rule_pipeline_counts_and_reasons(tmp_path):
    kept, report = clean_file(_rows_file(tmp_path), log=io.StringIO())
    assert [r["id"] for r in kept] == ["ok", "mc", "big"]
    assert kept[0]["answer"] == "4" and kept[0]["answer_original"] == "$4$."
    assert kept[1]["answer"] == "2148" and kept[1]["problem"] == "How many triangles are there?"
    assert kept[1]["clean_notes"] == ["multiple_choice_converted"]
    assert kept[2]["answer"] == "33124147"
    d = report.to_dict()
    assert d["rows_in"] == 9 and d["rows_out"] == 3 and d["dropped_total"] == 6
    assert {k: v for k, v in d["dropped"].items() if v} == {
        "missing_field": 1, "true_false": 1, "proof": 1, "multiple_choice": 1, "multi_part": 1, "long_answer": 1
    }
    assert d["modified"] == {"answer_normalised": 2, "multiple_choice_converted": 1}
    assert [(r["line"], r["id"], r["reason"]) for r in d["dropped_rows"]] == [
        (2, "noans", "missing_field"), (3, "tf", "true_false"), (4, "proof", "proof"),
        (6, "mcbad", "multiple_choice"), (7, "multi", "multi_part"), (8, "long", "long_answer"),
    ]
    assert "too_easy" not in d["active_filters"]  # model filters off without models
    assert "rows in / out" in report.table()


def test_read_rows_rejects_broken_json(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"problem": "x", "answer": "1"}\n{oops\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: not valid JSON"):
        read_rows(p)


def test_math_train_sample_counts():
    """Measured on the packaged 2,000-row sample (fixed file, sha256 in its README)."""
    rows = read_rows(DATA_DIR / "math_train_sample.jsonl")
    report = CleanReport(rows_in=len(rows))
    kept = apply_rule_filters(rows, report)
    assert len(kept) == 1997
    assert {k: v for k, v in report.dropped.items() if v} == {"multiple_choice": 3}
    assert report.modified == {"answer_normalised": 0, "multiple_choice_converted": 44}


def test_cli_json_report_and_errors(tmp_path, capsys):
    src = _rows_file(tmp_path)
    out = tmp_path / "out" / "clean.jsonl"
    rc = clean_main([str(src), "--out", str(out), "--dropped", str(tmp_path / "dropped.jsonl"), "--json"])
    captured = capsys.readouterr()
    assert rc == 0
    summary = json.loads(captured.out)  # exactly one JSON object on stdout
    assert summary["rows_out"] == 3 and summary["dropped"]["proof"] == 1
    assert "filter" in captured.err  # the table goes to stderr with --json
    report = json.loads((tmp_path / "out" / "clean.report.json").read_text())
    assert len(report["dropped_rows"]) == 6
    assert len(out.read_text().splitlines()) == 3
    dropped = [json.loads(x) for x in (tmp_path / "dropped.jsonl").read_text().splitlines()]
    assert dropped[0]["id"] == "noans" and dropped[0]["_drop_reason"] == "missing_field"
    assert clean_main([str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 2
    assert "input file not found" in capsys.readouterr().err
    assert clean_main([str(src), "--out", str(src)]) == 2
    assert "overwrite the input" in capsys.readouterr().err
