"""The command that re-runs a sweep trial: the overrides it ran with (the sweep's fixed ones, its
variant's, its searched values typed back through the experiment schema, its repeat's seeds) and the
shell-quoted ``ulorl-train <base> key=value ...`` line the summary prints."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Optional

import yaml

from ulorl.config import apply_overrides, config_from_dict, flatten_config
from ulorl.sweep.ranking import Trial
from ulorl.sweep.spec import seed_overrides


def override_value(value: Any) -> str:
    """A value as ``key=value`` text that ``ulorl-train`` parses back to the same type
    (YAML): ``0.95 -> 0.95``, ``'off' -> "'off'"`` (bare ``off`` would be the boolean False)."""
    if isinstance(value, str):
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = None
        return value if parsed == value else "'" + value.replace("'", "''") + "'"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value) if not isinstance(value, (list, dict)) else yaml.safe_dump(value, default_flow_style=True).strip()


def train_command(base_path: Path, overrides: dict[str, Any], cwd: Optional[Path] = None) -> str:
    """``ulorl-train <base> key=value ...`` that re-runs a trial (shell-quoted)."""
    base = Path(base_path)
    try:
        base = base.relative_to((cwd or Path.cwd()).resolve())
    except ValueError:
        pass
    parts = ["ulorl-train", str(base)] + [f"{k}={override_value(v)}" for k, v in overrides.items()]
    return " ".join(_shell_quote(p) for p in parts)


def _shell_quote(arg: str) -> str:
    """Like ``shlex.quote`` but ``key='off'`` becomes ``"key='off'"`` (readable) when safe."""
    if "'" in arg and not any(c in arg for c in '"$`\\!'):
        return f'"{arg}"'
    return shlex.quote(arg)


def typed_values(base: dict[str, Any], fixed: dict[str, Any], logged: dict[str, Any]) -> dict[str, Any]:
    """MLflow params are strings: read them back through the experiment schema so the command
    carries typed values (``'0.95' -> 0.95``, ``'off'`` stays the string ``off``)."""
    cfg = config_from_dict(apply_overrides(base, {**fixed, **logged}))
    flat = flatten_config(cfg)
    return {k: flat.get(k, v) for k, v in logged.items()}


def fixed_overrides(spec: Any) -> dict[str, Any]:
    """The overrides every trial of ``spec`` gets (spec overrides plus the stop settings)."""
    fixed = dict(spec.overrides)
    if spec.stop.steps:
        fixed["train.max_steps"] = spec.stop.steps
    if spec.stop.wall_s:
        fixed["train.max_wall_s"] = spec.stop.wall_s
    return fixed


def best_trial_overrides(spec: Any, base: dict[str, Any], fixed: dict[str, Any], trial: Trial) -> dict[str, Any]:
    """The overrides that re-run ``trial``: the sweep's fixed ones, its variant's (a grid sweep over
    ``variants``), its searched values (typed through the schema) and, for a repeat on seed offset
    r > 0, that repeat's seeds."""
    variant = next((v for v in getattr(spec, "variants", []) or [] if v.name and v.name == trial.variant), None)
    out = {**fixed, **(dict(variant.overrides) if variant is not None else {})}
    out.update(typed_values(base, out, trial.searched))
    if trial.seed_offset:
        out.update(seed_overrides(apply_overrides(base, out), trial.seed_offset))
    return out
