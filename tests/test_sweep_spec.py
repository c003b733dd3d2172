"""Sweep specs fail fast, with the key path, before any trial starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from ulorl.sweep.launch import describe_trials
from ulorl.sweep.spec import SweepError, grid_trials, load_sweep

ROOT = Path(__file__).resolve().parents[1]
BASE = (ROOT / "experiments" / "quickstart.yaml").as_posix()


def _spec(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(f"name: t\nbase: {BASE}\n" + body)
    return p


@pytest.mark.parametrize("path", sorted((ROOT / "sweeps").rglob("*.yaml")), ids=lambda p: p.name)
def test_shipped_sweeps_validate(path):
    spec, base, _ = load_sweep(path)
    assert base.is_file()
    assert describe_trials(spec)


def test_unknown_space_key_names_path(tmp_path):
    p = _spec(tmp_path, "space:\n  algo.mpt.taux: {choice: [0.9]}\n")
    with pytest.raises(SweepError, match=r"space\.algo\.mpt\.taux: unknown experiment key .*did you mean algo\.mpt\.tau"):
        load_sweep(p)


def test_value_rejected_by_experiment_schema(tmp_path):
    p = _spec(tmp_path, "space:\n  algo.mpt.tau: {uniform: [0.5, 1.5]}\nsearch: {algorithm: optuna}\n")
    with pytest.raises(SweepError, match=r"(?s)space\.algo\.mpt\.tau=1\.5.*algo\.mpt\.tau"):
        load_sweep(p)


def test_wrong_type_in_space(tmp_path):
    p = _spec(tmp_path, "space:\n  rollout.segments: {choice: [two]}\n")
    with pytest.raises(SweepError, match=r"rollout\.segments"):
        load_sweep(p)


def test_asha_with_multi_objective(tmp_path):
    p = _spec(tmp_path, "metric: [eval/heldout/avg_at_k, time/step_s]\nmode: [max, min]\nscheduler: {type: asha}\n")
    with pytest.raises(SweepError, match="single objective"):
        load_sweep(p)


def test_missing_base(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("name: t\nbase: nowhere.yaml\n")
    with pytest.raises(SweepError, match="base: experiment file not found"):
        load_sweep(p)


def test_unknown_top_level_key(tmp_path):
    p = _spec(tmp_path, "num_sample: 3\n")
    with pytest.raises(SweepError, match="num_sample: unknown key"):
        load_sweep(p)


def test_tois_variant_with_segments_rejected(tmp_path):
    p = _spec(tmp_path, "search: {algorithm: grid}\nvariants:\n  - {name: bad, overrides: {algo.is_mode: tois}}\n")
    with pytest.raises(SweepError, match=r"(?s)variants\[0\] \(bad\).*tois"):
        load_sweep(p)


def test_grid_trials_product_and_repeats(tmp_path):
    p = _spec(tmp_path, "search: {algorithm: grid}\nrepeats: 2\nspace:\n  rollout.segments: {grid: [1, 2]}\n"
                        "  rollout.batching: {grid: [static, compact]}\n")
    spec, _, _ = load_sweep(p)
    trials = grid_trials(spec)
    assert len(trials) == 2 * 2 * 2
    assert {(t["overrides"]["rollout.segments"], t["overrides"]["rollout.batching"]) for t in trials} == {
        (1, "static"), (1, "compact"), (2, "static"), (2, "compact")}


def test_cli_dry_run_and_bad_spec_exit_code(tmp_path, capsys):
    from ulorl.cli.sweep import main

    assert main([str(ROOT / "sweeps" / "segments.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "8 trial(s)" in out
    bad = _spec(tmp_path, "space:\n  nope.key: {choice: [1]}\n")
    assert main([str(bad)]) == 2
    assert "space.nope.key" in capsys.readouterr().err


def test_segments_sweep_reaches_steady_state_for_every_s():
    """Table 1 uses steps after the first S: every S of sweeps/segments.yaml keeps >= 8 steady steps."""
    spec, _, _ = load_sweep(ROOT / "sweeps" / "segments.yaml")
    assert all(spec.stop.steps - s >= 8 for s in spec.space["rollout.segments"].grid)
