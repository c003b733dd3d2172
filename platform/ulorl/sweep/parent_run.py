"""A sweep's MLflow parent run: what it records when the sweep starts, how its trials' child runs are
marked when the scheduler prunes them or the sweep is stopped, and the summary it logs when the sweep ends.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from ulorl.sweep import prune
from ulorl.sweep.spec import SweepSpec
from ulorl.sweep.summary import summarize
from ulorl.sweep.summary_text import ranking_csv
from ulorl.tracking.run import RunTracker

ENDED = ("FINISHED", "FAILED", "KILLED")   # a child run in one of these is done (KILLED: pruned)


def parent_params(spec: SweepSpec, server: Optional[Any] = None) -> dict[str, Any]:
    """The params of a new parent run: the searched space, the fixed overrides and the sweep's settings;
    with the driver's tracking ``server`` (``ulorl.sweep.server.MlflowServer``) its URI and auth."""
    params: dict[str, Any] = {f"space.{k}": json.dumps(d.model_dump(exclude_none=True)) for k, d in spec.space.items()}
    params.update({f"fixed.{k}": v for k, v in spec.overrides.items()})
    params.update({"sweep.metric": spec.metric, "sweep.mode": spec.mode,
                   "sweep.num_samples": spec.num_samples, "sweep.search": spec.search.algorithm,
                   "sweep.max_concurrent": spec.max_concurrent,
                   "sweep.resources.cpu": spec.resources.cpu,
                   "sweep.resources.gpu": spec.resources.gpu,
                   "sweep.seed_offsets": ",".join(map(str, spec.offsets if spec.baseline is None
                                                      else spec.baseline_offsets))})
    if server is not None:
        params["sweep.tracking_server"] = server.uri
        params["sweep.tracking_auth"] = "basic" if server.auth else "none"
    return params


class SweepParentRun:
    """The parent run ``run_id`` of the sweep in ``sweep_dir``, on the store at ``tracking_uri`` (while
    the sweep runs, the driver's server in front of it)."""

    def __init__(self, tracking_uri: str, run_id: str, sweep_dir: Path) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri)
        self.run_id = run_id
        self.sweep_dir = sweep_dir

    def children(self) -> list[Any]:
        """The child runs (the trials), as MLflow ``Run`` objects."""
        exp = self.client.get_run(self.run_id).info.experiment_id
        return list(self.client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{self.run_id}'"))

    def trials_done(self) -> int:
        return sum(k.info.status in ENDED for k in self.children())

    def mark_pruned(self) -> None:
        """The child runs of the trials the scheduler pruned: KILLED, tagged with the rule and step."""
        prune.mark_pruned_runs(self.client, self.run_id, prune.read_pruned(self.sweep_dir))

    def mark_killed(self) -> None:
        """A stopped sweep: the pruned trials marked, every child run still RUNNING and the parent KILLED."""
        self.mark_pruned()
        for child in self.children():
            if child.info.status == "RUNNING":
                self.client.set_terminated(child.info.run_id, status="KILLED")
        self.client.set_terminated(self.run_id, status="KILLED")

    def mark_failed(self) -> None:
        """The sweep cannot go on (a ``--resume`` may continue it)."""
        self.client.set_terminated(self.run_id, status="FAILED")

    def summary(self, spec: SweepSpec, base: dict[str, Any], base_path: Path) -> dict[str, Any]:
        """:func:`ulorl.sweep.summary.summarize` of the child runs; nothing is logged."""
        return summarize(self.client, self.run_id, spec, base, base_path)

    def finish(self, spec: SweepSpec, base: dict[str, Any], base_path: Path) -> dict[str, Any]:
        """Log the summary (ranking CSV, best trial, speedups; each metric once, so a summary cut short and
        done again on ``--resume`` logs nothing twice), end the run FINISHED; the summary."""
        self.mark_pruned()
        summary = self.summary(spec, base, base_path)
        tracker = RunTracker(self.client, self.run_id)
        tracker.log_text(ranking_csv(summary["ranking"]), "sweep/ranking.csv")
        best = summary["best"]
        metrics: dict[str, float] = {"sweep/trials": len(summary["ranking"])}
        if best is not None:
            tracker.log_dict({**best, "command": summary["command"], "verdict": summary["verdict"],
                              "speedup": summary.get("speedup")}, "sweep/best.json")
            tracker.set_tags({"ulorl.best_run_id": best["run_id"]})
            if best.get("objective") is not None:
                metrics[f"best/{spec.metrics[0]}"] = best["objective"]
        for sp in summary.get("speedup") or []:
            metrics[f"sweep/speedup_s{sp['segments']}_time_per_step"] = sp["step_speedup"]
            metrics[f"sweep/speedup_s{sp['segments']}_trained_per_s"] = sp["throughput_x"]
            if sp.get("cpu_step_speedup") is not None and math.isfinite(sp["cpu_step_speedup"]):
                metrics[f"sweep/speedup_s{sp['segments']}_cpu_per_step"] = sp["cpu_step_speedup"]
        logged = self.client.get_run(self.run_id).data.metrics
        tracker.add_metrics({k: v for k, v in metrics.items() if k not in logged}, step=0)
        tracker.end("FINISHED")
        return summary
