"""Which trials a sweep runs, and how the console names them: pure functions of the spec.

The searcher runs the search trials (grid points x ``num_samples``, or ``num_samples`` Optuna samples).
After it, the trials outside the searcher run, each as an ``__extra__`` entry of its Tune config
(:func:`extra_entries`): the baseline on each of its seed offsets, the best search trial re-run on those
other than 0, and each reference on its offsets.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from typing import Any, Optional

from ulorl.sweep import ranking
from ulorl.sweep.spec import SweepSpec, grid_trials, values_summary
from ulorl.tracking import schema

MODEL_KEY = "model.name_or_path"


def search_count(spec: SweepSpec) -> int:
    """Trials of the searcher phase (grid: every grid point x ``num_samples``)."""
    return len(grid_trials(spec)) * spec.num_samples if spec.search.algorithm == "grid" else spec.num_samples


def has_extra_trials(spec: SweepSpec) -> bool:
    """Whether trials run after the search (a baseline or a reference)."""
    return spec.baseline is not None or bool(spec.references)


def extra_entries(spec: SweepSpec, best_searched: Optional[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trials outside the searcher, each as its ``__extra__`` config: the baseline on every offset of
    ``spec.baseline_offsets``, the best search trial (its searched values ``best_searched``; None: no best)
    re-run on those other than 0 (the search trials run on offset 0), and each reference on its offsets."""
    entries: list[dict[str, Any]] = []
    if spec.baseline is not None:
        # seed-major, offset 0 last: a sweep cut short still leaves whole (baseline, re-run) pairs,
        # the ones its verdict reads (offset 0 pairs with the selected search trial, not counted)
        for rep in sorted(spec.baseline_offsets, key=lambda r: (r == 0, r)):
            entries.append({"trial_overrides": dict(spec.baseline.overrides), "variant": spec.baseline.name,
                            "repeat": rep, "role": schema.ROLE_BASELINE})
            if best_searched is not None and rep != 0:
                entries.append({"trial_overrides": dict(best_searched), "variant": "", "repeat": rep,
                                "role": schema.ROLE_RERUN})
    entries += [{"trial_overrides": dict(ref.overrides), "variant": ref.name, "repeat": rep,
                 "role": schema.ROLE_REFERENCE} for ref in spec.references for rep in spec.reference_offsets(ref)]
    return entries


def planned_trials(spec: SweepSpec) -> int:
    """Every trial the sweep runs: search, then baseline, re-runs of the best and references."""
    return search_count(spec) + (len(extra_entries(spec, {})) if has_extra_trials(spec) else 0)


def best_searched(spec: SweepSpec, results: Iterable[Any], pruned: Set[str]) -> Optional[dict[str, Any]]:
    """The searched values of the best search trial, the one the extra trials re-run; None when no trial
    finished with the objective, or the best is a grid trial (its values travel by grid index).

    ``results``: Tune results (``error``, ``metrics`` with ``trial_id``, ``config``); ``pruned``: the trial
    ids the scheduler stopped (a pruned trial is never the best one)."""
    done = [r for r in results if r.error is None and r.metrics and r.metrics.get("trial_id") not in pruned]
    i = ranking.best_index([r.metrics.get(spec.metrics[0]) for r in done],
                           [str(r.metrics.get("trial_id", "")) for r in done], spec.modes[0])
    best = done[i] if i is not None else None
    if best is None or not best.config or "__trial__" in best.config:
        return None
    return {k: v for k, v in best.config.items() if k in spec.space}


def describe_trial(spec: SweepSpec, config: dict[str, Any]) -> tuple[str, str]:
    """(role, short values) of a trial from its Tune config, as the console shows it:
    ``("search", "tau=0.9 sigma=0.0931")``, ``("baseline", "masking_off seed+1")``."""
    space = list(spec.space)
    if "__extra__" in config:
        e = config["__extra__"]
        role = str(e.get("role", schema.ROLE_BASELINE))
        overrides = dict(e.get("trial_overrides") or {})
        text = values_summary(overrides) if role == schema.ROLE_RERUN else str(e.get("variant") or "")
        rep = int(e.get("repeat", 0))
        return role, " ".join(x for x in (text, f"seed+{rep}" if rep else "") if x)
    if "__trial__" in config:
        t = grid_trials(spec)[int(config["__trial__"])]
        searched = {k: v for k, v in t["overrides"].items() if k in space}
        rep = int(t["repeat"])
        parts = (t["variant"], values_summary(searched), f"seed+{rep}" if rep else "")
        return schema.ROLE_SEARCH, " ".join(x for x in parts if x)
    return schema.ROLE_SEARCH, values_summary({k: config[k] for k in space if k in config})


def model_paths(spec: SweepSpec, base: dict[str, Any]) -> dict[str, str]:
    """``{model.name_or_path value: where the sweep gives it}`` over every trial it can run: the base with the
    fixed overrides, each variant, the baseline, each reference and each value a search space offers."""
    from ulorl.config import apply_overrides

    fixed = dict(spec.overrides)

    def value(overrides: dict[str, Any]) -> Any:
        return (apply_overrides(base, {**fixed, **overrides}).get("model") or {}).get("name_or_path")

    sources: list[tuple[str, dict[str, Any]]] = [("the base with overrides", {})]
    sources += [(f"variants[{i}] ({v.name})", dict(v.overrides)) for i, v in enumerate(spec.variants)]
    if spec.baseline is not None:
        sources.append(("baseline", dict(spec.baseline.overrides)))
    sources += [(f"references[{i}] ({r.name})", dict(r.overrides)) for i, r in enumerate(spec.references)]
    if MODEL_KEY in spec.space:
        sources += [(f"space.{MODEL_KEY}", {MODEL_KEY: v}) for v in spec.space[MODEL_KEY].probe_values()]
    out: dict[str, str] = {}
    for where, overrides in sources:
        v = value(overrides)
        if isinstance(v, str) and v not in out:
            out[v] = where
    return out


def missing_model_problem(spec: SweepSpec, base: dict[str, Any], sweep_path: str, *,
                          absolute_too: bool = True) -> Optional[str]:
    """Why a trial of the sweep would fail at once, before any trial starts: a ``model.name_or_path`` that
    names a local folder which does not exist (relative to this folder, the driver's, against which a
    trial's relative paths are made absolute: ``ulorl.sweep.trial.absolute_local_paths``). Without the
    check the trial fails in Tune, is retried from a checkpoint it never wrote, and the summary names Ray's
    process instead of the path. ``absolute_too=False`` (a cluster's ``--address``): an absolute path
    may exist on its nodes only, so only relative ones are checked. None when every path can load."""
    from pathlib import Path

    from ulorl.models.loading import missing_local_model

    for value, where in model_paths(spec, base).items():
        if not absolute_too and Path(value).expanduser().is_absolute():
            continue
        missing = missing_local_model(value)
        if missing:
            return (f"{sweep_path}: {where}: {MODEL_KEY}: {missing}; every trial with it would fail (a folder a "
                    "sweep file names must be built first: its comment has the command)")
    return None
