"""Pruning of sweep search trials: Tune's schedulers on the held-out objective plus an entropy-collapse rule.

* The rules. ``median`` (Tune's ``MedianStoppingRule``), ``asha`` and ``hyperband`` (Tune's
  ``ASHAScheduler``; hyperband is its asynchronous multi-bracket form: synchronous HyperBand pauses
  trials, which a trainer run does not survive cheaply) judge the objective, and see a trial's result
  only at steps where the objective was freshly evaluated (:data:`FRESH_KEY`: between evals the trial
  reports the last value again, which would count one eval many times). ``time_attr`` is the training
  step, so ``grace_period`` is in steps. The entropy rule (:func:`entropy_collapse_step`) reads
  ``train/entropy`` at every step.
* The record. A decision is written to ``<sweep dir>/pruned.json`` (trial id -> reason, step) by the
  driver before Tune stops the trial; the driver then marks the trial's MLflow child run
  (:func:`mark_pruned_runs`: status KILLED, tags ``ulorl.pruned*``). ``--resume`` restores Tune's
  state, where a pruned trial is TERMINATED; a pruned trial that reports again anyway is stopped again.
* A pruning decision at or after the trial's last step is dropped: the trial finishes by itself.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Optional

from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule, TrialScheduler

from ulorl.tracking import schema

PRUNED_FILE = "pruned.json"
FRESH_KEY = "objective_fresh"   # 1.0 in a trial's result when the objective was evaluated at that step
ENTROPY_METRIC = "train/entropy"
ENTROPY_REASON = "entropy_collapse"
STEP_KEY = "step"
EVAL_TIME_METRIC = "time/eval_s"   # in a trainer step's metrics only at steps that ran the periodic eval


def objective_fresh(metric: str, step_metrics: Mapping[str, float]) -> bool:
    """Was ``metric`` measured at this step? A trainer step carries the last eval's ``eval/*`` metrics at
    every step, so an ``eval/`` metric is fresh only where the step ran the eval (``time/eval_s``)."""
    if metric.startswith("eval/"):
        return EVAL_TIME_METRIC in step_metrics and metric in step_metrics
    return metric in step_metrics


# --------------------------------------------------------------------------- the entropy rule (pure)
def collapse_count(count: int, entropy: Optional[float], below: float) -> int:
    """Consecutive steps with entropy < ``below`` after one more step: +1 below, 0 at or above; a step
    without a finite entropy (an update that was skipped) leaves the count as it is."""
    if entropy is None or not math.isfinite(entropy):
        return count
    return count + 1 if entropy < below else 0


def entropy_collapse_step(history: Iterable[tuple[int, Optional[float]]], below: float, steps: int) -> Optional[int]:
    """The step at which a trial is pruned for entropy collapse: the first step that ends ``steps``
    consecutive steps with ``train/entropy`` < ``below``; None if it never does. ``history``: (step,
    entropy) in step order."""
    count = 0
    for step, entropy in history:
        count = collapse_count(count, entropy, below)
        if count >= steps:
            return step
    return None


# --------------------------------------------------------------------------- records
def read_pruned(sweep_dir: str | Path) -> dict[str, dict[str, Any]]:
    """trial id -> {"reason", "step"} of the sweep's pruned trials (empty when none was)."""
    path = Path(sweep_dir) / PRUNED_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def record_pruned(sweep_dir: str | Path, trial_id: str, reason: str, step: int) -> None:
    records = read_pruned(sweep_dir)
    records[trial_id] = {"reason": reason, "step": int(step)}
    path = Path(sweep_dir) / PRUNED_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(records, indent=1, sort_keys=True))
    tmp.replace(path)


def pruned_tags(reason: str, step: int) -> dict[str, str]:
    return {schema.PRUNED_TAG: "true", schema.PRUNED_REASON_TAG: reason, schema.PRUNED_STEP_TAG: str(int(step))}


def mark_pruned_runs(client: Any, parent_run_id: str, records: dict[str, dict[str, Any]]) -> int:
    """Tag the child runs of the pruned trials and end them KILLED; the number of runs changed."""
    if not records:
        return 0
    exp = client.get_run(parent_run_id).info.experiment_id
    changed = 0
    for run in client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
                                  max_results=1000):
        rec = records.get(run.data.tags.get(schema.TRIAL_TAG, ""))
        if rec is None or run.data.tags.get(schema.ROLE_TAG, schema.ROLE_SEARCH) != schema.ROLE_SEARCH:
            continue
        if run.data.tags.get(schema.PRUNED_TAG) == "true" and run.info.status == "KILLED":
            continue
        for k, v in pruned_tags(rec["reason"], rec["step"]).items():
            client.set_tag(run.info.run_id, k, v)
        client.set_terminated(run.info.run_id, status="KILLED")
        changed += 1
    return changed


