"""Read-only views of tracked runs for reports: every run with tags, params, latest metrics,
metric histories and the per-problem scores of its periodic held-out evals.

:class:`RunSource` is the one interface the reports read through; :class:`RunStore` reads an
MLflow store (histories on demand, cached; per-problem CSVs through
``ulorl.tracking.read.PerProblemReader``), ``ulorl.report.results.ResultsStore``
the committed results files that an export of such a store leaves.

    store = RunStore.open("sqlite:////abs/mlflow.db")
    for run in store.runs(kind="train", paper_ref="table1"): ...
    steps, values = store.history(run.run_id, "time/step_s")
    scores = store.per_problem(run.run_id, step=150)          # {problem_id: accuracy}
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Optional

from mlflow.entities import Experiment, ViewType
from mlflow.tracking import MlflowClient

from ulorl.tracking import schema
from ulorl.tracking.read import PerProblemReader


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
        return schema.int_param(self.params.get(key))

    def float_param(self, key: str) -> Optional[float]:
        return schema.float_param(self.params.get(key))


class RunSource(ABC):
    """What the reports read: runs (oldest first), metric histories and per-problem scores.
    Subclasses (an MLflow store, the committed results files) implement the four abstract readers."""

    def __init__(self, runs: list[RunInfo]) -> None:
        self._runs = sorted(runs, key=lambda r: (r.start_time, r.run_id))
        self._by_id = {r.run_id: r for r in self._runs}

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

    @abstractmethod
    def history(self, run_id: str, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, sorted by step; ([], []) when the run has none."""

    @abstractmethod
    def per_problem_benches(self, run_id: str) -> list[str]:
        """Benchmarks (``heldout``, ``heldout_select``, ...) of the run's periodic per-problem scores."""

    @abstractmethod
    def per_problem_steps(self, run_id: str, bench: str = "heldout") -> list[int]:
        """Steps of the run's periodic ``bench`` evals that left per-problem scores, ascending."""

    @abstractmethod
    def per_problem(self, run_id: str, step: Optional[int] = None, bench: str = "heldout") -> dict[str, float]:
        """``problem_id -> accuracy`` of the run's periodic ``bench`` eval at ``step`` (None: the
        last one); {} when there is none."""

    def _eval_step(self, run_id: str, step: Optional[int], bench: str) -> Optional[int]:
        """``step`` if the run has ``bench`` per-problem scores there (None: its last such step); else None."""
        steps = self.per_problem_steps(run_id, bench)
        if step is None:
            return steps[-1] if steps else None
        return step if step in steps else None


class RunStore(RunSource):
    """All active runs of all active experiments of one tracking URI, loaded once."""

    def __init__(self, client: MlflowClient, runs: list[RunInfo]) -> None:
        super().__init__(runs)
        self.client = client
        self.reader = PerProblemReader(client)   # per-problem CSVs, each run's eval/ listing read once
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
        return cls(client, runs)

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

    def per_problem_benches(self, run_id: str) -> list[str]:
        return sorted({b for b, _ in self.reader.periodic(run_id)})

    def per_problem_steps(self, run_id: str, bench: str = "heldout") -> list[int]:
        return sorted(st for b, st in self.reader.periodic(run_id) if b == bench)

    def per_problem_csv(self, run_id: str, step: int, bench: str = "heldout") -> str:
        """The raw per-problem CSV of the run's ``bench`` eval at ``step``."""
        return self.reader.csv(run_id, bench, step)

    def per_problem(self, run_id: str, step: Optional[int] = None, bench: str = "heldout") -> dict[str, float]:
        return self.reader.scores(run_id, bench, step)
