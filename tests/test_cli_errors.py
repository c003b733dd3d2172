"""Errors a user meets first: a mistyped or invalid command-line override (named as the override,
with a "did you mean"), a sqlite tracking URI whose folder does not exist."""

from __future__ import annotations

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
