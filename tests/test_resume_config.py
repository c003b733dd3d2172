"""Resume with a changed config: refused naming each changed key, unless safe or --allow-config-change."""

from __future__ import annotations

from pathlib import Path

import pytest

from ulorl.cli.train import main as train_main
from ulorl.config import ExperimentConfig, load_experiment
from ulorl.train.resume import (
    SAFE_RESUME_KEYS,
    ResumeConfigError,
    check_resume_config,
    config_changes,
    is_safe_resume_key,
)
from ulorl.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "quickstart.yaml"
SMALL = ["rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_response_len=32", "rollout.segments=2",
         "train.threads=1", "eval.every=0", "train.max_steps=1", "train.checkpoint_every=1"]


def _saved(*overrides: str) -> dict:
    return load_experiment(QUICK, list(overrides)).model_dump(mode="json")


def test_safe_keys_listed_once_and_matched():
    assert "train.max_steps" in SAFE_RESUME_KEYS and "eval.*" in SAFE_RESUME_KEYS
    assert is_safe_resume_key("eval.k") and is_safe_resume_key("tracking.uri") and is_safe_resume_key("train.threads")
    assert not is_safe_resume_key("train.lr") and not is_safe_resume_key("evaluation.k")


def test_changes_are_named_and_unsafe_ones_refused():
    saved = _saved()
    cfg = load_experiment(QUICK, ["algo.is_mode=sais", "algo.mpt.tau=0.9", "train.max_steps=99", "eval.k=3"])
    changes = {k: (a, b) for k, a, b in config_changes(saved, cfg)}
    assert changes["algo.is_mode"] == ("pois", "sais") and changes["algo.mpt.tau"] == (0.99, 0.9)
    assert set(changes) == {"algo.is_mode", "algo.mpt.tau", "train.max_steps", "eval.k"}
    with pytest.raises(ResumeConfigError) as e:
        check_resume_config(saved, cfg, allow=False)
    msg = str(e.value)
    assert "algo.is_mode: 'pois' in the checkpoint, 'sais' now" in msg and "algo.mpt.tau" in msg
    assert "train.max_steps:" not in msg and "eval.k:" not in msg and "--allow-config-change" in msg
    assert len(check_resume_config(saved, cfg, allow=True)) == 4


def test_safe_changes_pass_and_removed_or_new_keys_are_handled():
    saved = _saved()
    cfg = load_experiment(QUICK, ["train.max_steps=99", "train.threads=3", "tracking.experiment=x", "eval.every=0"])
    assert len(check_resume_config(saved, cfg, allow=False)) == 4
    saved["train"]["a_setting_removed_since"] = 1   # an older checkpoint: ignored
    del saved["algo"]["eps_high"]                  # a field added since: its default there
    assert config_changes(saved, load_experiment(QUICK)) == []
    assert config_changes(saved, load_experiment(QUICK, ["algo.eps_high=0.3"])) == [
        ("algo.eps_high", ExperimentConfig().algo.eps_high, 0.3)]


def test_trainer_and_cli_refuse_an_unsafe_resume(tmp_path, capsys):
    uri = f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"
    run_dir = tmp_path / "run"
    Trainer(load_experiment(QUICK, SMALL + [uri]), run_dir=run_dir, progress=False).run()
    changed = load_experiment(QUICK, SMALL + [uri, "rollout.temperature=0.5", "train.max_steps=2"])
    with pytest.raises(ResumeConfigError, match=r"rollout\.temperature: 0\.85 in the checkpoint, 0\.5 now"):
        Trainer(changed, resume=str(run_dir), progress=False).setup()
    code = train_main([str(QUICK), *SMALL, uri, "rollout.temperature=0.5", "--resume", str(run_dir), "--no-progress"])
    assert code == 2 and "rollout.temperature" in capsys.readouterr().err
    res = Trainer(changed, resume=str(run_dir), progress=False, allow_config_change=True).run()
    assert res.steps == 2
