"""A real MLflow sqlite store for report tests: a migrated empty DB to copy, and the store base."""

from __future__ import annotations

import shutil
from pathlib import Path

from mlflow.tracking import MlflowClient

from ulorl.tracking import artifact_root_for


def migrated_empty_db(folder: Path) -> Path:
    """A freshly migrated empty MLflow sqlite DB in ``folder`` (migrating takes seconds; copying it does not)."""
    db = folder / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


def store_uri_from_template(tmp_path: Path, template: Path) -> str:
    """Copy the migrated ``template`` DB to ``tmp_path/mlflow.db``; its sqlite tracking URI."""
    shutil.copy(template, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


class StoreBase:
    """A copy of the template DB in ``tmp_path`` with one experiment ``ulorl``, written with the real client."""

    def __init__(self, tmp_path: Path, template: Path) -> None:
        self.uri = store_uri_from_template(tmp_path, template)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.exp = self.client.create_experiment("ulorl", artifact_location=artifact_root_for(self.uri))
