"""Opening a SQLite tracking store for writing: clear refusals, and its tables created once.

    require_store_folder(uri)     # the folder exists and the folder and DB file are writable, else a clear error
    prepare_store(uri)            # that, then MLflow's tables created under a lock (first use of a new store)

MLflow creates a new store's tables (and runs its schema migrations) in every process that opens it;
processes that start together on a new store race (``duplicate column name: step``, ``table
_alembic_tmp_metrics already exists``) and lose runs. ``prepare_store`` holds an exclusive ``flock``
on the store's folder while one MLflow client opens it, so the first process creates the tables and
the others find them; MLflow caches that store for the process, so the later clients reuse it.
Anything but a ``sqlite:`` URI is left to its server.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Optional

SQLITE_PREFIX = "sqlite:///"


class TrackingStoreError(ValueError):
    """A tracking store cannot be written; the message names the URI, the path and the fix."""


def _unwritable(path: Path) -> Optional[str]:
    """Why ``path`` cannot be written (None when it can)."""
    if os.access(path, os.W_OK):
        return None
    try:
        read_only_fs = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        read_only_fs = False
    return "is on a read-only file system" if read_only_fs else "is not writable by this user"


def require_store_folder(uri: str) -> None:
    """Refuse a ``sqlite:`` store that cannot be written, naming the path: a folder that does not exist
    (a typo more often than a wish; MLflow would create it silently), or a folder or DB file that is
    read-only (MLflow would retry for minutes, then fail with ``unable to open database file``)."""
    if not uri.startswith(SQLITE_PREFIX):
        return
    db = Path(uri[len(SQLITE_PREFIX):])
    folder = db.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"tracking URI {uri}: folder {folder} does not exist; create it "
                                "(mkdir -p) or give another --tracking-uri")
    for path, what in ((folder, "folder"), (db, "store file")):
        if path.exists():
            why = _unwritable(path)
            if why:  # SQLite writes its journal beside the DB: the folder must be writable too
                raise TrackingStoreError(
                    f"tracking URI {uri}: the {what} {path} {why}, so no run can be recorded; make it writable "
                    f"(chmod u+w {path}, or remount it read-write) or give another --tracking-uri")


def prepare_store(uri: str) -> None:
    """Check a ``sqlite:`` store (:func:`require_store_folder`) and create its MLflow tables once, under an
    exclusive lock on its folder, so that processes starting together on a new store all succeed."""
    if not uri.startswith(SQLITE_PREFIX):
        return
    require_store_folder(uri)
    from mlflow.tracking import MlflowClient

    fd = os.open(Path(uri[len(SQLITE_PREFIX):]).parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        MlflowClient(tracking_uri=uri)  # opens the store: creates or migrates its tables; cached per process
    finally:
        os.close(fd)  # releases the lock
