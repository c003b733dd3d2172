"""Read-only view of an MLflow store for reports: every active run with tags, params, latest
metrics, and metric histories on demand (cached).

    store = RunStore.open("sqlite:////abs/mlflow.db")
    for run in store.runs(kind="train", paper_ref="table1"): ...
    steps, values = store.history(run.run_id, "time/step_s")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from mlflow.entities import Experiment, ViewType
from mlflow.tracking import MlflowClient

from ulorl.tracking import schema


@dataclass(frozen=True)
class RunInfo:
    """One MLflow run as the reports see it (params and tags as strings, metrics = latest value)."""

    run_id: str
    experiment_id: str
    name: str
    status: str
    start_time: int
    tags: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    params: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    metrics: dict[str, float] = field(default_factory=dict, hash=False, compare=False)

    @property
    def kind(self) -> str:
        return self.tags.get(schema.KIND_TAG, "")

    @property
    def paper_ref(self) -> str:
        return self.tags.get(schema.PAPER_REF_TAG, "")

    @property
    def parent_id(self) -> str:
        return self.tags.get(schema.PARENT_TAG, "")

    def param(self, key: str, default: str = "") -> str:
        return self.params.get(key, default)

    def int_param(self, key: str) -> Optional[int]:
        try:
            return int(float(self.params[key]))
        except (KeyError, ValueError):
            return None

    def float_param(self, key: str) -> Optional[float]:
        try:
            return float(self.params[key])
        except (KeyError, ValueError):
            return None


class RunStore:
    """All active runs of all active experiments of one tracking URI, loaded once."""

    def __init__(self, client: MlflowClient, runs: list[RunInfo]) -> None:
        self.client = client
        self._runs = runs
        self._by_id = {r.run_id: r for r in runs}
        self._hist: dict[tuple[str, str], tuple[list[int], list[float]]] = {}

    @classmethod
    def open(cls, uri: str, experiment: Optional[str] = None) -> RunStore:
        client = MlflowClient(tracking_uri=uri)
        exps: list[Experiment] = list(client.search_experiments(view_type=ViewType.ACTIVE_ONLY))
        if experiment is not None:
            exps = [e for e in exps if e.name == experiment]
        runs: list[RunInfo] = []
        exp_ids = [e.experiment_id for e in exps]
        for i in range(0, len(exp_ids), 50):
            token = None
            while True:
                page = client.search_runs(
                    exp_ids[i : i + 50], run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token
                )
                for r in page:
                    runs.append(
                        RunInfo(
                            run_id=r.info.run_id,
                            experiment_id=r.info.experiment_id,
                            name=r.info.run_name or r.info.run_id[:8],
                            status=r.info.status,
                            start_time=r.info.start_time or 0,
                            tags=dict(r.data.tags),
                            params=dict(r.data.params),
                            metrics=dict(r.data.metrics),
                        )
                    )
                token = page.token
                if not token:
                    break
        runs.sort(key=lambda r: (r.start_time, r.run_id))
        return cls(client, runs)

    def runs(self, kind: Optional[str] = None, paper_ref: Optional[str] = None) -> list[RunInfo]:
        """Runs (oldest first) filtered by ``ulorl.kind`` and ``ulorl.paper_ref`` tags."""
        out = self._runs
        if kind is not None:
            out = [r for r in out if r.kind == kind]
        if paper_ref is not None:
            out = [r for r in out if r.paper_ref == paper_ref]
        return list(out)

    def get(self, run_id: str) -> Optional[RunInfo]:
        return self._by_id.get(run_id)

    def children(self, run_id: str, kind: Optional[str] = None) -> list[RunInfo]:
        return [r for r in self.runs(kind=kind) if r.parent_id == run_id]

    def history(self, run_id: str, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, sorted by step; the last logged value wins per step."""
        ck = (run_id, key)
        if ck not in self._hist:
            pts = sorted(self.client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
            by_step: dict[int, float] = {}
            for m in pts:
                by_step[int(m.step)] = float(m.value)
            steps = sorted(by_step)
            self._hist[ck] = (steps, [by_step[s] for s in steps])
        return self._hist[ck]
