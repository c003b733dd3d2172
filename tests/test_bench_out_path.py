"""A benchmark's ``--out`` that cannot be written as a file is refused before the benchmark runs (it
used to run for minutes, then die with IsADirectoryError and lose the report): a folder, with the file
path to give instead; a missing parent folder. Exit 2, nothing written."""

from __future__ import annotations

import pytest

from ulorl.bench import peer
from ulorl.bench import rollout as rollout_bench
from ulorl.cli import bench as bench_cli
from ulorl.out_path import out_file_problem


def _never(*args, **kwargs):
    raise AssertionError("the benchmark ran before its --out was checked")


@pytest.fixture
def no_benchmark(monkeypatch):
    monkeypatch.setattr(peer, "run_peer_bench", _never)
    monkeypatch.setattr(rollout_bench, "run_rollout_bench", _never)


def test_peer_out_a_folder_is_refused_before_the_benchmark(tmp_path, capsys, no_benchmark):
    folder = tmp_path / "reports"
    folder.mkdir()
    assert bench_cli.main(["peer", "--no-trl", "--out", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"ulorl-bench peer: error: --out {folder} is a folder; give a file path, e.g. "
                   f"{folder / 'peer.json'}")
    assert list(folder.iterdir()) == []


def test_peer_out_in_a_missing_folder_is_refused_before_the_benchmark(tmp_path, capsys, no_benchmark):
    out = tmp_path / "missing" / "peer.json"
    assert bench_cli.main(["peer", "--no-trl", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out}: the folder {out.parent} does not exist; create it first (mkdir -p {out.parent})" in err
    assert not out.parent.exists()


def test_rollout_out_a_folder_is_refused_before_the_benchmark(tmp_path, capsys, no_benchmark):
    assert bench_cli.main(["rollout", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ulorl-bench rollout: error: --out {tmp_path} is a folder; give a file path, e.g. {tmp_path / 'rollout.json'}")
    assert list(tmp_path.iterdir()) == []


def test_an_out_file_in_an_existing_folder_passes(tmp_path):
    assert out_file_problem(tmp_path / "peer.json", "--out", "peer.json") is None
    (tmp_path / "peer.json").write_text("{}")                    # an existing file is overwritten, as before
    assert out_file_problem(tmp_path / "peer.json", "--out", "peer.json") is None
    (tmp_path / "file").write_text("x")
    inside_a_file = tmp_path / "file" / "peer.json"
    assert out_file_problem(inside_a_file, "--out", "peer.json") == (
        f"--out {inside_a_file}: {tmp_path / 'file'} is a file, not a folder; give a path in a folder")
