"""experiments/quickstart_regime.yaml is the entropy regime's static-masking arm, exactly: the config its
Fig. 4 / 5 rows were measured with (sweeps/entropy/regime_eval.yaml), so the shipped experiment cannot drift
from the runs behind its numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from ulorl.config import apply_overrides, config_from_dict, flatten_config, load_experiment
from ulorl.sweep.command import fixed_overrides
from ulorl.sweep.spec import grid_trials, load_sweep

ROOT = Path(__file__).resolve().parents[1]


def _arm(variant: str):
    spec, _, base = load_sweep(ROOT / "sweeps" / "entropy" / "regime_eval.yaml")
    trial = next(t for t in grid_trials(spec) if t["variant"] == variant and t["repeat"] == 0)
    return config_from_dict(apply_overrides(base, {**fixed_overrides(spec), **trial["overrides"]}))


@pytest.mark.parametrize("variant", ["static", "off", "dynamic"])
def test_the_shipped_regime_is_the_swept_arm(variant: str) -> None:
    mine = load_experiment(ROOT / "experiments" / "quickstart_regime.yaml", [f"algo.mpt.mode={variant}"])
    swept = flatten_config(_arm(variant))
    shipped = flatten_config(mine)
    differ = {k: (swept.get(k), shipped.get(k)) for k in set(swept) | set(shipped)
              if swept.get(k) != shipped.get(k) and k != "name"}
    assert not differ, f"experiments/quickstart_regime.yaml differs from the swept {variant} arm: {differ}"
    assert mine.algo.mpt.tau == 0.8 and mine.rollout.temperature == 1.2 and mine.eval.final.k == 16
