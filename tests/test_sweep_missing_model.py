"""A sweep whose trials name a local model folder that does not exist is refused by ``ulorl-sweep`` before
any trial starts, dry run and start alike (it used to run each such trial, retry it twice "from its
checkpoint", none existing, and end with Ray's process label as the cause): the sweep file, the variant,
the key, the path and the fix; exit 2; no Ray, no store, no sweep folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from ulorl.cli import sweep as sweep_cli
from ulorl.sweep import launch
from ulorl.sweep.spec import load_sweep

ROOT = Path(__file__).resolve().parents[1]
BASE = (ROOT / "experiments" / "quickstart.yaml").as_posix()
BODY = ("search: {algorithm: grid}\nstop: {steps: 2}\nvariants:\n  - {name: shipped}\n"
        "  - {name: narrow, overrides: {model.name_or_path: runs/shapes/narrow}}\n")


class _NoRun:
    def __init__(self, *args, **kwargs):
        raise AssertionError("the sweep started")


@pytest.fixture
def spec_file(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)                       # the driver's folder: relative paths are read from here
    monkeypatch.setattr(launch, "SweepRunner", _NoRun)
    (tmp_path / "runs").mkdir()
    p = tmp_path / "s.yaml"
    p.write_text(f"name: t\nbase: {BASE}\n" + BODY)
    return p


def _expected(p: Path, tmp_path: Path) -> str:
    return (f"ulorl-sweep: {p}: variants[1] (narrow): model.name_or_path: model path does not exist: "
            f"runs/shapes/narrow (from {tmp_path}); give the folder that holds the model's config.json and weights "
            "(build or copy it there first), embedded, or a hub id; every trial with it would fail (a folder a "
            "sweep file names must be built first: its comment has the command)")


@pytest.mark.parametrize("flags", [["--dry-run"], ["--tracking-uri", "sqlite:///mlflow.db", "--output-dir", "out"]],
                         ids=["dry-run", "start"])
def test_a_missing_relative_model_folder_is_refused_before_any_trial(spec_file, tmp_path, capsys, flags):
    assert sweep_cli.main([str(spec_file), *flags]) == 2
    assert capsys.readouterr().err.strip() == _expected(spec_file, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "s.yaml"]      # no store, no sweep folder


def test_an_existing_folder_a_hub_id_and_a_cluster_path_pass(spec_file, tmp_path):
    from ulorl.sweep.plan import missing_model_problem

    spec, _, base = load_sweep(spec_file)
    (tmp_path / "runs" / "shapes" / "narrow").mkdir(parents=True)
    assert missing_model_problem(spec, base, str(spec_file)) is None
    spec_file.write_text(f"name: t\nbase: {BASE}\n" + BODY.replace("runs/shapes/narrow", "Qwen/Qwen3-4B"))
    spec, _, base = load_sweep(spec_file)
    assert missing_model_problem(spec, base, str(spec_file)) is None
    spec_file.write_text(f"name: t\nbase: {BASE}\n" + BODY.replace("runs/shapes/narrow", "/cluster/models/narrow"))
    spec, _, base = load_sweep(spec_file)
    assert "model path does not exist: /cluster/models/narrow;" in missing_model_problem(spec, base, "s")
    assert missing_model_problem(spec, base, "s", absolute_too=False) is None     # --address: the nodes' paths
