"""``ulorl-bench entropy-map --summary`` on inputs it cannot use: a missing, empty, non-UTF-8, malformed or
foreign results file, a ``--pair`` that is not two of the file's variants, a ``--plot`` that is a folder,
sits in a missing folder or has no image extension. Each: one message naming the file or flag and the fix,
exit 2, nothing written (no traceback, no empty table with exit 0, no ``<folder>.png``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ulorl.cli import bench as bench_cli

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results" / "entropy_map.jsonl"


def _summary(capsys, *argv: str) -> tuple[int, str, str]:
    rc = bench_cli.main(["entropy-map", "--summary", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err.strip()


@pytest.fixture
def good(tmp_path) -> Path:
    """Two rows of the shipped map (variants of its first two lines)."""
    f = tmp_path / "map.jsonl"
    f.write_text("".join(RESULTS.read_text().splitlines(keepends=True)[:2]))
    return f


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_good_file_still_prints_its_table_and_plot(good, tmp_path, capsys):
    rc, out, err = _summary(capsys, "--out", str(good), "--plot", str(tmp_path / "map.png"))
    assert rc == 0 and err == ""
    assert sum(x.startswith("| ") for x in out.splitlines()) == 3          # header + 2 rows
    assert (tmp_path / "map.png").stat().st_size > 0


def test_a_missing_results_file(tmp_path, capsys):
    f = tmp_path / "nosuch.jsonl"
    rc, out, err = _summary(capsys, "--out", str(f))
    assert (rc, out) == (2, "")
    assert err == (f"entropy_map: --out {f} does not exist; give the results JSONL (the file python -m "
                   "ulorl.bench.entropy_map SPEC --out FILE appends to), or run the map first")
    assert not f.exists()


def test_an_empty_results_file(tmp_path, capsys):
    f = tmp_path / "empty.jsonl"
    f.write_text("\n")
    rc, out, err = _summary(capsys, "--out", str(f))
    assert (rc, out) == (2, "")
    assert err == (f"entropy_map: --out {f} holds no rows; run the map first (python -m ulorl.bench.entropy_map SPEC "
                   f"--out {f}) or give the file it wrote")


def test_a_malformed_line_is_named_with_its_number(good, capsys):
    good.write_text(good.read_text() + '{"label": "torn", "entr\n')
    before = good.read_bytes()
    rc, out, err = _summary(capsys, "--out", str(good))
    assert (rc, out) == (2, "")
    assert err.startswith(f"entropy_map: --out {good} line 3 is not JSON (")
    assert err.endswith("the file holds one JSON object per line: remove or repair that line (a run cut short leaves "
                        "at most its last line torn)")
    assert good.read_bytes() == before                                # nothing repaired behind the user's back


def test_a_file_that_is_not_utf8(tmp_path, capsys):
    f = tmp_path / "latin1.jsonl"
    f.write_bytes(b'{"label": "caf\xe9"}\n')
    rc, out, err = _summary(capsys, "--out", str(f))
    assert (rc, out) == (2, "")
    assert err == (f"entropy_map: --out {f} is not UTF-8 text (at byte offset 14); give the results JSONL (the file "
                   "python -m ulorl.bench.entropy_map SPEC --out FILE appends to)")


def test_another_tools_results_file(tmp_path, capsys):
    f = tmp_path / "store.jsonl"
    f.write_text(json.dumps({"run_id": "r1", "metrics": {}, "params": {}}) + "\n")   # a results store line
    rc, out, err = _summary(capsys, "--out", str(f))
    assert (rc, out) == (2, "")
    assert err == (f"entropy_map: --out {f} line 1 is not an entropy-map row (no cost, entropy, label, seed_offset, "
                   "variant of the right type): is it another tool's results file? give the file python -m "
                   "ulorl.bench.entropy_map SPEC --out FILE appends to")
    f.write_text("[1, 2]\n")
    assert _summary(capsys, "--out", str(f))[0] == 2


@pytest.mark.parametrize("pair, why", [
    ("foo", "expected two variant names 'A,B' (A's final entropy minus B's)"),
    ("a,b,c", "expected two variant names 'A,B' (A's final entropy minus B's)"),
    ("nosuch,other", "no row of variant 'nosuch', 'other'"),
])
def test_a_pair_that_is_not_two_of_the_files_variants(good, capsys, pair, why):
    variants = sorted({json.loads(x)["variant"] for x in good.read_text().splitlines()})
    rc, out, err = _summary(capsys, "--out", str(good), "--pair", pair)
    assert (rc, out) == (2, "")
    assert err == f"entropy_map: --pair {pair!r}: {why}; the file's variants: {', '.join(variants)}"


def test_plot_into_a_missing_folder(good, tmp_path, capsys):
    png = tmp_path / "figs" / "map.png"
    rc, out, err = _summary(capsys, "--out", str(good), "--plot", str(png))
    assert (rc, out) == (2, "")
    assert err == (f"entropy_map: --plot {png}: the folder {png.parent} does not exist; create it first "
                   f"(mkdir -p {png.parent}) or give a path in an existing folder")
    assert not png.parent.exists()


def test_plot_a_folder_writes_no_folder_png(good, tmp_path, capsys):
    figs = tmp_path / "figs"
    figs.mkdir()
    before = _listing(tmp_path)
    rc, out, err = _summary(capsys, "--out", str(good), "--plot", str(figs))
    assert (rc, out) == (2, "")
    assert err == f"entropy_map: --plot {figs} is a folder; give a file path, e.g. {figs / 'entropy_map.png'}"
    assert _listing(tmp_path) == before                               # no figs.png beside it


def test_plot_without_an_image_extension(good, tmp_path, capsys):
    rc, out, err = _summary(capsys, "--out", str(good), "--plot", str(tmp_path / "map"))
    assert (rc, out) == (2, "")
    assert err == (f"entropy_map: --plot {tmp_path / 'map'} has no file extension; give the image file with its "
                   f"extension, e.g. {tmp_path / 'map.png'} (or .pdf, .svg)")
    assert not (tmp_path / "map.png").exists()
