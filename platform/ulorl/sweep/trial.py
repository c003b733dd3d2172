"""One sweep trial, as it runs inside Ray Tune: a full ``ulorl-train`` run with the trial's overrides,
reporting each step's metrics (and checkpoint) to Tune; and :func:`trial_meta`, the sweep-wide settings
the driver binds to it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Optional

from ulorl.config import ExperimentConfig, apply_overrides, config_from_dict
from ulorl.data.profiles import EMBEDDED
from ulorl.quiet import quiet_libraries
from ulorl.sweep import prune
from ulorl.sweep.command import fixed_overrides
from ulorl.sweep.placed import needs_placement, run_placed_trial
from ulorl.sweep.spec import SweepSpec, grid_trials, seed_overrides, trial_run_name
from ulorl.tracking import schema
from ulorl.tracking.credentials import install_credentials
from ulorl.train.checkpoint import LATEST, checkpoint_root, latest_checkpoint
from ulorl.train.trainer import Trainer

FAIL_ENV = "ULORL_INJECT_FAILURE"   # "STEP:MARKER_PATH": fail once at STEP (tests of fault tolerance)


LOCAL_PATH_KEYS = ("model.name_or_path", "data.train", "data.heldout")


def absolute_local_paths(config: dict[str, Any], cwd: Path) -> dict[str, str]:
    """Overrides that make each relative path among ``LOCAL_PATH_KEYS`` of the nested ``config`` absolute
    against ``cwd``, the driver's working directory: Tune runs a trial in a folder of its own. A value
    that names nothing under ``cwd`` (``embedded``, a benchmark name, a HF id) is left alone."""
    out: dict[str, str] = {}
    for key in LOCAL_PATH_KEYS:
        section, name = key.split(".")
        value = (config.get(section) or {}).get(name)
        if not isinstance(value, str) or not value or value.startswith(EMBEDDED) or Path(value).is_absolute():
            continue
        if (cwd / value).exists():
            out[key] = str((cwd / value).resolve())
    return out


def trial_meta(spec: SweepSpec, base: dict[str, Any], base_path: Path, sweep_dir: Path, parent_run_id: str,
               trial_tracking_uri: str) -> dict[str, Any]:
    """The sweep-wide settings every trial gets (:func:`trial_fn`'s ``meta``); a grid sweep's trials
    as a list its Tune configs index (``__trial__``)."""
    meta = {
        "base_dict": base, "base_path": str(base_path), "sweep_dir": str(sweep_dir),
        "sweep_name": spec.name, "parent_run_id": parent_run_id, "trial_tracking_uri": trial_tracking_uri,
        "tags": dict(spec.tags), "metrics": spec.metrics, "cpu": spec.resources.cpu,
        "fixed": fixed_overrides(spec), "cwd": str(Path.cwd()),
    }
    if spec.search.algorithm == "grid":
        meta["grid"] = [{"trial_overrides": t["overrides"], "variant": t["variant"], "repeat": t["repeat"],
                         "trial_tags": t["tags"]} for t in grid_trials(spec)]
    return meta


def trial_fn(config: dict[str, Any], meta: dict[str, Any], credentials: Optional[dict[str, str]] = None) -> None:
    """Ray Tune function trainable: one full ``ulorl-train`` run with the trial's overrides.

    ``config`` holds the searched keys (optuna) or ``__trial__`` (index into ``meta["grid"]``);
    ``meta`` (bound with ``tune.with_parameters``) holds the sweep-wide settings, ``credentials`` the
    tracking server's (``ulorl.tracking.credentials``: through the object store, never a logged env).
    """
    import ray.tune as tune

    quiet_libraries()
    install_credentials(credentials or {})
    ctx = tune.get_context()
    trial_id = ctx.get_trial_id()
    meta = dict(meta)
    if "__trial__" in config:
        meta.update(meta["grid"][int(config["__trial__"])])
        meta["tags"] = {**meta["tags"], **meta.get("trial_tags", {})}
    if "__extra__" in config:  # baseline / re-run trial outside the searcher
        meta.update(config["__extra__"])
        config = {}
    overrides = dict(meta["fixed"])
    overrides.update(meta.get("trial_overrides") or {})
    varied = {**(meta.get("trial_overrides") or {}), **{k: v for k, v in config.items() if k != "__trial__"}}
    overrides.update(varied)
    rep = int(meta.get("repeat", 0))
    role = meta.get("role", schema.ROLE_SEARCH)
    overrides["tracking.run_name"] = trial_run_name(
        meta["sweep_name"], trial_id, varied, "" if role == schema.ROLE_SEARCH else role, rep)
    base = meta["base_dict"]
    overrides.update(seed_overrides(apply_overrides(base, overrides), rep))
    placed = needs_placement(config_from_dict(apply_overrides(base, overrides), source=meta["base_path"]))
    if not placed:  # a placed trial's actors take one thread per CPU of their own bundle
        overrides["train.threads"] = max(1, int(meta["cpu"]))
    overrides.update(absolute_local_paths(apply_overrides(base, overrides), Path(meta["cwd"])))
    cfg = config_from_dict(apply_overrides(base, overrides), source=meta["base_path"])

    run_dir = Path(meta["sweep_dir"]) / "trials" / trial_id
    _restore_tune_checkpoint(tune.get_checkpoint(), run_dir)
    resume = str(run_dir) if latest_checkpoint(run_dir) is not None else None
    fail_at = None
    inj = os.environ.get(FAIL_ENV)
    if inj:
        step_s, marker = inj.split(":", 1)
        if not Path(marker).exists():
            Path(marker).write_text(trial_id)
            fail_at = int(step_s)

    tags = {schema.TRIAL_TAG: trial_id, schema.SWEEP_TAG: meta["sweep_name"], schema.ROLE_TAG: role,
            schema.SEED_TAG: str(rep), **meta["tags"]}
    if meta.get("variant"):
        tags[schema.VARIANT_TAG] = meta["variant"]
    metrics_names = meta["metrics"]

    def report(step: int, metrics: dict[str, float], ckpt: Optional[Path]) -> None:
        out = {k: float(v) for k, v in metrics.items()}
        out["step"] = step
        out[prune.FRESH_KEY] = float(bool(metrics_names) and prune.objective_fresh(metrics_names[0], metrics))
        for name in metrics_names:  # Tune must always see the objective: last known value
            out.setdefault(name, last_obj.get(name, float("nan")))
            last_obj[name] = out[name]
        if ckpt is not None:
            tune.report(out, checkpoint=tune.Checkpoint.from_directory(str(ckpt)))
        else:
            tune.report(out)

    last_obj: dict[str, float] = {}
    if placed:
        run_placed_trial(cfg, run_dir=run_dir, resume=resume, tracking_uri=meta["trial_tracking_uri"], report=report,
                         parent_run_id=meta["parent_run_id"], extra_tags=tags, fail_at_step=fail_at,
                         eval_at_start=True)
        return
    Trainer(
        cfg, run_dir=run_dir, resume=resume, tracking_uri=meta["trial_tracking_uri"],
        parent_run_id=meta["parent_run_id"], extra_tags=tags, step_callback=report, progress=False,
        fail_at_step=fail_at, eval_at_start=True,
    ).run()


def trial_config(config: dict[str, Any], meta: dict[str, Any]) -> ExperimentConfig:
    """The experiment a trial with Tune ``config`` runs (resources decided by it), before seeds/threads."""
    over = dict(meta["fixed"])
    if "__trial__" in config:
        over.update(meta["grid"][int(config["__trial__"])].get("trial_overrides") or {})
    over.update({k: v for k, v in config.items() if k != "__trial__"})
    return config_from_dict(apply_overrides(meta["base_dict"], over), source=meta["base_path"])


def _restore_tune_checkpoint(checkpoint: Any, run_dir: Path) -> None:
    """On another machine, Tune hands back the trial's checkpoint: put it where the trainer looks."""
    if checkpoint is None or latest_checkpoint(run_dir) is not None:
        return
    with checkpoint.as_directory() as d:
        src = Path(d)
        dst = checkpoint_root(run_dir) / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst, dirs_exist_ok=True)
        (checkpoint_root(run_dir) / LATEST).write_text(dst.name + "\n")
