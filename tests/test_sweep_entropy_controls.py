"""sweeps/choice/entropy_controls.yaml: six arms on the choice profile at lr 5e-4, 3 seeds, seed-major,
every trial a valid experiment, and each arm of the ec_* claims matches exactly one variant."""

from __future__ import annotations

from pathlib import Path

from ulorl.config import apply_overrides, config_from_dict
from ulorl.report.claims import CLAIMS
from ulorl.sweep.launch import describe_trials
from ulorl.sweep.spec import grid_trials, load_sweep, seed_overrides

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "sweeps" / "choice" / "entropy_controls.yaml"


def test_spec_arms_seeds_and_tags():
    spec, base_path, base = load_sweep(SPEC)
    assert base_path == (ROOT / "experiments" / "quickstart_choice.yaml").resolve()
    assert spec.name == "choice_entropy_controls" and spec.stop.steps == 150 and spec.repeats == 3
    assert spec.overrides["train.lr"] == 5.0e-4
    assert spec.tags["ulorl.paper_ref"] == "entropy_controls"
    trials = grid_trials(spec)
    assert [t["repeat"] for t in trials] == [0] * 6 + [1] * 6 + [2] * 6           # seed-major
    assert [t["variant"] for t in trials[:6]] == ["off", "static", "dmmpt", "clip_cov", "kl_cov", "80_20"]
    modes = {}
    for t in trials:
        over = {**spec.overrides, "train.max_steps": spec.stop.steps, **t["overrides"]}
        seeds = seed_overrides(apply_overrides(base, over), t["repeat"])
        cfg = config_from_dict(apply_overrides(base, {**over, **seeds}))
        modes[t["variant"]] = (cfg.algo.mpt.mode, cfg.algo.entropy_control.mode)
        assert cfg.train.lr == 5.0e-4 and cfg.train.max_steps == 150 and cfg.train.updates_per_step == 1
        if t["variant"] == "clip_cov":
            ec = cfg.algo.entropy_control
            assert (ec.clip_cov_ratio, ec.clip_cov_lb, ec.clip_cov_ub) == (0.09, 0.2, 5.0)
        if t["variant"] == "kl_cov":
            assert cfg.algo.entropy_control.kl_cov_ratio == 0.09
        if t["variant"] == "80_20":
            assert cfg.algo.entropy_control.top_entropy_quantile == 0.2
    assert modes == {"off": ("off", "off"), "static": ("static", "off"), "dmmpt": ("dynamic", "off"),
                     "clip_cov": ("off", "clip_cov"), "kl_cov": ("off", "kl_cov"),
                     "80_20": ("off", "high_entropy_minority")}
    assert len(describe_trials(spec, base, base_path)) == 18

    # every arm of the entropy-control claims picks exactly one variant of this sweep
    ec_claims = [c for c in CLAIMS if c.paper_refs == ("entropy_controls",)]
    assert len(ec_claims) == 9
    for claim in ec_claims:
        for arm in (claim.a, claim.b):
            want = dict(arm.params)
            hits = [v for v, (mpt, ec) in modes.items()
                    if want == {"algo.mpt.mode": mpt, "algo.entropy_control.mode": ec}]
            assert len(hits) == 1, (claim.name, arm.label)
