"""``ulorl-bench verifier`` on the licensed labelled sample in tests/data (real scorer workers)."""

from __future__ import annotations

import json
from pathlib import Path

from ulorl.cli.bench import main

SAMPLE = Path(__file__).parent / "data" / "verifier_sample.jsonl"


def test_verifier_bench_json_and_rows_on_sample(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    rc = main(["verifier", str(SAMPLE), "--extraction", "boxed_or_final", "--json", "--out", str(out),
               "--timeout-s", "2"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    labelled = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    n = len(labelled)
    assert res["n"] == n and res["extraction"] == "boxed_or_final"
    assert res["agreement"] == (n - res["false_positives"] - res["false_negatives"]) / n
    assert res["items_per_s"] > 0
    by = res["by_source"]
    assert set(by) == {r["source"] for r in labelled}
    assert sum(c["n"] for c in by.values()) == n
    assert sum(c["false_negatives"] for c in by.values()) == res["false_negatives"]
    # real model responses (ToRA's GSM8K outputs) agree with their published grader on every row here
    assert by["tora-gsm8k-tora-70b"]["agreement"] == 1.0 and by["tora-gsm8k-tora-code-34b"]["agreement"] == 1.0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == n
    for row, lab in zip(rows, labelled):
        assert row["label"] == lab["label"] and row["agree"] == ((row["score"] >= 1.0) == lab["label"])
    assert sum(not r["agree"] for r in rows) == res["false_positives"] + res["false_negatives"]
    assert res["with_box"]["n"] == sum(r["has_box"] for r in rows)


def test_verifier_bench_table_and_modes(tmp_path, capsys):
    f = tmp_path / "tiny.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"response": "so the answer is 12.", "answer": "12", "label": True, "source": "s"},
        {"response": r"\boxed{13}", "answer": "12", "label": False, "source": "s"},
        {"response": r"\boxed{12}", "answer": "12", "label": False, "source": "t"},
    ]) + "\n")
    assert main(["verifier", str(f), "--json"]) == 0  # boxed: the unboxed right answer scores 0
    boxed = json.loads(capsys.readouterr().out)
    assert (boxed["false_negatives"], boxed["false_positives"]) == (1, 1)
    assert main(["verifier", str(f), "--extraction", "boxed_or_final"]) == 0
    table = capsys.readouterr().out
    assert "extraction=boxed_or_final" in table and "66.67%" in table  # 2 of 3 agree


def test_verifier_bench_bad_input(tmp_path, capsys):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"response": "x", "answer": "1", "label": True}) + "\n"
                 + json.dumps({"response": "x", "answer": "1"}) + "\n")
    assert main(["verifier", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}:2" in err and "'label'" in err
    assert main(["verifier"]) == 2


def _rows_file(tmp_path, rows):
    f = tmp_path / "rows.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return f


def test_verifier_bench_split_and_every_mode(tmp_path, capsys):
    rows = [
        {"response": "so the answer is 12.", "answer": "12", "label": True, "source": "s", "split": "dev"},
        {"response": r"\boxed{13}", "answer": "12", "label": False, "source": "s", "split": "dev"},
        {"response": r"\boxed{12}", "answer": "12", "label": False, "source": "t", "split": "test"},
        {"response": "The correct answer is (B).", "answer": "B", "label": True, "source": "t", "split": "test"},
    ]
    f = _rows_file(tmp_path, rows)
    assert main(["verifier", str(f), "--split", "test", "--extraction", "all", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["split"] == "test" and res["n"] == 2 and set(res["by_extraction"]) == {"boxed", "boxed_or_final"}
    boxed, final = res["by_extraction"]["boxed"], res["by_extraction"]["boxed_or_final"]
    assert res["extraction"] == "boxed" and res["agreement"] == boxed["agreement"]  # top level: the first mode
    assert (boxed["false_positives"], boxed["false_negatives"]) == (1, 1)  # no box: the letter scores 0
    assert (final["false_positives"], final["false_negatives"]) == (1, 0)
    assert final["by_source"] == {"t": {"n": 2, "agreement": 0.5, "false_positives": 1, "false_negatives": 0}}
    assert boxed["items_per_s"] > 0 and final["items_per_s"] > 0
    assert main(["verifier", str(f), "--split", "dev", "--extraction", "all", "--out", str(tmp_path / "o.jsonl")]) == 0
    table = capsys.readouterr().out
    assert "extraction=boxed," in table and "extraction=boxed_or_final," in table
    out_rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["extraction"] for r in out_rows] == ["boxed", "boxed", "boxed_or_final", "boxed_or_final"]


def test_verifier_bench_split_errors(tmp_path, capsys):
    f = _rows_file(tmp_path, [{"response": "x", "answer": "1", "label": True}])
    assert main(["verifier", str(f), "--split", "dev"]) == 2
    assert "no row has a 'split' field" in capsys.readouterr().err
    f = _rows_file(tmp_path, [{"response": "x", "answer": "1", "label": True, "split": "dev"}])
    assert main(["verifier", str(f), "--split", "test"]) == 2
    assert "no row with split 'test'" in capsys.readouterr().err
