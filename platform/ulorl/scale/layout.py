"""Placement arithmetic of a Ray run, pure (no Ray import): bundles, strategy, roles, node layout, fit checks.

Layout (``resources`` section of the experiment)::

    bundle 0 .. N-1   trainer workers  {CPU: cpus_per_trainer_worker, GPU: gpus_per_trainer_worker}
    bundle N .. N+M-1 rollout engines  {CPU: cpus_per_engine,         GPU: gpus_per_engine}

``STRICT_PACK`` (one machine) when ``resources.nodes == 1``, else ``PACK``. Used by ``ulorl-train
--dry-run`` (``ulorl.cli.plan``), the sweep's trial resources (``ulorl.sweep.placed``) and the placed
driver (``ulorl.scale.placement``, which holds everything that talks to Ray).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from ulorl.config import ExperimentConfig


class PlacementError(RuntimeError):
    """The placement group cannot be made (resources missing, Ray unreachable, bad layout)."""


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    b = {"CPU": float(cpus)}
    if gpus > 0:
        b["GPU"] = float(gpus)
    return b


def placement_bundles(cfg: ExperimentConfig) -> list[dict[str, float]]:
    """Trainer-worker bundles then engine bundles, from ``cfg.resources``."""
    r = cfg.resources
    return [_bundle(r.cpus_per_trainer_worker, r.gpus_per_trainer_worker)] * r.trainer_workers + [
        _bundle(r.cpus_per_engine, r.gpus_per_engine)
    ] * r.rollout_engines


def placement_strategy(cfg: ExperimentConfig) -> str:
    return "STRICT_PACK" if cfg.resources.nodes == 1 else "PACK"


def check_fits(bundles: list[dict[str, float]], strategy: str, cluster: dict[str, float],
               nodes: list[dict[str, float]]) -> Optional[str]:
    """Why ``bundles`` cannot be placed on a cluster (totals ``cluster``, per-node ``nodes``), or None."""
    for res in ("CPU", "GPU"):
        need = sum(b.get(res, 0.0) for b in bundles)
        have = float(cluster.get(res, 0.0))
        if need > have + 1e-9:
            return f"the placement needs {need:g} {res} in total but the Ray cluster has {have:g}"
        if strategy == "STRICT_PACK":
            best = max((float(n.get(res, 0.0)) for n in nodes), default=0.0)
            if need > best + 1e-9:
                return (f"resources.nodes=1 packs everything on one machine: {need:g} {res} needed, "
                        f"the largest node has {best:g}")
    return None


def bundle_roles(cfg: ExperimentConfig) -> list[str]:
    """``trainer.<i>`` then ``engine.<j>``: the role of each of ``placement_bundles(cfg)``."""
    r = cfg.resources
    return [f"trainer.{i}" for i in range(r.trainer_workers)] + [f"engine.{j}" for j in range(r.rollout_engines)]


def node_shape(cfg: ExperimentConfig) -> dict[str, float]:
    """The declared per-node resources (``gpus_per_node`` / ``cpus_per_node``; empty when undeclared)."""
    r = cfg.resources
    shape = {}
    if r.cpus_per_node is not None:
        shape["CPU"] = float(r.cpus_per_node)
    if r.gpus_per_node is not None:
        shape["GPU"] = float(r.gpus_per_node)
    return shape


def _fits(bundle: dict[str, float], free: dict[str, float]) -> bool:
    return all(bundle.get(k, 0.0) <= free.get(k, 0.0) + 1e-9 for k in bundle if k in free)


def node_layout(cfg: ExperimentConfig) -> dict[str, Any]:
    """Where the bundles go on ``resources.nodes`` nodes of the declared shape (pure, for ``--dry-run``).

    Bundles are taken in order (trainer workers, then engines) and each goes to the first node with
    room, so a role fills a node before the next node is used: 8 trainer + 8 engine GPUs on 2 x 8-GPU
    nodes give one node of trainers and one of engines. Ray's PACK strategy packs the same way; the
    layout it picks may differ in which node gets which role. Raises ``PlacementError`` naming the
    first bundle that fits on none of the nodes.
    """
    r = cfg.resources
    bundles, roles, shape = placement_bundles(cfg), bundle_roles(cfg), node_shape(cfg)
    out: dict[str, Any] = {"strategy": placement_strategy(cfg), "nodes": r.nodes, "node_shape": shape or "undeclared"}
    if not shape:
        return out
    free = [dict(shape) for _ in range(r.nodes)]
    nodes: list[list[str]] = [[] for _ in range(r.nodes)]
    for role, b in zip(roles, bundles):
        k = next((k for k in range(r.nodes) if _fits(b, free[k])), None)
        if k is None:
            raise PlacementError(
                f"bundle {role} {b} fits on none of resources.nodes={r.nodes} node(s) of {shape} once the bundles "
                f"before it are placed (node use: {[{'roles': len(n), **f} for n, f in zip(nodes, free)]} free); "
                f"raise resources.nodes or shrink the roles"
            )
        for key in shape:
            free[k][key] -= b.get(key, 0.0)
        nodes[k].append(role)
    out["layout"] = [{"node": k, "roles": nodes[k], "used": {key: shape[key] - free[k][key] for key in shape}}
                     for k in range(r.nodes)]
    return out


def check_nodes_hold(bundles: list[dict[str, float]], roles: list[str], strategy: str,
                     nodes: list[dict[str, Any]]) -> Optional[str]:
    """Why the cluster's ``nodes`` (from ``cluster_nodes``) cannot hold ``bundles``, or None.

    Ray leaves a placement group it cannot place pending forever (a Tune trial waits with it), so
    this is checked before anything is asked of Ray: every bundle must fit on one node (the whole
    group for STRICT_PACK), and the totals must fit the cluster.
    """
    if not nodes:
        return "the Ray cluster has no alive node"

    def size(n: dict[str, Any]) -> tuple[float, float]:
        return float(n["resources"].get("GPU", 0.0)), float(n["resources"].get("CPU", 0.0))

    largest = max(nodes, key=size)
    big = {k: largest["resources"].get(k, 0.0) for k in ("CPU", "GPU")}
    where = (f"the largest node ({largest['ip']}, node id {largest['node_id'][:12]}) has "
             f"{big['CPU']:g} CPU, {big['GPU']:g} GPU")
    if strategy == "STRICT_PACK":
        total = {k: sum(b.get(k, 0.0) for b in bundles) for k in ("CPU", "GPU")}
        if not any(_fits(total, {k: n["resources"].get(k, 0.0) for k in ("CPU", "GPU")}) for n in nodes):
            return (f"resources.nodes=1 packs all bundles on one node: {total['CPU']:g} CPU, {total['GPU']:g} GPU "
                    f"needed, {where}")
    for role, b in zip(roles, bundles):
        if not any(_fits(b, {k: n["resources"].get(k, 0.0) for k in ("CPU", "GPU")}) for n in nodes):
            return f"bundle {role} {b} fits on no node of the Ray cluster: {where}"
    for k in ("CPU", "GPU"):
        need = sum(b.get(k, 0.0) for b in bundles)
        have = sum(float(n["resources"].get(k, 0.0)) for n in nodes)
        if need > have + 1e-9:
            return f"the bundles need {need:g} {k} in total, the Ray cluster's {len(nodes)} node(s) have {have:g}"
    return None


def validate_layout(cfg: ExperimentConfig) -> None:
    r = cfg.resources
    if r.trainer_workers > 1 and cfg.train.backend != "deepspeed":
        raise PlacementError(
            f"resources.trainer_workers={r.trainer_workers} needs train.backend=deepspeed "
            f"(train.backend={cfg.train.backend!r} trains in one process)"
        )


def actor_threads(cpus: float) -> int:
    return max(1, int(math.floor(cpus + 1e-9)))


def trainer_nodes_needed(cfg: ExperimentConfig) -> int:
    """The fewest nodes the trainer bundles fit on: their GPUs over ``gpus_per_node`` (1 when undeclared)."""
    r = cfg.resources
    gpus = r.trainer_workers * r.gpus_per_trainer_worker
    if not r.gpus_per_node or gpus <= 0:
        return 1
    return max(1, math.ceil(gpus / r.gpus_per_node - 1e-9))


def trainer_split_problem(cfg: ExperimentConfig, trainer_info: list[dict[str, Any]]) -> Optional[str]:
    """Why the trainers' placement is slow, or None (pure): they landed on more nodes than they need.

    ``PACK`` (``resources.nodes`` > 1) packs on a best-effort basis: Ray may split the trainer bundles
    over nodes (one taken by engines, or by another job), and then every ZeRO-3 gather and gradient
    reduce crosses nodes. ``trainer_info``: each trainer actor's ``{"node_id", "node_ip"}`` in rank order.
    """
    nodes = sorted({i["node_id"] for i in trainer_info})
    need = trainer_nodes_needed(cfg)
    if len(nodes) <= need:
        return None
    per_node = {n: sum(1 for i in trainer_info if i["node_id"] == n) for n in nodes}
    where = ", ".join(f"{n[:12]}: {k}" for n, k in per_node.items())
    return (f"the {len(trainer_info)} trainer workers landed on {len(nodes)} nodes ({where} ranks) though they fit on "
            f"{need}: every ZeRO-3 gather crosses nodes. Ray's PACK strategy (resources.nodes="
            f"{cfg.resources.nodes}) only prefers packing; free whole nodes for the run, or declare "
            f"resources.gpus_per_node so the dry-run's node_layout shows the intended split")


def placement_params(cfg: ExperimentConfig, address: str, strategy: str, bundles: list[dict[str, float]],
                     trainer_info: list[dict[str, Any]], engine_info: list[dict[str, Any]],
                     cluster: dict[str, float]) -> dict[str, str]:
    """The ``placement.*`` params of a run (strings, as MLflow stores them)."""
    n = cfg.resources.trainer_workers
    out = {
        "placement.address": address,
        "placement.strategy": strategy,
        "placement.trainer_workers": str(n),
        "placement.rollout_engines": str(cfg.resources.rollout_engines),
        "placement.bundles": json.dumps(bundles),
        "placement.cluster_cpus": f"{cluster.get('CPU', 0.0):g}",
        "placement.cluster_gpus": f"{cluster.get('GPU', 0.0):g}",
        "placement.nodes_used": str(len({i["node_id"] for i in trainer_info + engine_info})),
        "placement.trainer_nodes": str(len({i["node_id"] for i in trainer_info})),
        "placement.master_addr": trainer_info[0]["node_ip"] if trainer_info else "",
    }
    split = trainer_split_problem(cfg, trainer_info)
    if split:   # recorded with the run: a split is slow, not wrong
        out["placement.trainer_split"] = split
    for i, info in enumerate(trainer_info):
        out[f"placement.trainer.{i}.node_ip"] = info["node_ip"]
        out[f"placement.trainer.{i}.node_id"] = info["node_id"]
        out[f"placement.trainer.{i}.resources"] = json.dumps(bundles[i])
    for j, info in enumerate(engine_info):
        out[f"placement.engine.{j}.node_ip"] = info["node_ip"]
        out[f"placement.engine.{j}.node_id"] = info["node_id"]
        out[f"placement.engine.{j}.resources"] = json.dumps(bundles[n + j])
    return out
