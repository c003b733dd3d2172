"""ulorl-clean never overwrites its input and refuses what it cannot do before any work: an output
(--out, --report, its default, --dropped) that is the input (also through a symlink or a hard link), two
outputs on one file, an output that is a folder, an input with no rows. Each refusal: the message, exit 2,
the input byte for byte as it was, no output written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ulorl.cli import clean as clean_cli

ROWS = [{"problem": "What is 1+1?", "answer": "2"},
        {"problem": "True or false: 7 is prime.", "answer": "True"}]


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return inp


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], inp: Path, message: str) -> None:
    before = inp.read_bytes()
    listing = sorted(p.name for p in inp.parent.iterdir())
    assert clean_cli.main(argv) == 2
    assert capsys.readouterr().err.strip() == f"ulorl-clean: error: {message}"
    assert inp.read_bytes() == before                                # the input as it was
    assert sorted(p.name for p in inp.parent.iterdir()) == listing   # no output, no temporary file


def test_an_output_that_is_the_input_is_refused(data, capsys, monkeypatch):
    monkeypatch.chdir(data.parent)
    out = "o.jsonl"
    never = "would overwrite the input in.jsonl; give another path (ulorl-clean never changes its input)"
    _refused(["in.jsonl", "--out", out, "--report", "in.jsonl"], capsys, data, f"--report in.jsonl {never}")
    _refused(["in.jsonl", "--out", out, "--dropped", "in.jsonl"], capsys, data, f"--dropped in.jsonl {never}")
    _refused(["in.jsonl", "--out", "./in.jsonl"], capsys, data, f"--out in.jsonl {never}")
    (data.parent / "link.jsonl").symlink_to(data)
    _refused(["in.jsonl", "--out", out, "--report", "link.jsonl"], capsys, data, f"--report link.jsonl {never}")
    os.link(data, data.parent / "hard.jsonl")
    _refused(["in.jsonl", "--out", out, "--dropped", "hard.jsonl"], capsys, data, f"--dropped hard.jsonl {never}")
    # the default report (<out stem>.report.json) is the input
    report_named = data.parent / "in.report.json"
    report_named.write_bytes(data.read_bytes())
    _refused(["in.report.json", "--out", "in.x"], capsys, report_named,
             "--report (default <out stem>.report.json) in.report.json would overwrite the input in.report.json; give "
             "another path (ulorl-clean never changes its input)")


def test_two_outputs_on_one_file_and_outputs_that_are_folders_are_refused(data, capsys, monkeypatch):
    monkeypatch.chdir(data.parent)
    (data.parent / "d").mkdir()
    _refused(["in.jsonl", "--out", "o.jsonl", "--report", "o.jsonl"], capsys, data,
             "--report o.jsonl is also --out: one would overwrite the other; give each its own path")
    _refused(["in.jsonl", "--out", "o.jsonl", "--dropped", "o.jsonl"], capsys, data,
             "--dropped o.jsonl is also --out: one would overwrite the other; give each its own path")
    _refused(["in.jsonl", "--out", "d"], capsys, data, "--out d is a folder; give a file path, e.g. d/clean.jsonl")
    _refused(["in.jsonl", "--out", "o.jsonl", "--report", "d"], capsys, data,
             "--report d is a folder; give a file path")
    _refused(["in.jsonl", "--out", "in.jsonl/o.jsonl"], capsys, data, "--out in.jsonl/o.jsonl: in.jsonl is a file, not "
             "a folder")
    _refused(["d", "--out", "o.jsonl"], capsys, data, "input d is a folder; give the JSONL file to clean")


def test_an_empty_input_is_refused_like_ulorl_eval_refuses_it(tmp_path, capsys):
    for text in ("", "\n\n"):
        empty = tmp_path / "empty.jsonl"
        empty.write_text(text)
        _refused([str(empty), "--out", str(tmp_path / "o.jsonl")], capsys, empty,
                 f"{empty}: no rows (the file is empty); give the JSONL file of problems to clean (one JSON object per "
                 "line with problem and answer)")


def test_a_clean_run_writes_its_outputs_and_leaves_the_input(data, capsys):
    before = data.read_bytes()
    out, dropped = data.parent / "o.jsonl", data.parent / "dropped.jsonl"
    assert clean_cli.main([str(data), "--out", str(out), "--dropped", str(dropped)]) == 0
    assert data.read_bytes() == before
    assert [json.loads(x)["answer"] for x in out.read_text().splitlines()] == ["2"]
    assert [json.loads(x)["_drop_reason"] for x in dropped.read_text().splitlines()] == ["true_false"]
    assert json.loads((data.parent / "o.report.json").read_text())["rows_in"] == 2
    assert sorted(p.name for p in data.parent.iterdir()) == ["dropped.jsonl", "in.jsonl", "o.jsonl", "o.report.json"]
