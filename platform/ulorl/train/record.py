"""The run's record: its MLflow run, the metrics of each step, the admission cohorts, the length audit and
the logged samples.

The trainer's stages (rollout, update, weight push, evaluation) hand over what they produced; this module
decides what is kept about it and where it goes. ``RunRecord`` is the only holder of the run's tracker, so a
run without one (a worker rank, or rank 0 before :meth:`RunRecord.start`) keeps the same bookkeeping and
logs nothing. The metric names are ``ulorl.tracking.schema``'s.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ulorl.config import ExperimentConfig, config_to_yaml, flatten_config
from ulorl.rollout.scheduler import RolloutStepResult
from ulorl.rollout.types import Sample
from ulorl.tracking import schema
from ulorl.tracking.run import RunTracker
from ulorl.train.cohorts import CohortRewards
from ulorl.train.length_audit import LengthAudit

if TYPE_CHECKING:
    from ulorl.eval.runner import EvalResult
    from ulorl.rollout.pools import RolloutPools
    from ulorl.train.update import UpdateResult

__all__ = ["RUN_ID_FILE", "RunRecord", "load_metrics", "rollout_metrics", "sample_record", "update_metrics"]

log = logging.getLogger("ulorl.train")

RUN_ID_FILE = "mlflow_run_id"


def rollout_metrics(res: RolloutStepResult, seconds: float, prompts_dropped_too_long: int,
                    reward_stats: dict[str, int], judged: bool) -> dict[str, float]:
    """One rollout round's metrics: the scheduler's own (``res.metrics()``), its throughput over
    ``seconds``, the mean reward of the samples it completed, and the scorer's running counts
    (``reward_stats``; the judge's only when a generative verifier is ``judged``)."""
    m = res.metrics()
    m["rollout/prompts_dropped_too_long"] = float(prompts_dropped_too_long)
    rewards = [float(s.reward or 0.0) for s in res.completed]
    st = res.engine_stats
    useful = st.useful_tokens if st and st.useful_tokens else res.decoded_tokens
    slots = st.row_slots if st and st.row_slots else 0
    m.update(
        {
            "rollout/tokens_per_s": res.decoded_tokens / seconds if seconds > 0 else 0.0,
            "rollout/finished_per_s": (res.finished + res.truncated) / seconds if seconds > 0 else 0.0,
            "rollout/decode_utilization": useful / slots if slots else 1.0,
            "time/rollout_s": seconds,
        }
    )
    m.setdefault("rollout/response_len_mean", 0.0)
    m.setdefault("rollout/response_len_max", 0.0)
    if rewards:
        m["rollout/reward_mean"] = sum(rewards) / len(rewards)
    m["reward/timeouts"] = float(reward_stats.get("timeouts", 0))
    m["reward/no_answer"] = float(reward_stats.get("no_answer", 0))
    if judged:
        m["reward/judge_calls"] = float(reward_stats.get("judge_calls", 0))
        m["reward/judge_flips"] = float(reward_stats.get("judge_flips", 0))
    return m


def load_metrics() -> dict[str, float]:
    """``{"sys/load1": the 1-minute load average now}`` ({} where the OS has none): the load a step ran
    under, read beside its wall and CPU seconds (``ulorl.report.speed``)."""
    return {schema.LOAD_METRIC: os.getloadavg()[0]} if hasattr(os, "getloadavg") else {}


def update_metrics(update: Optional[UpdateResult], step: int, min_ready_groups: int) -> dict[str, float]:
    """What a step logs of its update: the update's own metrics when it changed the weights; otherwise why
    not (``train/step_skipped`` 1, the released reward, a non-finite gradient's count), logged at info
    level (a non-finite update also at warning level)."""
    if update is not None and update.updated:
        return {**update.metrics, schema.SKIPPED_METRIC: 0.0}
    reason = update.reason if update is not None else f"no complete group ready (need {min_ready_groups})"
    log.info("step %d: no update: %s", step, reason)
    m: dict[str, float] = {}
    if update is not None:
        m["train/reward_mean_released"] = update.metrics.get("train/reward_mean", 0.0)
        if "train/nonfinite" in update.metrics:
            m["train/nonfinite"] = 1.0
            m[schema.NONFINITE_GRAD_METRIC] = update.metrics.get(schema.NONFINITE_GRAD_METRIC, 0.0)
            log.warning("step %d: %s", step, reason)
    m[schema.SKIPPED_METRIC] = 1.0
    return m


def sample_record(step: int, s: Sample, tokenizer: Any, masked: list[int]) -> dict[str, Any]:
    """One logged sample (a line of ``samples/step_NNNNNN.jsonl``): its ids, reward, status, text and
    tokens, segments (with the policy version that decoded each) and ``masked``, the response positions
    the update's loss mask keeps."""
    return {
        "step": step,
        "sample_id": s.sample_id,
        "group_id": s.group_id,
        "reward": s.reward,
        "status": s.status.value,
        "prompt_text": s.prompt_text,
        "response_text": tokenizer.decode(s.response_ids, skip_special_tokens=False),
        "tokens": [tokenizer.decode([t], skip_special_tokens=False) for t in s.response_ids],
        "segments": [{"start": g.start, "end": g.end, "version": g.version} for g in s.segments],
        "masked_positions": masked,
        "answer": s.answer,
    }


class RunRecord:
    """Everything kept about one training run besides its weights: the MLflow run (``tracker``), the
    admission cohorts (``ulorl.train.cohorts``), the length audit (``ulorl.train.length_audit``), the
    per-problem evaluations and the logged samples. Checkpointed with ``state_dict``."""

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, tracking_uri: str) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.tracking_uri = tracking_uri
        self.tracker: Optional[RunTracker] = None
        self.run_id: Optional[str] = None
        self.cohorts = CohortRewards()
        self.audit = LengthAudit()
        self.pending_metrics: list[list[Any]] = []   # restored from a checkpoint, replayed by start()
        self._cohort_train_step: dict[int, int] = {}

    # ------------------------------------------------------------------ the MLflow run
    def start(self, step: int, parent_run_id: Optional[str], extra_tags: dict[str, str]) -> None:
        """Open the run's MLflow run: resume the one this run directory already has (a checkpoint's, or
        one restarted before its first checkpoint), else start a new one with the flattened config as
        params and the resolved YAML as an artifact."""
        cfg = self.cfg
        id_file = self.run_dir / RUN_ID_FILE
        if not self.run_id and id_file.is_file():
            # restarted before its first checkpoint: nothing was flushed, reuse the run (no duplicate)
            self.run_id = id_file.read_text().strip()
        if self.run_id:
            self.tracker = RunTracker.resume(self.tracking_uri, self.run_id)
            self.tracker.set_tags({schema.RESUMED_TAG: str(step)})
            # resumed from a checkpoint older than the run's last flush (an earlier one chosen past a damaged
            # one): the steps run again are already stored, and are not logged a second time
            self.tracker.skip_stored_points(after_step=step, probe_key=schema.SKIPPED_METRIC)
            self.tracker.restore_pending(self.pending_metrics)
            self.tracker.flush()
            return
        tags = {
            schema.KIND_TAG: "train",
            schema.EXPERIMENT_TAG: cfg.name,
            "ulorl.run_dir": str(self.run_dir),
            **cfg.tracking.tags,
            **extra_tags,
        }
        if cfg.tracking.paper_ref:
            tags[schema.PAPER_REF_TAG] = cfg.tracking.paper_ref
        self.tracker = RunTracker.start(
            self.tracking_uri,
            cfg.tracking.experiment,
            cfg.tracking.run_name or cfg.name,
            flatten_config(cfg),
            tags,
            parent_run_id=parent_run_id,
        )
        self.run_id = self.tracker.run_id
        self.run_dir.mkdir(parents=True, exist_ok=True)
        id_file.write_text(self.run_id + "\n")
        self.tracker.log_text(config_to_yaml(cfg), "config/resolved.yaml")

    def flush(self) -> None:
        """Send the buffered metrics (right after a checkpoint: the store never holds a point past it)."""
        if self.tracker is not None:
            self.tracker.flush()

    def failed(self) -> None:
        """The run raised: drop the points past the last checkpoint (a resume would log them twice) and
        mark the MLflow run FAILED."""
        if self.tracker is not None:
            self.tracker.drop_buffer()
            self.tracker.client.set_terminated(self.tracker.run_id, status="FAILED")

    def end(self, status: str, final_model: Optional[Path] = None) -> None:
        """Close the MLflow run with ``status``, logging ``final_model`` (a checkpoint's model folder) as
        ``checkpoints/final`` first when given."""
        if self.tracker is None:
            return
        if final_model is not None:
            self.tracker.log_artifacts(final_model, "checkpoints/final")
        self.tracker.end(status)

    # ------------------------------------------------------------------ what the stages produced
    def rolled_out(self, res: RolloutStepResult, step: int) -> None:
        """Count one rollout round in the length audit and the admission cohorts; a cohort whose last
        sample is settled is logged (``schema.COHORT_*_METRIC``) at the training step it was admitted in.
        Cohorts are keyed by the scheduler's step (``Sample.created_step``), unique per rollout round."""
        self.audit.rolled_out(res.admitted, res.completed, res.clipped_ids, res.dropped_samples)
        self.cohorts.admit(res.step, res.admitted)
        self._cohort_train_step[res.step] = step  # several rounds per step with dynamic_sampling_fill
        for s in res.completed:
            self.cohorts.complete(s.created_step, float(s.reward or 0.0), s.response_len)
        for s in res.dropped_samples:
            if s.finished_step is None:  # a member already done was counted when it completed
                self.cohorts.complete(s.created_step, None, 0)
        offset = step - res.step            # trainer steps count from 1, the scheduler's from 0
        for c in self.cohorts.pop_closed():
            if self.tracker is not None:
                self.tracker.add_metrics({schema.COHORT_REWARD_METRIC: c.reward_mean,
                                          schema.COHORT_LEN_METRIC: c.response_len_mean},
                                         self._cohort_train_step.pop(c.step, c.step + offset))

    def evaluated(self, parts: Sequence[EvalResult], step: int) -> dict[str, float]:
        """Log each evaluated part's per-problem scores (``schema.per_problem_artifact``) and return the
        parts' metrics, merged in order."""
        metrics: dict[str, float] = {}
        for part in parts:
            if self.tracker is not None:
                self.tracker.log_text(part.per_problem_csv(), schema.per_problem_artifact(part.bench, step))
            metrics.update(part.metrics())
        return metrics

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Log metrics outside a training step (the evaluation before the first one, at step 0)."""
        if self.tracker is not None:
            self.tracker.add_metrics(metrics, step)

    def step(self, step: int, metrics: dict[str, float], *, released: Sequence[Sample],
             update: Optional[UpdateResult], pools: RolloutPools, decoded_tokens_total: int,
             prompts_dropped_too_long: int, tokenizer: Any) -> dict[str, float]:
        """Close one training step: settle the ``released`` samples in the length audit, add the audit's
        step metrics to ``metrics`` (the stages' metrics, merged in stage order), log them at ``step`` and
        the step's samples, decoded with ``tokenizer`` (``tracking.samples_per_log`` every
        ``tracking.sample_every`` steps). Returns the step's whole metric set."""
        updated = update is not None and update.updated
        if released:
            self.audit.released(released, updated, self.cfg.algo.dynamic_sampling)
        metrics.update(self.audit.step_metrics(list(pools.unfinished), pools.experience.samples(),
                                               decoded_tokens_total, prompts_dropped_too_long))
        if self.tracker is not None:
            self.tracker.add_metrics(metrics, step)
            self._log_samples(step, update, tokenizer)
        return metrics

    def _log_samples(self, step: int, update: Optional[UpdateResult], tokenizer: Any) -> None:
        tc = self.cfg.tracking
        if self.tracker is None or update is None or not update.updated or tc.samples_per_log == 0 \
                or step % tc.sample_every or update.batch is None or update.loss_mask is None:
            return
        batch = update.batch
        lines = []
        for b, s in enumerate(update.kept_samples[: tc.samples_per_log]):
            p = batch.prompt_lens[b]
            masked_t = update.loss_mask[b].nonzero().flatten().tolist()
            masked = [t - (p - 1) for t in masked_t]
            lines.append(json.dumps(sample_record(step, s, tokenizer, masked)))
        self.tracker.log_text("\n".join(lines) + "\n", f"samples/step_{step:06d}.jsonl")

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The record's part of a checkpoint's trainer state (keys ``cohorts``, ``length_audit``,
        ``pending_metrics``: the metrics buffered since the last flush)."""
        return {
            "cohorts": self.cohorts.state_dict(),
            "length_audit": self.audit.state_dict(),
            "pending_metrics": self.tracker.pending() if self.tracker is not None else [],
        }

    def load_state_dict(self, state: dict[str, Any], in_pool: int) -> None:
        """Restore from a checkpoint's trainer state; ``in_pool``: the samples the restored rollout pools
        hold, which the length audit reconciles its ledger against."""
        self.run_id = state.get("run_id")
        self.cohorts.load_state_dict(state.get("cohorts", {}))
        if "length_audit" in state:
            self.audit.load_state_dict(state["length_audit"])
        else:  # a checkpoint from before the length audit: count from the samples in flight
            self.audit.admit(in_pool)
        self.audit.reconcile(in_pool)
        self.pending_metrics = state.get("pending_metrics", [])
