"""Library output that changes nothing for the user, silenced once, in one place.

Every command calls :func:`quiet_libraries` first, and so does each sweep trial (a Ray worker
process with its own interpreter). Only output with no information for a ulorl user is listed
here; everything else (our warnings, real library errors) still reaches the console or the log.
"""

from __future__ import annotations

import logging
import os
import warnings

# Environment switches, set only when the user has not set them.
ENV_DEFAULTS: dict[str, str] = {
    # a progress bar per downloaded artifact (the sweep summary reads one CSV per trial)
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    # "View run ... at http://127.0.0.1:PORT": links to a sweep's tracking server, which stops with the sweep
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
    # short trials checkpoint every few steps on purpose; Tune warns that its snapshots come often
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
}

# Warning messages (regular expressions matched at the start) that carry nothing to act on.
WARNING_MESSAGES: tuple[str, ...] = (
    r"The ``noload`` loader strategy is deprecated",   # MLflow's SQLAlchemy store, every store open
)

# Loggers whose INFO lines only narrate set-up (a new SQLite store's schema migrations).
QUIET_LOGGERS: tuple[str, ...] = ("mlflow.store.db.utils", "alembic.runtime.migration")


def quiet_libraries() -> None:
    """Apply :data:`ENV_DEFAULTS`, :data:`WARNING_MESSAGES` and :data:`QUIET_LOGGERS` (idempotent)."""
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    for message in WARNING_MESSAGES:
        warnings.filterwarnings("ignore", message=message)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
