"""The documented schema: every field has a description; ``ulorl-train --explain``; registry-named choices;
the Fig. 2 sweeps use the paper's one update per step."""

from __future__ import annotations

from pathlib import Path

import pytest

from ulorl.algo import IS_MODES, LOSS_AGG, MASK_MODES
from ulorl.cli.train import main as train_main
from ulorl.config import ConfigError, apply_overrides, config_from_dict, load_experiment
from ulorl.config_doc import explain, field_docs, undocumented_fields
from ulorl.sweep.spec import load_sweep

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "quickstart.yaml"


def test_every_field_and_section_is_documented():
    assert undocumented_fields() == []
    keys = {d.key for d in field_docs()}
    assert {"algo.mpt.tau", "train.lr", "eval.k", "algo.adv_std", "algo.loss_agg"} <= keys


def test_explain_key_section_and_unknown(capsys):
    text = explain("algo.mpt.tau")
    assert text.startswith("algo.mpt.tau: float = 0.99  [> 0.0, <= 1.0]") and "threshold" in text
    section = explain("algo.mpt")
    assert all(f"algo.mpt.{k}:" in section for k in ("mode", "tau", "sigma", "entropy_scope"))
    assert "'off' | 'static' | 'dynamic'" in section
    with pytest.raises(KeyError, match="algo.mpt.tua"):
        explain("algo.mpt.tua")
    assert train_main(["--explain", "train.updates_per_step"]) == 0
    assert "pre-update model" in capsys.readouterr().out
    assert train_main(["--explain", "nope"]) == 2
    assert train_main(["--explain"]) == 0
    assert capsys.readouterr().out.count("\n    ") == len(field_docs())


def test_choices_come_from_the_registries():
    docs = {d.key: d.type for d in field_docs()}
    assert docs["algo.is_mode"] == " | ".join(repr(k) for k in IS_MODES)
    assert docs["algo.mpt.mode"] == " | ".join(repr(k) for k in MASK_MODES)
    assert docs["algo.loss_agg"] == " | ".join(repr(k) for k in LOSS_AGG)
    with pytest.raises(ConfigError, match=r"algo\.loss_agg: .*must be one of 'token_mean', 'seq_mean'"):
        load_experiment(QUICK, ["algo.loss_agg=sum"])
    assert load_experiment(QUICK, ["algo.loss_agg=seq_mean"]).algo.loss_agg == "seq_mean"


def test_removed_settings_are_unknown_keys():
    for key in ("eval.benchmark=aime2025", "train.deepspeed.num_processes=4"):
        with pytest.raises(ConfigError, match="unknown key"):
            load_experiment(QUICK, [key])


@pytest.mark.parametrize("path", [ROOT / "sweeps" / "is_mode.yaml", ROOT / "sweeps" / "paper" / "is_mode.yaml"],
                         ids=["tiny", "paper"])
def test_fig2_sweeps_use_one_update_per_step(path):
    spec, _base_path, base = load_sweep(path)
    for variant in spec.variants:
        cfg = config_from_dict(apply_overrides(apply_overrides(base, spec.overrides), variant.overrides))
        assert cfg.train.updates_per_step == 1, variant.name
    assert "exactly 1" in path.read_text()  # the YAML says what the sweep then shows
