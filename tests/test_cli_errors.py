"""Errors a user meets first: a mistyped or invalid command-line override (named as the override,
with a "did you mean"), a sqlite tracking URI whose folder does not exist."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ulorl.cli import train as train_cli
from ulorl.config import ConfigError, load_experiment
from ulorl.tracking import require_store_folder

QUICK = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml"


def test_mistyped_override_key_suggests_the_key():
    with pytest.raises(ConfigError) as err:
        load_experiment(QUICK, ["algo.mpt.taux=0.9"])
    text = str(err.value)
    assert "command-line override(s) algo.mpt.taux=0.9" in text
    assert "algo.mpt.taux: unknown key (did you mean algo.mpt.tau?)" in text


def test_model_level_error_from_an_override_blames_the_override_without_root_prefix():
    with pytest.raises(ConfigError) as err:
        load_experiment(QUICK, ["algo.is_mode=tois"])
    text = str(err.value)
    assert text.startswith("invalid experiment config in the command-line override(s) algo.is_mode=tois")
    assert "<root>" not in text and "Value error," not in text
    assert "requires rollout.segments=1" in text


def test_an_invalid_file_is_still_blamed_on_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(QUICK.read_text().replace("tau: 0.99", "tau: 1.5"))
    with pytest.raises(ConfigError) as err:
        load_experiment(bad, ["train.max_steps=2"])
    assert f"in {bad}" in str(err.value) and "algo.mpt.tau" in str(err.value)


def test_missing_sqlite_folder_is_refused(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'missing' / 'x.db'}"
    with pytest.raises(FileNotFoundError, match="missing does not exist"):
        require_store_folder(uri)
    require_store_folder(f"sqlite:///{tmp_path / 'x.db'}")        # an existing folder is fine
    rc = train_cli.main([str(QUICK), "--tracking-uri", uri, "train.max_steps=1", "--no-progress"])
    assert rc == 2 and "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()


def test_missing_extra_is_reported_with_the_install_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)    # vLLM not installed, whatever this venv holds
    rc = train_cli.main([str(QUICK), "rollout.engine=vllm", f"train.output_dir={tmp_path / 'runs'}",
                         "--tracking-uri", f"sqlite:///{tmp_path / 'x.db'}", "--no-progress"])
    assert rc == 2
    assert "pip install 'ulorl[gpu]'" in capsys.readouterr().err


def test_missing_extra_is_caught_by_its_type_not_its_name(tmp_path, monkeypatch, capsys):
    from ulorl.rollout.engines import MissingExtraError
    from ulorl.train import trainer

    class JudgeExtraMissing(MissingExtraError):   # a subclass: another class name, the same meaning
        pass

    def fail_with(exc: Exception):
        def run(self):
            raise exc
        return run

    args = [str(QUICK), f"train.output_dir={tmp_path / 'runs'}", "--tracking-uri", f"sqlite:///{tmp_path / 'x.db'}",
            "--no-progress"]
    monkeypatch.setattr(trainer.Trainer, "run", fail_with(JudgeExtraMissing("pip install 'ulorl[judge]'")))
    assert train_cli.main(args) == 2
    assert "ulorl-train: pip install 'ulorl[judge]'" in capsys.readouterr().err
    monkeypatch.setattr(trainer.Trainer, "run", fail_with(RuntimeError("MissingExtraError")))
    with pytest.raises(RuntimeError, match="MissingExtraError"):   # any other RuntimeError propagates
        train_cli.main(args)
