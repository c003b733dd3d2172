"""Model-based cleaning filters through the Engine interface, with scripted fake engines."""

from __future__ import annotations

import io
import json
import re

import pytest
from reward_fakes import TextScriptedEngine, byte_tokenizer

from ulorl.data.clean import CleanReport, ModelHandle, Row, clean_file, consensus_filter, too_easy_filter
from ulorl.reward import GenerativeJudge, RewardScorer

TOK = byte_tokenizer()


def _problem(prompt: str) -> str:
    return re.search(r"Problem: (.*?)\n", prompt).group(1)


def strong_reply(prompt: str, req) -> str:
    """EASY: always right; HARD: right on even seeds only; the rest: answers 5."""
    p = _problem(prompt)
    if p.startswith("EASY"):
        return r"Step by step... \boxed{12}"
    if p.startswith("HARD"):
        return r"\boxed{7}" if req.seed % 2 == 0 else r"\boxed{8}"
    return r"\boxed{5}"


def model_b_reply(prompt: str, req) -> str:
    p = _problem(prompt)
    if p.startswith("HARD"):
        return r"\boxed{9}"  # disagrees with the other model
    if p.startswith("NOBOX"):
        return "I give up"
    if p.startswith("UNITS"):
        return r"\boxed{27cm}"
    return r"\boxed{5.0}"  # agrees with "5" by math-verify, not by string


def judge_reply(prompt: str, req) -> str:
    pred = re.search(r"Predicted answer: (.*)\n", prompt).group(1)
    return "VERDICT: YES" if pred == "27cm" else "VERDICT: NO"


ROWS = [
    {"id": "easy", "problem": "EASY 3*4?", "answer": "12"},
    {"id": "hard", "problem": "HARD 3+4?", "answer": "7"},
    {"id": "badref", "problem": "BADREF 2+3?", "answer": "6"},  # both models say 5
    {"id": "goodref", "problem": "GOODREF 2+3?", "answer": "5"},
    {"id": "nobox", "problem": "NOBOX 2+3?", "answer": "6"},
    {"id": "units", "problem": "UNITS length?", "answer": "0.27m"},
]


def _rows() -> list[Row]:
    return [Row(i + 1, dict(r)) for i, r in enumerate(ROWS)]


@pytest.fixture(scope="module")
def scorer():
    with RewardScorer(timeout_s=10.0) as s:
        yield s


def test_too_easy_drops_only_all_right(scorer):
    engine = TextScriptedEngine(TOK, strong_reply)
    report = CleanReport()
    kept = too_easy_filter(_rows(), ModelHandle("strong", engine, TOK), scorer, report, k=4, batch_prompts=4)
    assert [r.id for r in kept] == ["hard", "badref", "nobox", "units"]
    assert report.dropped["too_easy"] == 2  # goodref: the strong model's constant 5 is right
    assert [d["id"] for d in report.dropped_rows] == ["easy", "goodref"]
    assert [n for n, _ in engine.calls] == [16, 8]  # 4 problems x k=4, then 2 x 4
    assert not engine.calls[0][1].greedy and engine.calls[0][1].temperature == 0.85


def test_too_easy_counts_truncated_as_wrong(scorer):
    engine = TextScriptedEngine(TOK, strong_reply, truncate_at=5)  # every reply cut before its box
    report = CleanReport()
    kept = too_easy_filter(_rows()[:1], ModelHandle("strong", engine, TOK), scorer, report, k=2)
    assert len(kept) == 1 and report.dropped["too_easy"] == 0


def test_consensus_drops_rows_whose_reference_disagrees(scorer):
    b = ModelHandle("b", TextScriptedEngine(TOK, model_b_reply), TOK)
    judge = GenerativeJudge(TextScriptedEngine(TOK, judge_reply), TOK)
    report = CleanReport()
    rows = [r for r in _rows() if r.id != "easy"]
    # model a answers like the strong model, except "27cm" on the UNITS row (as b does)
    a_units = ModelHandle(
        "a", TextScriptedEngine(TOK, lambda p, r: model_b_reply(p, r) if "UNITS" in p else strong_reply(p, r)), TOK
    )
    kept = consensus_filter(rows, [a_units, b], scorer, report, judge=judge)
    assert [r.id for r in kept] == ["hard", "goodref", "nobox", "units"]
    assert [(d["id"], d["reason"]) for d in report.dropped_rows] == [("badref", "consensus_disagrees")]
    assert judge.stats["yes"] == 1  # 27cm vs 0.27m rescued by the judge
    assert all(s.greedy for _, s in a_units.engine.calls)


def test_clean_file_with_models(tmp_path, scorer):
    src = tmp_path / "raw.jsonl"
    rows = ROWS + [{"id": "tf", "problem": "Is 7 odd?", "answer": "yes"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    strong = ModelHandle("strong", TextScriptedEngine(TOK, strong_reply), TOK)
    b = ModelHandle("b", TextScriptedEngine(TOK, model_b_reply), TOK)
    kept, report = clean_file(src, strong_model=strong, too_easy_k=2, consensus_models=[strong, b], scorer=scorer,
                              log=io.StringIO())
    d = report.to_dict()
    assert [r["id"] for r in kept] == ["hard", "nobox", "units"]
    assert {k: v for k, v in d["dropped"].items() if v} == {"true_false": 1, "too_easy": 2, "consensus_disagrees": 1}
    assert d["active_filters"][-2:] == ["too_easy", "consensus_disagrees"]
    assert d["settings"]["consensus_models"] == ["strong", "b"] and d["model_stats"]["scorer"]["items"] > 0
    with pytest.raises(ValueError, match="scorer"):
        clean_file(src, strong_model=strong, log=io.StringIO())
