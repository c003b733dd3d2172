"""Where runs are tracked: one rule for every command of the platform."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Optional

DEFAULT_DB_NAME = "mlflow.db"


def default_tracking_uri(cwd: Optional[str] = None) -> str:
    """``sqlite:///<absolute path of ./mlflow.db>``."""
    base = Path(cwd or os.getcwd()).resolve()
    return f"sqlite:///{base / DEFAULT_DB_NAME}"


def absolutize_uri(uri: str) -> str:
    """Make a relative ``sqlite:///rel.db`` or a bare path absolute (Ray trials change cwd)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rel = uri[len("sqlite:///"):]
        return f"sqlite:///{Path(rel).resolve()}"
    if "://" not in uri and not uri.startswith("sqlite:"):
        p = Path(uri)
        if p.suffix == ".db":
            return f"sqlite:///{p.resolve()}"
    return uri


def resolve_tracking_uri(explicit: Optional[str] = None, config_uri: Optional[str] = None) -> str:
    """Explicit ``--tracking-uri`` > config ``tracking.uri`` > ``$MLFLOW_TRACKING_URI`` > ./mlflow.db."""
    for candidate in (explicit, config_uri, os.environ.get("MLFLOW_TRACKING_URI")):
        if candidate:
            return absolutize_uri(candidate)
    return default_tracking_uri()


def artifact_root_for(uri: str) -> Optional[str]:
    """For a sqlite store, artifacts live beside the DB in ``<db stem>-artifacts/`` (never ./mlruns)."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        return (db.parent / f"{db.stem}-artifacts").as_uri()
    return None


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
