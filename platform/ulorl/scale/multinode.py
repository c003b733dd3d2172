"""What a placed run needs when its processes leave the driver's machine (pure; no Ray import).

    plan = store_plan(uri, driver, trainer0, server_host="10.0.0.5")   # "direct" | "serve"
    probe = RunDirProbe.create(run_dir)                                   # a token file in the run dir
    answers = [actor.sees_run_dir(probe.path, probe.token) ...]           # one actor per node
    probe.check(answers)                                                  # PlacementError naming the node

* Tracking: a local store (``sqlite:///...``, a bare ``.db`` path) is a file on the driver's machine.
  Trainer rank 0 writes the run; when it sits on another Ray node it needs the store through a server
  (``MlflowServer``, as a sweep serves its trials): ``serve`` on ``tracking.server_host`` (basic auth
  beyond loopback). A loopback server reaches only processes on the driver's own machine (several Ray
  nodes of one machine, as in the tests): a rank 0 on another address is refused before step 1 with
  the settings that work.
* Run directory: every rank writes checkpoint shards under it and rank 0 reads them back on resume;
  each node the run uses must see the directory the driver made. A probe token written by the driver
  must be readable on every node, and the file each node writes back must be visible to the driver.
"""

from __future__ import annotations

import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ulorl.scale.layout import PlacementError
from ulorl.tracking.uri import is_loopback

PROBE_DIR = ".node-check"


def is_local_store(uri: str) -> bool:
    """A store that lives in a file of this machine (sqlite, a bare path), not behind a server."""
    return uri.startswith("sqlite:") or "://" not in uri


def store_plan(uri: str, driver: dict[str, Any], trainer0: dict[str, Any], server_host: str) -> str:
    """``direct`` (rank 0 writes the store itself) or ``serve`` (the driver serves it over HTTP); raises
    ``PlacementError`` with the settings that work when a loopback server could not reach rank 0.

    ``driver`` / ``trainer0``: ``{"node_id", "node_ip"}`` of the driver process and of trainer rank 0.
    """
    if not is_local_store(uri) or trainer0["node_id"] == driver["node_id"]:
        return "direct"
    if not is_loopback(server_host) or trainer0["node_ip"] == driver["node_ip"]:
        return "serve"
    raise PlacementError(
        f"the tracking store {uri} is a file on the driver's machine ({driver['node_ip']}) but trainer rank 0 "
        f"runs on node {trainer0['node_ip']} (node id {trainer0['node_id'][:12]}), and a tracking server on "
        f"tracking.server_host={server_host} is reachable from this machine only: rerun with "
        f"tracking.server_host={driver['node_ip']} (ulorl-train then serves the store there with basic auth; "
        f"the admin password comes from $ULORL_MLFLOW_PASSWORD or is generated), or with "
        f"--tracking-uri http://HOST:PORT of an MLflow server every node reaches")


@dataclass
class RunDirProbe:
    """A token file the driver writes into the run directory; every node must read it and answer."""

    run_dir: Path
    token: str
    path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.path = self.run_dir / PROBE_DIR / self.token

    @classmethod
    def create(cls, run_dir: Path) -> RunDirProbe:
        probe = cls(Path(run_dir), secrets.token_hex(8))
        probe.path.parent.mkdir(parents=True, exist_ok=True)
        probe.path.write_text(probe.token)
        return probe

    def check(self, answers: list[dict[str, Any]]) -> None:
        """Raise naming the first node that did not read the token, or whose answer the driver cannot see.

        ``answers``: ``sees_run_dir`` results, one per node (``node_id``, ``node_ip``, ``roles``, ``read``,
        ``reply``).
        """
        for a in answers:
            where = f"node {a['node_ip']} (node id {a['node_id'][:12]}; {', '.join(a['roles'])})"
            if not a["read"]:
                raise PlacementError(
                    f"{where} does not see the run directory {self.run_dir} ({a.get('error', 'token not found')}): "
                    f"every node writes checkpoints there; put --run-dir / train.output_dir on storage every "
                    f"node mounts (NFS, a bucket mount)")
            if not (self.path.parent / a["reply"]).is_file():
                raise PlacementError(
                    f"{where} wrote its answer into the run directory {self.run_dir} but this machine does not see "
                    f"it: the node has a different {self.run_dir}; put the run directory on storage every node "
                    f"mounts")

    def remove(self) -> None:
        shutil.rmtree(self.path.parent, ignore_errors=True)


def answer_probe(path: str, token: str, node: dict[str, Any], roles: list[str]) -> dict[str, Any]:
    """What a node answers (run on the node): did it read ``token`` at ``path``; it writes
    ``<token>.<node id>`` beside it for the driver to see."""
    p = Path(path)
    out: dict[str, Any] = {**node, "roles": roles, "read": False, "reply": f"{token}.{node['node_id']}"}
    try:
        out["read"] = p.read_text() == token
        if out["read"]:
            (p.parent / out["reply"]).write_text(token)
    except OSError as exc:
        out["error"] = f"{type(exc).__name__}: {exc.strerror or exc}"
    return out


def one_per_node(infos: list[dict[str, Any]], roles: list[str]) -> dict[str, tuple[int, list[str]]]:
    """node id -> (index of the first actor on it, the roles placed there), in placement order."""
    out: dict[str, tuple[int, list[str]]] = {}
    for i, (info, role) in enumerate(zip(infos, roles)):
        first, held = out.get(info["node_id"], (i, []))
        out[info["node_id"]] = (first, held + [role])
    return out


def served_params(plan: str, server_uri: Optional[str], auth: bool) -> dict[str, str]:
    """The ``placement.tracking*`` params of a run: how rank 0 reached the store."""
    if plan != "serve" or server_uri is None:
        return {"placement.tracking": "direct"}
    return {"placement.tracking": "server", "placement.tracking_server": server_uri,
            "placement.tracking_auth": "basic" if auth else "none"}
