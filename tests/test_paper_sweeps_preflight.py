"""The paper sweeps (sweeps/paper/*.yaml): every trial passes the preflight on its card, concurrent trials
fit the nodes the base profile declares, no axis sweeps a setting the sweep's engine ignores, and the
sweep's dry-run prints the preflight per trial."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from ulorl.config import apply_overrides, config_from_dict
from ulorl.sweep.spec import grid_trials, load_sweep

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = sorted((ROOT / "sweeps" / "paper").glob("*.yaml"))
HF_ONLY_KEYS = ("rollout.batching",)   # RolloutConfig: read by the hf engine only


def _trial_cfgs(path: Path):
    spec, base_path, base = load_sweep(path)
    overrides = [t["overrides"] for t in grid_trials(spec)] if spec.search.algorithm == "grid" else [{}]
    return spec, [config_from_dict(apply_overrides(base, {**spec.overrides, **o}), str(base_path)) for o in overrides]


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_paper_sweep_trials_pass_the_preflight_and_fit_the_nodes(path):
    from ulorl.cli.preflight_text import preflight_dict

    spec, cfgs = _trial_cfgs(path)
    for cfg in cfgs:
        out = preflight_dict(cfg)
        assert out["passes"], [c for c in out["checks"] if not c["ok"]]
        res = cfg.resources
        gpus = res.trainer_workers * res.gpus_per_trainer_worker + res.rollout_engines * res.gpus_per_engine
        nodes_per_trial = math.ceil(gpus / res.gpus_per_node)
        assert spec.max_concurrent * nodes_per_trial <= res.nodes, (
            f"max_concurrent {spec.max_concurrent} x {nodes_per_trial} nodes per trial > resources.nodes {res.nodes}")
        if cfg.rollout.engine == "vllm":
            swept = set(spec.space) | {k for t in spec.variants for k in t.overrides}
            assert not swept & set(HF_ONLY_KEYS), f"{path.name} sweeps {swept & set(HF_ONLY_KEYS)} with vLLM"


def test_sweep_dry_run_prints_the_preflight_per_trial():
    out = subprocess.run([sys.executable, "-m", "ulorl.cli.sweep", str(ROOT / "sweeps/paper/segments.yaml"),
                          "--dry-run"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    trials = [line for line in out.stdout.splitlines() if line.startswith('  {"')]
    lines = [line for line in out.stdout.splitlines() if "preflight on 141 GiB: passes" in line]
    assert len(trials) == 3 and len(lines) == 3