# --------------------------------------------------------------------------- the Tune scheduler
def objective_scheduler(kind: str, *, max_steps: int, grace_period: int, reduction_factor: float,
                        brackets: int, min_samples: int) -> Optional[TrialScheduler]:
    """Tune's scheduler for ``kind`` with the step as its time (None for ``none``). No rule may stop a
    trial at its last step (``stop_last_trials=False``; :class:`PruningScheduler` also drops such a
    decision), nor pause one (the median rule would pause a trial while others wait without enough
    samples: ``min_time_slice`` past the last step)."""
    if kind == "none":
        return None
    if kind == "median":
        return MedianStoppingRule(time_attr=STEP_KEY, grace_period=grace_period, min_samples_required=min_samples,
                                  min_time_slice=max_steps + 1, hard_stop=True)
    return ASHAScheduler(time_attr=STEP_KEY, max_t=max_steps, grace_period=grace_period,
                         reduction_factor=reduction_factor, brackets=brackets if kind == "hyperband" else 1,
                         stop_last_trials=False)


class PruningScheduler(FIFOScheduler):
    """FIFO order; STOP for a trial whose entropy collapsed or that ``inner`` stops on the objective.

    Decisions are recorded (:func:`record_pruned`) under ``sweep_dir`` before they are returned."""

    def __init__(self, sweep_dir: str, max_steps: int, *, inner: Optional[TrialScheduler] = None,
                 inner_reason: str = "", entropy_below: Optional[float] = None, entropy_steps: int = 1) -> None:
        super().__init__()
        self.sweep_dir = sweep_dir
        self.max_steps = int(max_steps)
        self.inner = inner
        self.inner_reason = inner_reason
        self.entropy_below = entropy_below
        self.entropy_steps = int(entropy_steps)
        self._counts: dict[str, int] = {}
        # read once (a resumed sweep's earlier decisions), kept in step with record_pruned: no file read per result
        self._pruned: set[str] = set(read_pruned(sweep_dir))

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], **spec: Any) -> bool:
        ok = super().set_search_properties(metric, mode, **spec)
        if self.inner is not None:
            ok = self.inner.set_search_properties(metric, mode, **spec) and ok
        return ok

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        if self.inner is not None:
            self.inner.on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        if self.inner is not None:
            self.inner.on_trial_error(tune_controller, trial)

    def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
        if self.inner is not None:
            self.inner.on_trial_remove(tune_controller, trial)

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        if self.inner is None:
            return
        value = result.get(self.metric) if self.metric else None
        if isinstance(value, (int, float)) and math.isfinite(value) and STEP_KEY in result:
            self.inner.on_trial_complete(tune_controller, trial, result)
        else:   # no evaluated objective: the inner rule forgets the trial
            self.inner.on_trial_remove(tune_controller, trial)

    def _prune(self, trial_id: str, reason: str, step: int) -> str:
        record_pruned(self.sweep_dir, trial_id, reason, step)
        self._pruned.add(trial_id)
        return TrialScheduler.STOP

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        tid = str(trial.trial_id)
        if tid in self._pruned:   # a pruned trial restarted (resume): stop it again
            return TrialScheduler.STOP
        step = int(result.get(STEP_KEY, 0))
        last = step >= self.max_steps
        if self.entropy_below is not None:
            ent = result.get(ENTROPY_METRIC)
            self._counts[tid] = collapse_count(self._counts.get(tid, 0), float(ent) if ent is not None else None,
                                               self.entropy_below)
            if self._counts[tid] >= self.entropy_steps and not last:
                return self._prune(tid, ENTROPY_REASON, step)
        if self.inner is None or not result.get(FRESH_KEY):
            return TrialScheduler.CONTINUE
        value = result.get(self.metric) if self.metric else None
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return TrialScheduler.CONTINUE
        decision = self.inner.on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.STOP:
            return TrialScheduler.CONTINUE if last else self._prune(tid, self.inner_reason, step)
        return TrialScheduler.CONTINUE   # never PAUSE: a paused trainer run would restart from its checkpoint

    def debug_string(self) -> str:
        inner = self.inner.debug_string() if self.inner is not None else "no objective rule"
        return f"PruningScheduler(entropy_below={self.entropy_below}, steps={self.entropy_steps}); {inner}"


def build_scheduler(cfg: Any, sweep_dir: str | Path, max_steps: int) -> PruningScheduler:
    """The sweep's scheduler from its ``scheduler:`` section (``ulorl.sweep.spec.SchedulerConfig``)."""
    inner = objective_scheduler(cfg.type, max_steps=max_steps, grace_period=cfg.grace_period,
                                reduction_factor=cfg.reduction_factor, brackets=cfg.brackets,
                                min_samples=cfg.min_samples)
    return PruningScheduler(str(sweep_dir), max_steps, inner=inner, inner_reason=cfg.type,
                            entropy_below=cfg.entropy_below, entropy_steps=cfg.entropy_steps)
