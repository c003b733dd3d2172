"""The claim sweeps of the embedded profile `choice` (sweeps/choice/*.yaml): each expands, with the
existing spec code, to the paper's arms on >= 3 seeds that vary prompt order, rollout and train
seeds together while the task (held-out problems) stays fixed."""

from __future__ import annotations

from pathlib import Path

import pytest

from ulorl.config import apply_overrides
from ulorl.sweep.launch import describe_trials
from ulorl.sweep.spec import SEED_KEYS, grid_trials, load_sweep, seed_overrides

ROOT = Path(__file__).resolve().parents[1]
CHOICE = ROOT / "sweeps" / "choice"
NAMES = ("mpt_mode", "mpt_mode_high_lr", "output_length", "is_mode", "mpt_threshold")


def _trial_config(base: dict, fixed: dict, trial: dict) -> dict:
    over = {**fixed, **trial["overrides"]}
    return apply_overrides(base, {**over, **seed_overrides(apply_overrides(base, over), trial["repeat"])})


def _arms(path: Path) -> dict[str, list[dict]]:
    """variant -> the full experiment dict of each of its trials (seeds applied as trial_fn does)."""
    spec, _, base = load_sweep(path)
    fixed = {**spec.overrides, **({"train.max_steps": spec.stop.steps} if spec.stop.steps else {})}
    out: dict[str, list[dict]] = {}
    for t in grid_trials(spec):
        out.setdefault(t["variant"], []).append(_trial_config(base, fixed, t))
    return out


def _seeds(cfg: dict) -> tuple[int, ...]:
    return tuple(int(cfg[k.split(".")[0]].get(k.split(".")[1], 0)) for k in SEED_KEYS)


def test_seed_overrides_shift_order_rollout_and_train_not_the_task() -> None:
    exp = {"data": {"seed": 3, "task": {"seed": 9}}, "train": {"seed": 5}}
    assert seed_overrides(exp, 2) == {"data.seed": 5, "rollout.seed": 2, "train.seed": 7}
    assert seed_overrides(exp, 0) == {"data.seed": 3, "rollout.seed": 0, "train.seed": 5}


@pytest.mark.parametrize("name", NAMES)
def test_every_choice_sweep_is_on_the_choice_profile_and_dry_runs(name: str) -> None:
    spec, base_path, base = load_sweep(CHOICE / f"{name}.yaml")
    assert base_path == (ROOT / "experiments" / "quickstart_choice.yaml").resolve()
    assert spec.name == f"choice_{name}"        # its own resume state, apart from sweeps/<name>.yaml
    assert spec.stop.steps is not None and spec.stop.steps >= 150
    assert describe_trials(spec, base, base_path)


@pytest.mark.parametrize("name", ("mpt_mode", "mpt_mode_high_lr", "output_length", "is_mode"))
def test_grid_arms_run_three_seeds_on_the_same_task(name: str) -> None:
    arms = _arms(CHOICE / f"{name}.yaml")
    for variant, cfgs in arms.items():
        seeds = [_seeds(c) for c in cfgs]
        assert len(set(seeds)) == len(seeds) >= 3, variant
        # every seed key moves between repeats
        assert all(len({s[i] for s in seeds}) == len(seeds) for i in range(len(SEED_KEYS))), (variant, seeds)
    # arms of one repeat share seeds (paired) and every trial keeps the task generator seed
    per_arm = [sorted(_seeds(c) for c in cfgs) for cfgs in arms.values()]
    assert all(p == per_arm[0] for p in per_arm)
    tasks = {c["data"].get("task", {}).get("seed", 0) for cfgs in arms.values() for c in cfgs}
    assert len(tasks) == 1


@pytest.mark.parametrize("name", ("mpt_mode", "mpt_mode_high_lr"))
def test_fig45_arms_off_static_dynamic_with_their_tags(name: str) -> None:
    spec, _, _ = load_sweep(CHOICE / f"{name}.yaml")
    by_name = {v.name: v for v in spec.variants}
    assert {n: v.overrides["algo.mpt.mode"] for n, v in by_name.items()} == {
        "off": "off", "static": "static", "dmmpt": "dynamic"}
    assert by_name["off"].tags["ulorl.paper_ref"] == by_name["static"].tags["ulorl.paper_ref"] == "fig4"
    assert by_name["dmmpt"].tags["ulorl.paper_ref"] == "fig5"
    assert spec.repeats >= 3


def test_table3_arms_tight_and_loose_with_equal_segment_length() -> None:
    arms = _arms(CHOICE / "output_length.yaml")
    shapes = {(c["rollout"]["max_response_len"], c["rollout"]["segments"]) for cfgs in arms.values() for c in cfgs}
    assert shapes == {(96, 2), (192, 4)}
    assert {length // s for length, s in shapes} == {48}
    spec, _, _ = load_sweep(CHOICE / "output_length.yaml")
    assert spec.tags["ulorl.paper_ref"] == "table3"


def test_fig2_arms_tois_s1_sais_pois_one_update_per_step() -> None:
    arms = _arms(CHOICE / "is_mode.yaml")
    modes = {(c["algo"]["is_mode"], c["rollout"]["segments"]) for cfgs in arms.values() for c in cfgs}
    assert modes == {("tois", 1), ("sais", 4), ("pois", 4)}
    assert all(c["train"]["updates_per_step"] == 1 for cfgs in arms.values() for c in cfgs)
    spec, _, _ = load_sweep(CHOICE / "is_mode.yaml")
    assert spec.tags["ulorl.paper_ref"] == "fig2"


def test_headline_tau_sigma_with_a_masking_off_baseline_on_three_seeds() -> None:
    spec, _, _ = load_sweep(CHOICE / "mpt_threshold.yaml")
    assert set(spec.space) == {"algo.mpt.tau", "algo.mpt.sigma"}
    assert spec.overrides["algo.mpt.mode"] == "dynamic"
    assert spec.baseline is not None and spec.baseline.overrides == {"algo.mpt.mode": "off"}
    assert spec.baseline.seeds >= 3          # baseline on 3 offsets, the best trial re-run on 2 more
    assert spec.tags["ulorl.paper_ref"] == "fig5"


def test_cli_dry_run_prints_the_seeds_of_each_repeat(capsys: pytest.CaptureFixture[str]) -> None:
    from ulorl.cli.sweep import main

    assert main([str(CHOICE / "is_mode.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "24 trial(s)" in out
    assert '"seeds": {"data.seed": 2, "rollout.seed": 2, "train.seed": 2}' in out


def test_high_lr_variant_differs_from_mpt_mode_only_in_the_learning_rate() -> None:
    low, high = _arms(CHOICE / "mpt_mode.yaml"), _arms(CHOICE / "mpt_mode_high_lr.yaml")
    assert set(low) == set(high)
    for variant in low:
        for a, b in zip(low[variant], high[variant]):
            assert b["train"]["lr"] == pytest.approx(5 * a["train"]["lr"])
            assert {**b, "train": {**b["train"], "lr": a["train"]["lr"]}} == a
