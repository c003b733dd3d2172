"""Sweep trials placed like single runs: a Tune placement-group request built from ``resources``.

    needs_placement(cfg)                  # more than one process (or nodes > 1): placed
    trial_resources(cfg, cpu, gpu)        # PlacementGroupFactory for placed trials, else {cpu, gpu}
    check_trials_fit(cfgs)                # fail fast before Tune: names the bundle and the largest node
    run_placed_trial(cfg, ...)            # inside the trial: ulorl.scale.placement.run_placement

A placed trial's resource request is ``[{"CPU": 0.01}] + trainer bundles + engine bundles``
(``ulorl.scale.placement.tune_resources``): bundle 0 is the trial process itself (it only relays
metrics and checkpoints to Tune), the trainer workers and rollout engines run as Ray actors in the
other bundles, on whichever nodes Ray packs them (STRICT_PACK for ``resources.nodes == 1``, else
PACK). A one-process experiment keeps running the ``Trainer`` in the trial's own process.

Checkpoints: the trainer (rank 0) writes its checkpoints under the trial's run directory, which the
driver puts under ``--output-dir``; on several machines that directory must be shared storage
(NFS, a mounted bucket) — it is also Tune's ``storage_path``. A checkpoint path that the trial's
process cannot see is reported to Tune without a checkpoint (a retry resumes from the shared run
directory instead).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from ulorl.config import ExperimentConfig
from ulorl.scale.layout import PlacementError, bundle_roles, check_nodes_hold, placement_bundles, placement_strategy
from ulorl.scale.placement import cluster_nodes, run_placement, tune_resources

log = logging.getLogger("ulorl.sweep.placed")

TRIAL_BUNDLE = {"CPU": 0.01}


def needs_placement(cfg: ExperimentConfig) -> bool:
    """True when the experiment asks for more than one process or more than one node."""
    r = cfg.resources
    return r.trainer_workers > 1 or r.rollout_engines > 1 or r.nodes > 1


def trial_resources(cfg: ExperimentConfig, cpu: float, gpu: float) -> Any:
    """What Tune reserves for a trial of ``cfg``: its placement group, or ``{cpu, gpu}`` in one process."""
    if needs_placement(cfg):
        return tune_resources(cfg, trial_cpus=TRIAL_BUNDLE["CPU"])
    return {"cpu": cpu, "gpu": gpu}


def describe_resources(cfg: ExperimentConfig, cpu: float, gpu: float) -> dict[str, Any]:
    """What ``ulorl-sweep --dry-run`` prints for a trial of ``cfg``: ``{cpu, gpu}`` for a one-process
    trial, else the placement group Tune will request (strategy and each bundle with its role)."""
    if not needs_placement(cfg):
        return {"cpu": cpu, "gpu": gpu}
    bundles = [dict(TRIAL_BUNDLE)] + placement_bundles(cfg)
    roles = ["trial"] + bundle_roles(cfg)
    return {"placement_group": {"strategy": placement_strategy(cfg), "nodes": cfg.resources.nodes,
                                "bundles": [{"role": role, **b} for role, b in zip(roles, bundles)]}}


def check_trials_fit(cfgs: list[tuple[str, ExperimentConfig]], nodes: Optional[list[dict[str, Any]]] = None) -> None:
    """Raise ``PlacementError`` when a placed trial can never be scheduled on the cluster's nodes.

    Tune leaves such a trial pending forever; this names the trial, the bundle and the largest node.
    ``cfgs``: (trial label, config) pairs; ``nodes``: ``cluster_nodes()`` (default: the connected cluster).
    """
    nodes = cluster_nodes() if nodes is None else nodes
    for label, cfg in cfgs:
        if not needs_placement(cfg):
            continue
        bundles = [dict(TRIAL_BUNDLE)] + placement_bundles(cfg)
        why = check_nodes_hold(bundles, ["trial"] + bundle_roles(cfg), placement_strategy(cfg), nodes)
        if why:
            raise PlacementError(f"trial {label} cannot be placed: {why}")


def run_placed_trial(
    cfg: ExperimentConfig,
    *,
    run_dir: Path,
    resume: Optional[str],
    tracking_uri: str,
    report: Callable[[int, dict[str, float], Optional[Path]], None],
    **trainer_kwargs: Any,
) -> None:
    """The trial body of a placed experiment: ``run_placement`` in the trial's placement group.

    ``report(step, metrics, checkpoint_dir_or_None)`` is called in this process for every step.
    """
    def relay(step: int, metrics: dict[str, float], ckpt: Optional[Path]) -> None:
        if ckpt is not None and not Path(ckpt).is_dir():
            log.warning("checkpoint %s is not visible from the trial's node; reported without it (the run "
                        "directory must be on shared storage for retries on another node)", ckpt)
            ckpt = None
        report(step, metrics, ckpt)

    run_placement(cfg, run_dir=run_dir, resume=resume, tracking_uri=tracking_uri, step_callback=relay,
                  progress=False, **trainer_kwargs)
