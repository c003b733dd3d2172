"""Tracking credentials between processes, outside every log.

MLflow clients read ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` from their process
environment. A sweep's driver hands them to its trials through Ray's object store
(``tune.with_parameters``) and a placed trial hands them to its trainer rank 0 in the actor call; never
through a Ray runtime environment, whose environment variables Ray's runtime-env agent writes in plain
text to ``<ray temp>/session_*/logs/runtime_env_agent.log`` (readable by every user of the machine).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

CREDENTIAL_VARS: tuple[str, ...] = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def current_credentials() -> dict[str, str]:
    """The tracking credentials of this process's environment (empty when none are set)."""
    return {k: os.environ[k] for k in CREDENTIAL_VARS if os.environ.get(k)}


def install_credentials(credentials: Mapping[str, str]) -> None:
    """Put handed-over credentials into this process's environment, where MLflow clients read them.
    Only the credential variables are taken; anything else in ``credentials`` is ignored."""
    os.environ.update({k: v for k, v in credentials.items() if k in CREDENTIAL_VARS and v})
