"""Reference trials of a sweep (spec ``references``): the S = 1 run of the speedup, validated before
anything starts, run outside the searcher with the trials' seeds and batching, never re-run as best."""

from __future__ import annotations

from pathlib import Path

import pytest

from ulorl.config import apply_overrides, config_from_dict
from ulorl.sweep import command, plan
from ulorl.sweep.launch import SweepRunner
from ulorl.sweep.spec import SweepError, load_sweep

ROOT = Path(__file__).resolve().parents[1]
BASE = (ROOT / "experiments" / "quickstart.yaml").as_posix()
HEADLINE = ROOT / "sweeps" / "mpt_threshold.yaml"


def _spec(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(f"name: t\nbase: {BASE}\nspace:\n  algo.mpt.tau: {{choice: [0.9, 0.99]}}\n" + body)
    return p


def test_headline_sweep_carries_a_non_segmented_reference_with_the_trials_batching():
    spec, _, base = load_sweep(HEADLINE)
    ref = spec.speed_reference
    assert ref is not None and ref.purpose == "speedup" and ref.seeds == 1
    fixed = command.fixed_overrides(spec)
    trials = config_from_dict(apply_overrides(base, fixed))
    reference = config_from_dict(apply_overrides(base, {**fixed, **ref.overrides}))
    assert reference.rollout.segments == 1 and trials.rollout.segments == 4
    assert reference.algo.mpt.mode == "off"                           # masking off, like the baseline
    assert reference.rollout.batching == trials.rollout.batching      # same batching as the others
    for key in ("data.seed", "rollout.seed", "train.seed"):           # same seeds and data order
        section, name = key.split(".")
        assert getattr(getattr(reference, section), name) == getattr(getattr(trials, section), name)


def test_headline_sweep_plans_twelve_trials_and_names_each(tmp_path):
    runner = SweepRunner(HEADLINE, tracking_uri=f"sqlite:///{tmp_path}/m.db", output_dir=tmp_path)
    assert runner.planned_trials() == 12           # 4 search + baseline x 4 seeds + best re-run x 3 + S = 1
    spec = runner.spec
    entries = plan.extra_entries(spec, {"algo.mpt.tau": 0.9, "algo.mpt.sigma": 0.05})
    roles = [(e["role"], e["repeat"]) for e in entries]
    assert roles == [("baseline", 1), ("rerun", 1), ("baseline", 2), ("rerun", 2), ("baseline", 3), ("rerun", 3),
                     ("baseline", 0), ("reference", 0)]   # seed-major, offset 0 last
    assert entries[-1]["trial_overrides"] == {"rollout.segments": 1, "algo.mpt.mode": "off"}
    assert plan.extra_entries(spec, None)[-1]["role"] == "reference"   # no best trial: no re-run, reference still runs
    searched = {"algo.mpt.tau": 0.9, "algo.mpt.sigma": 0.0931234}
    assert plan.describe_trial(spec, searched) == ("search", "tau=0.9 sigma=0.0931")
    assert plan.describe_trial(spec, {"__extra__": entries[0]}) == ("baseline", "masking_off seed+1")
    assert plan.describe_trial(spec, {"__extra__": entries[1]}) == ("rerun", "tau=0.9 sigma=0.05 seed+1")
    assert plan.describe_trial(spec, {"__extra__": entries[-1]}) == ("reference", "non_segmented")


@pytest.mark.parametrize("body, message", [
    ("references:\n  - {name: s1, overrides: {rollout.segments: 2}, purpose: speedup}\n",
     r"references\[0\] \(s1, purpose: speedup\): needs rollout.segments: 1 \(got 2\)"),
    ("references:\n  - {name: s1, overrides: {rollout.segments: 1, rollout.batching: static}}\n",
     r"rollout.batching 'static' differs from the trials' 'compact'"),
    ("references:\n  - {name: s1, overrides: {rollout.segments: 1, data.seed: 3}}\n",
     r"overrides data.seed; the reference keeps the trials' seeds"),
    ("overrides: {rollout.segments: 1}\nreferences:\n  - {name: s1, overrides: {rollout.segments: 1}}\n",
     r"the trials run at rollout.segments 1 too"),
    ("references:\n  - {name: s1, overrides: {rollout.segmentz: 1}}\n",
     r"references\[0\].overrides.rollout.segmentz: unknown experiment key"),
    ("baseline: {name: s1}\nreferences:\n  - {name: s1, overrides: {rollout.segments: 1}}\n",
     r"distinct names"),
    ("references:\n  - {name: a, overrides: {rollout.segments: 1}}\n  - {name: b, overrides: {rollout.segments: 1}}\n",
     r"at most one reference with purpose: speedup"),
])
def test_bad_references_fail_before_anything_runs(tmp_path, body, message):
    with pytest.raises(SweepError, match=message):
        load_sweep(_spec(tmp_path, body))


def test_dry_run_lists_the_reference(capsys):
    from ulorl.cli import sweep as cli

    assert cli.main([str(HEADLINE), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert ('+ reference non_segmented {"rollout.segments": 1, "algo.mpt.mode": "off"} (purpose speedup) '
            "on 1 seed offset(s)") in out
