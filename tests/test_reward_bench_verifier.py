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
