"""``ulorl-tables --mismatch`` on a source it cannot report on: an empty results file, another tool's file,
a file that is not UTF-8 (named, given alone or in a folder), a ``--sweep`` no run belongs to (from a store
and from results files), a store without runs. Each: one message naming the file or flag and the fix,
exit 2, no report folder written (it used to write empty tables and exit 0, or name no file)."""

from __future__ import annotations

import json
from pathlib import Path

from test_report_mismatch import _write_store

from ulorl.cli.tables import main as tables_main

ROOT = Path(__file__).resolve().parents[1]
HINT = "ulorl-tables --tracking-uri URI --export-results DIR"


def _tables(capsys, *argv: str) -> tuple[int, str]:
    rc = tables_main(list(argv))
    return rc, capsys.readouterr().err.strip().splitlines()[-1]


def test_an_empty_results_file(tmp_path, capsys):
    f = tmp_path / "empty.jsonl"
    f.write_text("")
    out = tmp_path / "report"
    rc, err = _tables(capsys, "--mismatch", "--results", str(f), "--out", str(out))
    assert rc == 2
    assert err == (f"ulorl-tables: error: --results {f} holds no runs (an empty file, or a folder without results "
                   f"files); write them with {HINT}")
    assert not out.exists()


def test_another_tools_file(tmp_path, capsys):
    f = tmp_path / "entropy_map.jsonl"     # rows with a run_id, but an entropy map's, not results records
    f.write_text((ROOT / "experiments" / "results" / "entropy_map.jsonl").read_text().splitlines()[0] + "\n")
    out = tmp_path / "report"
    rc, err = _tables(capsys, "--mismatch", "--results", str(f), "--out", str(out))
    assert rc == 2
    assert err == (f"ulorl-tables: error: --results {f} line 1 is not a results record (no format / run_id field): "
                   f"another tool's file? give the results files {HINT} writes")
    assert not out.exists()


def test_a_file_that_is_not_utf8_is_named(tmp_path, capsys):
    folder = tmp_path / "results"
    folder.mkdir()
    f = folder / "latin1.jsonl"
    f.write_bytes(b'{"format": 1, "run_id": "caf\xe9"}\n')
    out = tmp_path / "report"
    for given in (f, folder):              # alone, and found in a folder
        rc, err = _tables(capsys, "--mismatch", "--results", str(given), "--out", str(out))
        assert rc == 2
        assert err == (f"ulorl-tables: error: --results {f} is not UTF-8 text (at byte offset 28); give the results "
                       f"files {HINT} writes")
    assert not out.exists()


def test_a_sweep_no_run_belongs_to(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    _write_store(uri)
    out = tmp_path / "report"
    rc, err = _tables(capsys, "--mismatch", "--tracking-uri", uri, "--sweep", "nosuch", "--out", str(out))
    assert rc == 2
    assert err == (f"ulorl-tables: error: --sweep nosuch: no run in the MLflow store {uri} belongs to that sweep; "
                   "the sweeps it holds: elsewhere, mm")
    assert not out.exists()
    results = tmp_path / "results"
    assert tables_main(["--tracking-uri", uri, "--export-results", str(results)]) == 0
    capsys.readouterr()
    rc, err = _tables(capsys, "--mismatch", "--results", str(results), "--sweep", "mm", "--sweep", "nosuch",
                      "--out", str(out))
    assert rc == 2
    assert err == (f"ulorl-tables: error: --sweep nosuch: no run in --results {results} belongs to that sweep; the "
                   "sweeps it holds: elsewhere, mm")
    assert not out.exists()
    assert tables_main(["--mismatch", "--results", str(results), "--sweep", "mm", "--out", str(out)]) == 0
    assert json.loads(json.dumps(sorted(p.name for p in out.iterdir()))) == ["mismatch.csv", "mismatch.md",
                                                                             "mismatch_arms.md"]


def test_a_store_without_runs(tmp_path, capsys):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(tracking_uri=uri).create_experiment("ulorl")
    out = tmp_path / "report"
    rc, err = _tables(capsys, "--mismatch", "--tracking-uri", uri, "--out", str(out))
    assert rc == 2
    assert err == (f"ulorl-tables: error: the MLflow store {uri} holds no runs; give the store (or results files) "
                   "your runs were tracked in")
    assert not out.exists()
