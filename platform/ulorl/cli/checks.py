"""Checks the commands run on their arguments before any work: a tracking URI MLflow cannot open, a
resume command that keeps the run's own arguments.

    problem = tracking_uri_problem("ftp://host/x", source="--tracking-uri")   # str naming the fix, or None
    resume_command("ulorl-train", ["exp.yaml", "rollout.segments=8"], {"--resume": "runs/exp/1"})
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Optional

SUPPORTED_URIS = ("sqlite:///PATH/mlflow.db (a file), http(s)://HOST:PORT (a tracking server), "
                  "postgresql://, mysql:// or mssql:// (a database)")


def uri_source(explicit: Optional[str], config_uri: Optional[str] = None) -> str:
    """Where the tracking URI of a command came from, as a user would name it (``resolve_tracking_uri``'s
    order: the flag, the experiment's ``tracking.uri``, ``$MLFLOW_TRACKING_URI``)."""
    if explicit:
        return "--tracking-uri"
    if config_uri:
        return "tracking.uri"
    return "$MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the default tracking URI"


def tracking_uri_problem(uri: str, source: str = "--tracking-uri") -> Optional[str]:
    """Why MLflow cannot open ``uri`` as a tracking store (an unknown scheme such as ``ftp://``), naming
    ``source`` and the URIs it takes; None when MLflow has a store for it. Asked of MLflow's own store
    registry, so the answer is the one a run would meet, only before a model is loaded."""
    try:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry
    except ImportError:   # another MLflow layout: the run itself will say
        return None
    try:
        _tracking_store_registry.get_store_builder(uri)
    except MlflowException:
        scheme = uri.split("://", 1)[0] if "://" in uri else uri.split(":", 1)[0]
        return f"{source} {uri}: MLflow has no tracking store for the scheme {scheme!r}; use {SUPPORTED_URIS}"
    return None


def resume_command(program: str, positional: Sequence[str], flags: Mapping[str, Optional[str]]) -> str:
    """``program positional... --flag value ...`` quoted for a POSIX shell; a flag whose value is None
    is left out, one whose value is ``""`` is given alone. Pasted as printed, it runs the same run again
    (its overrides included), so a resume is not refused for a config that differs from the checkpoint's."""
    parts = [program, *positional]
    for flag, value in flags.items():
        if value is None:
            continue
        parts += [flag] if value == "" else [flag, value]
    return " ".join(shlex.quote(p) for p in parts)
