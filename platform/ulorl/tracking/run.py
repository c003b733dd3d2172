"""MLflow run lifecycle for training runs: create or resume, params, tags, batched metrics.

Metrics are buffered and written with one ``log_batch`` per flush. The trainer flushes right after
each checkpoint, so after a crash the store never holds points past the last checkpoint, and a
resumed run logs every later step exactly once (one point per step on every curve).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from ulorl.tracking import provenance
from ulorl.tracking.store import prepare_store
from ulorl.tracking.uri import artifact_root_for

MAX_BATCH = 900  # MLflow caps a log_batch at 1000 metrics


def get_or_create_experiment(client: MlflowClient, name: str, uri: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_root_for(uri))
    except Exception:  # created concurrently by another trial
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def hardware_tags() -> dict[str, str]:
    """``ulorl.hw.*`` and ``ulorl.version.*`` of this process (:func:`ulorl.tracking.provenance.machine_tags`)."""
    return provenance.machine_tags()


def git_commit() -> str:
    return provenance.git_state()[0]


class RunTracker:
    """One MLflow run. ``RunTracker.start(...)`` creates it; ``RunTracker.resume(...)`` reopens it."""

    def __init__(self, client: MlflowClient, run_id: str, enabled: bool = True) -> None:
        self.client = client
        self.run_id = run_id
        self.enabled = enabled
        self._buffer: list[Metric] = []
        self._stored: set[tuple[str, int]] = set()   # (key, step) already in the store: never logged again

    @classmethod
    def start(
        cls,
        uri: str,
        experiment: str,
        run_name: Optional[str],
        params: dict[str, Any],
        tags: dict[str, str],
        parent_run_id: Optional[str] = None,
        spec: Optional[str | os.PathLike[str]] = None,
    ) -> RunTracker:
        """A new run with ``params``, ``tags`` and the provenance tags (:mod:`ulorl.tracking.provenance`);
        ``spec``: the YAML it came from (else a child run takes its parent's)."""
        prepare_store(uri)
        client = MlflowClient(tracking_uri=uri)
        exp_id = get_or_create_experiment(client, experiment, uri)
        all_tags = {**provenance.start_tags(), **(provenance.spec_tags(spec) if spec is not None else {}), **tags}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
            # a sweep's trial comes from the sweep's spec: the parent run names it
            parent_tags = client.get_run(parent_run_id).data.tags
            all_tags.update({k: parent_tags[k] for k in provenance.INHERITED_TAGS
                             if k in parent_tags and k not in tags})
        run = client.create_run(exp_id, run_name=run_name, tags=all_tags)
        tracker = cls(client, run.info.run_id)
        tracker.log_params(params)
        return tracker

    @classmethod
    def resume(cls, uri: str, run_id: str) -> RunTracker:
        prepare_store(uri)
        client = MlflowClient(tracking_uri=uri)
        client.update_run(run_id, status="RUNNING")
        return cls(client, run_id)

    def log_params(self, params: dict[str, Any]) -> None:
        items = [Param(k, _param_str(v)) for k, v in params.items()]
        for i in range(0, len(items), 90):
            self.client.log_batch(self.run_id, params=items[i : i + 90])

    def set_tags(self, tags: dict[str, str]) -> None:
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def add_metrics(self, metrics: dict[str, float], step: int) -> None:
        ts = int(time.time() * 1000)
        for k, v in metrics.items():
            if v is None:
                continue
            self._buffer.append(Metric(k, float(v), ts, step))

    def flush(self) -> None:
        """Write buffered points, one ``log_batch`` (one store transaction) per step."""
        buf, self._buffer = self._buffer, []
        by_step: dict[int, list[Metric]] = {}
        for m in buf:
            if (m.key, m.step) not in self._stored:
                by_step.setdefault(m.step, []).append(m)
        for step in sorted(by_step):
            pts = by_step[step]
            for i in range(0, len(pts), MAX_BATCH):
                self.client.log_batch(self.run_id, metrics=pts[i : i + MAX_BATCH])

    def pending(self) -> list[list[Any]]:
        """Buffered points as JSON-able rows (saved in checkpoints: a kill between the checkpoint
        and the flush must not lose the checkpointed steps' metrics)."""
        return [[m.key, m.value, m.timestamp, m.step] for m in self._buffer]

    def restore_pending(self, rows: list[list[Any]]) -> None:
        """Re-buffer points saved in a checkpoint, except steps the store already holds."""
        by_step: dict[int, list[Metric]] = {}
        for key, value, ts, step in rows:
            by_step.setdefault(int(step), []).append(Metric(key, float(value), int(ts), int(step)))
        for step, pts in by_step.items():
            have = {m.step for m in self.client.get_metric_history(self.run_id, pts[0].key)}
            if step not in have:
                self._buffer.extend(pts)

    def skip_stored_points(self, after_step: int, probe_key: str) -> bool:
        """When the store holds ``probe_key`` (a metric of every step) past ``after_step`` (a run resumed
        from a checkpoint older than its last flush), remember every (key, step) it holds so that
        :meth:`flush` never logs one twice (one point per step on every curve, the first kept). True then."""
        if not any(m.step > after_step for m in self.client.get_metric_history(self.run_id, probe_key)):
            return False
        keys = self.client.get_run(self.run_id).data.metrics
        self._stored = {(k, m.step) for k in keys for m in self.client.get_metric_history(self.run_id, k)}
        return True

    def drop_buffer(self) -> None:
        self._buffer = []

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        self.client.log_text(self.run_id, json.dumps(obj, indent=2, default=str), artifact_file)

    def log_artifacts(self, local_dir: str | os.PathLike, artifact_path: str) -> None:
        self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)

    def end(self, status: str = "FINISHED") -> None:
        self.flush()
        self.set_tags({provenance.ENDED_TAG: provenance.utc_now()})
        self.client.set_terminated(self.run_id, status=status)


def _param_str(v: Any) -> str:
    s = json.dumps(v) if isinstance(v, (list, dict)) else str(v)
    return s[:6000]
