"""Which runs a claim reads: sweep groups (launches pooled when their settings agree), each
arm's runs, one run per seed. Part of :mod:`ulorl.report.claims`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Optional

from ulorl.report.claims_registry import (
    Arm,
)
from ulorl.report.store import RunInfo
from ulorl.tracking import schema
from ulorl.tracking.schema import SEED_KEYS

# ----------------------------------------------------------------------------- selecting runs


def seed_key(run: RunInfo) -> tuple[str, ...]:
    """What pairs two arms' runs: their (data.seed, rollout.seed, train.seed) params."""
    return tuple(run.param(k, "0") for k in SEED_KEYS)


# Params that differ between runs of one launch without making them another configuration.
_NOT_CONFIG = SEED_KEYS + ("train.threads", "tracking.run_name", "train.output_dir")


def _config(run: RunInfo) -> dict[str, str]:
    return {k: v for k, v in run.params.items() if k not in _NOT_CONFIG}


def launch_settings(launches: dict[str, list[RunInfo]]) -> dict[str, dict[str, str]]:
    """Per launch (MLflow parent run id -> its runs): the params every run of it shares, without
    the keys that vary within any launch of the sweep (its arms) and the seeds."""
    varied = {k for runs in launches.values() for k in {k for r in runs for k in r.params}
              if len({r.param(k, "\0") for r in runs}) > 1}
    out = {}
    for parent, runs in launches.items():
        shared = {k: v for k, v in _config(runs[0]).items() if k not in varied
                  and all(r.param(k, "\0") == v for r in runs)}
        out[parent] = shared
    return out


def sweep_groups(runs: Sequence[RunInfo]) -> dict[tuple[str, str], list[RunInfo]]:
    """Runs by (sweep name, label): the launches (MLflow parents) of one sweep name are pooled when
    their shared settings (:func:`launch_settings`) agree on every key both have AND the later launch
    only adds seeds (no run of it repeats a configuration and seeds an earlier launch of the group
    ran), so seeds added by a later launch pair with the earlier ones; launches that differ (e.g.
    another learning rate after an edit of the spec) or that re-run seeds already run form groups of
    their own: a later run of a seed never replaces or joins an earlier one unseen. The label names
    every pooled parent (first 8 characters, ``+``-joined). Runs outside any sweep form the group ("", "")."""
    by_sweep: dict[str, list[RunInfo]] = {}
    for r in runs:
        by_sweep.setdefault(r.tags.get(schema.SWEEP_TAG, ""), []).append(r)
    out: dict[tuple[str, str], list[RunInfo]] = {}
    for sweep, rs in by_sweep.items():
        if not sweep:
            out[("", "")] = rs
            continue
        launches: dict[str, list[RunInfo]] = {}
        for r in rs:
            launches.setdefault(r.parent_id, []).append(r)
        settings = launch_settings(launches)
        clusters: list[tuple[dict[str, str], list[str], set[str]]] = []
        for parent in sorted(launches, key=lambda p: min((r.start_time, r.run_id) for r in launches[p])):
            mine, ran = settings[parent], {_run_key(r) for r in launches[parent]}
            for shared, parents, seen in clusters:
                if all(shared[k] == v for k, v in mine.items() if k in shared) and not (ran & seen):
                    shared.update(mine)
                    parents.append(parent)
                    seen |= ran
                    break
            else:
                clusters.append((dict(mine), [parent], set(ran)))
        for _, parents, _ in clusters:
            out[(sweep, "+".join(p[:8] for p in parents if p))] = [r for p in parents for r in launches[p]]
    return out


def _run_key(run: RunInfo) -> str:
    """A run's configuration and seeds: two runs with the same key are the same seed of one arm run twice."""
    return json.dumps([_config(run), seed_key(run)], sort_keys=True)


def _num(v: str) -> Optional[float]:
    try:
        return float(v)
    except ValueError:
        return None


def arm_runs(arm: Arm, group: Sequence[RunInfo]) -> list[RunInfo]:
    """Runs of ``group`` that belong to ``arm`` (see :class:`Arm`)."""
    runs = [r for r in group if not arm.role or r.tags.get(schema.ROLE_TAG) == arm.role]
    for param, value in arm.params:
        if value in ("max", "min"):
            nums = [x for x in (_num(r.param(param)) for r in group) if x is not None]
            if not nums:
                return []
            want = max(nums) if value == "max" else min(nums)
            runs = [r for r in runs if _num(r.param(param)) == want]
        else:
            runs = [r for r in runs if r.param(param) == value]
    return runs


def one_config(runs: Sequence[RunInfo]) -> tuple[list[RunInfo], list[str]]:
    """The runs of the most common configuration (ties: the latest started) and a note when
    others were left out (re-runs of two launches that picked different best trials)."""
    configs: dict[str, list[RunInfo]] = {}
    for r in runs:
        configs.setdefault(json.dumps(_config(r), sort_keys=True), []).append(r)
    if len(configs) <= 1:
        return list(runs), []
    keep = max(configs.values(), key=lambda rs: (len(rs), max(r.start_time for r in rs)))
    left = [r.run_id[:8] for rs in configs.values() if rs is not keep for r in rs]
    return keep, [f"{len(configs)} configurations among the re-runs; kept the most common, left out {', '.join(left)}"]


def by_seed(runs: Sequence[RunInfo]) -> tuple[dict[tuple[str, ...], RunInfo], list[str]]:
    """One run per seed key, the FIRST started (a seed counts once, and a later run of it may not replace
    the one that was planned: choosing between them after their results is choosing the result), and a
    note naming every duplicate left out."""
    out: dict[tuple[str, ...], RunInfo] = {}
    notes = []
    for r in sorted(runs, key=lambda r: (r.start_time, r.run_id)):
        key = seed_key(r)
        if key in out:
            notes.append(f"duplicate seed {'/'.join(key)}: run {r.run_id} left out, the first started "
                         f"{out[key].run_id} counts (a later run of a seed never replaces it)")
            continue
        out[key] = r
    return out, notes
