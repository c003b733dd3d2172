"""The one reader of per-problem scores in tracked runs: ``ulorl-tables`` (through
``ulorl.report.store.RunStore``), the sweep summary (``ulorl.sweep.summary``) and the dashboard's
Benchmarks page read a run's ``eval/<bench>_per_problem*.csv`` artifacts (names in
:mod:`ulorl.tracking.schema`) here.

    reader = PerProblemReader(MlflowClient(uri))
    reader.scores(run_id)                          # last periodic held-out eval: {problem_id: accuracy}
    reader.scores(run_id, "heldout_confirm", 150)  # the confirmation part at step 150 ({} when none)
    reader.scores(run_id, "aime2025", whole_run=True, strict=False)   # an eval run's CSV first; never raises
"""

from __future__ import annotations

import csv
import io
import tempfile
from pathlib import Path
from typing import Any, Optional

from ulorl.tracking import schema

EVAL_DIR = "eval"


def parse_per_problem_csv(text: str) -> dict[str, float]:
    """``problem_id -> accuracy`` (num_correct / k) from a per-problem eval CSV."""
    out: dict[str, float] = {}
    for row in csv.DictReader(io.StringIO(text)):
        k = float(row.get("k") or 0)
        if k > 0 and row.get("num_correct") not in (None, ""):
            out[str(row["problem_id"])] = float(row["num_correct"]) / k
        elif row.get("accuracy") not in (None, ""):
            out[str(row["problem_id"])] = float(row["accuracy"])
    return out


class PerProblemReader:
    """Per-problem scores of the runs of one MLflow store. Each run's ``eval/`` listing is read once
    per reader: keep a reader for a finished store (a report, a sweep's summary), make a new one to
    see files written since (the dashboard)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._files: dict[str, list[str]] = {}

    def files(self, run_id: str) -> list[str]:
        """Paths of the run's files under ``eval/``, sorted; [] when it has none or they cannot be listed."""
        if run_id not in self._files:
            try:
                infos = self.client.list_artifacts(run_id, EVAL_DIR)
            except Exception:  # noqa: BLE001 -- a run without artifacts has no per-problem scores
                infos = []
            self._files[run_id] = sorted(f.path for f in infos if not f.is_dir)
        return self._files[run_id]

    def periodic(self, run_id: str) -> list[tuple[str, int]]:
        """(bench, step) of every periodic ``eval/<bench>_per_problem_step_<N>.csv`` of the run."""
        return schema.per_problem_steps(self.files(run_id))

    def csv(self, run_id: str, bench: str, step: Optional[int] = None) -> str:
        """The raw CSV of the run's ``bench`` eval at ``step`` (None: an eval run's whole-run CSV);
        raises when the run has no such artifact."""
        return self._read(run_id, schema.per_problem_artifact(bench, step))

    def scores(self, run_id: str, bench: str = "heldout", step: Optional[int] = None, *,
               whole_run: bool = False, strict: bool = True) -> dict[str, float]:
        """``problem_id -> accuracy`` of the run's periodic ``bench`` eval at ``step`` (None: its last
        one); {} when the run has none there.

        ``whole_run``: an eval run's ``eval/<bench>_per_problem.csv`` comes first (with ``step`` None).
        ``strict=False``: a listed file that cannot be read gives {} instead of raising.
        """
        files = self.files(run_id)
        whole = schema.per_problem_artifact(bench)
        if step is not None:
            path = schema.per_problem_artifact(bench, step) if (bench, step) in self.periodic(run_id) else None
        elif whole_run and whole in files:
            path = whole
        else:
            path = schema.last_per_problem_artifact(files, bench)
        if path is None:
            return {}
        try:
            text = self._read(run_id, path)
        except Exception:  # noqa: BLE001 -- strict=False: an unreadable artifact reads as no scores
            if strict:
                raise
            return {}
        return parse_per_problem_csv(text) if text else {}

    def _read(self, run_id: str, path: str) -> str:
        with tempfile.TemporaryDirectory(prefix="ulorl-read-") as tmp:
            return Path(self.client.download_artifacts(run_id, path, tmp)).read_text(encoding="utf-8")
