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
    spec, base_path, base = load_sweep(path)
    assert base_path.is_file()
    trials = describe_trials(spec, base, base_path)
    assert trials and all("resources" in t for t in trials)


def test_dry_run_shows_the_placement_bundles_of_multi_process_trials(tmp_path):
    body = ("overrides: {resources.trainer_workers: 2, resources.gpus_per_trainer_worker: 1, "
            "resources.rollout_engines: 1, resources.gpus_per_engine: 1}\n"
            "num_samples: 1\nsearch: {algorithm: grid}\nvariants:\n  - {name: one, overrides: {}}\n")
    spec, base_path, base = load_sweep(_spec(tmp_path, body))
    (trial,) = describe_trials(spec, base, base_path)
    pg = trial["resources"]["placement_group"]
    assert pg["strategy"] == "STRICT_PACK" and pg["nodes"] == 1
    assert [b["role"] for b in pg["bundles"]] == ["trial", "trainer.0", "trainer.1", "engine.0"]
    assert [b.get("GPU", 0) for b in pg["bundles"]] == [0, 1, 1, 1]


def test_dry_run_one_process_trial_keeps_cpu_gpu(tmp_path):
    body = "resources: {cpu: 2, gpu: 0}\nspace:\n  algo.mpt.tau: {choice: [0.9]}\n"
    spec, base_path, base = load_sweep(_spec(tmp_path, body))
    assert all(t["resources"] == {"cpu": 2, "gpu": 0} for t in describe_trials(spec, base, base_path))


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
