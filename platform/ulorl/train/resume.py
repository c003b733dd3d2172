"""Which config changes a resumed run accepts.

A checkpoint stores the config it was trained with. Resuming with a different algorithm, rollout,
model or data setting silently mixes two experiments in one run, so ``Trainer`` refuses it (naming
each changed key) unless ``--allow-config-change`` is given. The keys below only bound or observe
the run and may change freely (a sweep retry sets ``train.threads``, a longer run raises
``train.max_steps``)::

    changes = config_changes(saved_dict, cfg)          # [("algo.is_mode", "pois", "sais"), ...]
    check_resume_config(saved_dict, cfg, allow=False)  # raises ResumeConfigError on an unsafe change
"""

from __future__ import annotations

from typing import Any

from ulorl.config import ConfigError, ExperimentConfig, flatten_config, known_keys

#: Keys (``section.*`` = the whole section) that may differ between a checkpoint and its resume.
SAFE_RESUME_KEYS: tuple[str, ...] = (
    "train.max_steps",
    "train.max_wall_s",
    "train.threads",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "eval.*",
    "tracking.*",
)

Change = tuple[str, Any, Any]  # (dotted key, value in the checkpoint, value now)


class ResumeConfigError(ConfigError):
    """The resumed config differs from the checkpoint's in keys that are not safe to change."""


def is_safe_resume_key(key: str) -> bool:
    for pattern in SAFE_RESUME_KEYS:
        if pattern.endswith(".*"):
            if key == pattern[:-2] or key.startswith(pattern[:-1]):
                return True
        elif key == pattern:
            return True
    return False


def config_changes(saved: dict[str, Any], cfg: ExperimentConfig) -> list[Change]:
    """Every dotted key whose value differs between the checkpoint's config dict and ``cfg``, sorted.

    A key the checkpoint lacks (a field added since) counts as its schema default there; a key the
    current schema no longer has (a setting removed since) is ignored.
    """
    old = flatten_config(saved)
    new = flatten_config(cfg)
    defaults = flatten_config(ExperimentConfig())
    schema = known_keys()
    out: list[Change] = []
    for key in sorted(set(old) | set(new)):
        if key not in new and not any(key.startswith(k + ".") or key == k for k in schema):
            continue
        before = old.get(key, defaults.get(key))
        after = new.get(key, defaults.get(key))
        if before != after:
            out.append((key, before, after))
    return out


def check_resume_config(saved: dict[str, Any] | None, cfg: ExperimentConfig, *, allow: bool) -> list[Change]:
    """Return the changes; raise :class:`ResumeConfigError` naming each unsafe one unless ``allow``."""
    if not saved:
        return []
    changes = config_changes(saved, cfg)
    unsafe = [c for c in changes if not is_safe_resume_key(c[0])]
    if unsafe and not allow:
        lines = "\n".join(f"  {k}: {before!r} in the checkpoint, {after!r} now" for k, before, after in unsafe)
        raise ResumeConfigError(
            f"refusing to resume with a changed config:\n{lines}\n"
            "resume with the checkpoint's settings, or pass --allow-config-change "
            f"(safe to change without it: {', '.join(SAFE_RESUME_KEYS)})"
        )
    return changes
