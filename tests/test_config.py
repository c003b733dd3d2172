"""Experiment config: validation errors carry file and key path; overrides; flattening."""

from __future__ import annotations

from pathlib import Path

import pytest

from ulorl.config import ConfigError, flatten_config, load_experiment, parse_override

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "quickstart.yaml"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "exp.yaml"
    p.write_text(text)
    return p


def test_quickstart_loads_with_overrides():
    cfg = load_experiment(QUICK, ["algo.mpt.tau=0.95", "rollout.segments=8"])
    assert cfg.algo.mpt.tau == 0.95
    assert cfg.rollout.segments == 8
    assert cfg.rollout.segment_len == cfg.rollout.max_response_len // 8
    assert cfg.name == "quickstart"


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").rglob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_experiment_validates(path):
    load_experiment(path)


def test_unknown_key_names_file_and_path(tmp_path):
    p = _write(tmp_path, "algo:\n  mpt:\n    tua: 0.9\n")
    with pytest.raises(ConfigError) as e:
        load_experiment(p)
    assert str(p) in str(e.value) and "algo.mpt.tua: unknown key" in str(e.value)


def test_unknown_override_key():
    with pytest.raises(ConfigError, match=r"rollout\.segmentz: unknown key"):
        load_experiment(QUICK, ["rollout.segmentz=2"])


@pytest.mark.parametrize(
    "override, path",
    [
        ("algo.mpt.tau=1.5", "algo.mpt.tau"),
        ("algo.mpt.tau=0", "algo.mpt.tau"),
        ("rollout.segments=0", "rollout.segments"),
        ("rollout.segments=four", "rollout.segments"),
        ("train.lr=-1", "train.lr"),
        ("algo.is_mode=bogus", "algo.is_mode"),
    ],
)
def test_out_of_range_and_wrong_type(override, path):
    with pytest.raises(ConfigError) as e:
        load_experiment(QUICK, [override])
    assert f"{path}:" in str(e.value) and str(QUICK) in str(e.value)


def test_max_len_must_divide_by_segments():
    with pytest.raises(ConfigError, match=r"max_response_len \(512\) must be divisible by rollout.segments \(3\)"):
        load_experiment(QUICK, ["rollout.segments=3"])


def test_tois_requires_one_segment():
    with pytest.raises(ConfigError, match="tois"):
        load_experiment(QUICK, ["algo.is_mode=tois", "rollout.segments=4"])
    cfg = load_experiment(QUICK, ["algo.is_mode=tois", "rollout.segments=1"])
    assert cfg.algo.is_mode == "tois"


def test_tois_rejects_min_ready_groups_above_prompts_per_step():
    over = ["algo.is_mode=tois", "rollout.segments=1", "rollout.prompts_per_step=2"]
    with pytest.raises(ConfigError) as e:
        load_experiment(QUICK, over + ["rollout.min_ready_groups=3"])
    assert "rollout.min_ready_groups" in str(e.value) and "rollout.prompts_per_step" in str(e.value)
    assert load_experiment(QUICK, over + ["rollout.min_ready_groups=2"]).rollout.min_ready_groups == 2
    # POIS / SAIS may wait across versions by design
    assert load_experiment(QUICK, ["rollout.prompts_per_step=2", "rollout.min_ready_groups=3"])


def test_adv_std_key():
    assert load_experiment(QUICK).algo.adv_std == "population"
    assert load_experiment(QUICK, ["algo.adv_std=unbiased"]).algo.adv_std == "unbiased"
    with pytest.raises(ConfigError, match="algo.adv_std"):
        load_experiment(QUICK, ["algo.adv_std=biased"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_experiment(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_experiment(_write(tmp_path, "a: [1, 2\n"))


def test_flatten_has_dotted_keys():
    flat = flatten_config(load_experiment(QUICK))
    assert flat["algo.mpt.tau"] == 0.99
    assert flat["rollout.segments"] == 4
    assert all(not isinstance(v, dict) or not v for v in flat.values())


def test_parse_override_types():
    assert parse_override("a.b=3") == ("a.b", 3)
    assert parse_override("a.b=0.5") == ("a.b", 0.5)
    assert parse_override("a.b=true") == ("a.b", True)
    assert parse_override("a.b=null") == ("a.b", None)
    with pytest.raises(ConfigError):
        parse_override("nokey")


def test_mode_off_from_yaml_and_override(tmp_path):
    assert load_experiment(QUICK, ["algo.mpt.mode=off"]).algo.mpt.mode == "off"
    p = _write(tmp_path, "algo:\n  mpt:\n    mode: off\n")
    assert load_experiment(p).algo.mpt.mode == "off"
