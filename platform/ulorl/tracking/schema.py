"""Names written to MLflow. The dashboard, ``ulorl-tables`` and the sweeps read these.

Training runs (``ulorl-train``, one per trial in a sweep):
  tags    ulorl.kind=train, ulorl.experiment=<yaml stem>, ulorl.paper_ref (table1|table2|table3|fig2|
          fig4|fig5, when set), mlflow.parentRunId (sweep parent), ulorl.trial_id, ulorl.variant,
          ulorl.git_commit, ulorl.git_dirty, ulorl.spec, ulorl.spec_sha256, ulorl.started_at, ulorl.ended_at,
          ulorl.hw.* (cpu, cores, host, threads, blas, gpu), ulorl.version.* (torch, transformers, ulorl,
          python): the provenance of every run (ulorl.tracking.provenance; a sweep's child runs take
          ulorl.spec / ulorl.spec_sha256 from the parent run)
  params  the flattened experiment config (``rollout.segments``, ``algo.mpt.tau`` ...)
  metrics TRAIN_METRICS below, one point per step (step = training step, 1-based)
  artifacts config/resolved.yaml, samples/step_<NNNNNN>.jsonl (SAMPLE_RECORD_FIELDS),
          checkpoints/final/ (model + tokenizer, loadable with from_pretrained)

Eval runs (``ulorl-eval``; nested under a training run or standalone):
  tags    ulorl.kind=eval, ulorl.benchmark, ulorl.k, ulorl.model, ulorl.model_label,
          ulorl.reward_extraction (boxed | boxed_or_final; also the param reward.extraction)
  metrics eval/<bench>/avg_at_k, eval/<bench>/pass_at_k, eval/<bench>/pass_at_<j>, eval/<bench>/ci_low,
          eval/<bench>/ci_high, eval/<bench>/response_len_mean, eval/<bench>/truncation_rate
  artifacts eval/<bench>_per_problem.csv
  A training run's periodic evaluation logs eval/heldout/avg_at_k (and the others) into the training
  run itself, at the training step.

Sweep parent runs (``ulorl-sweep``): tags ulorl.kind=sweep, ulorl.sweep=<yaml stem>; artifacts
  sweep/spec.yaml, sweep/ranking.csv; params = the search space.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

KIND_TAG = "ulorl.kind"
EXPERIMENT_TAG = "ulorl.experiment"
PAPER_REF_TAG = "ulorl.paper_ref"
SWEEP_TAG = "ulorl.sweep"
TRIAL_TAG = "ulorl.trial_id"
VARIANT_TAG = "ulorl.variant"
# Role of a sweep trial: "search" (proposed by the searcher), "baseline" (the spec's baseline,
# outside the searcher) or "rerun" (a trial re-run on another seed). Only "search" trials enter
# importance statistics.
ROLE_TAG = "ulorl.trial_role"
ROLE_SEARCH, ROLE_BASELINE, ROLE_RERUN = "search", "baseline", "rerun"
ROLE_REFERENCE = "reference"   # a reference trial of another comparison (spec ``references``: the S = 1 of the speedup)
SEED_TAG = "ulorl.seed_offset"   # the config keys it shifts: SEED_KEYS (from RUN_KEYS below)
# A search trial stopped early by the sweep's scheduler (``ulorl.sweep.prune``): its child run is KILLED
# and tagged pruned=true, the rule (entropy_collapse | asha | hyperband | median) and the last step it ran.
PRUNED_TAG = "ulorl.pruned"
PRUNED_REASON_TAG = "ulorl.pruned_reason"
PRUNED_STEP_TAG = "ulorl.pruned_step"
PARENT_TAG = "mlflow.parentRunId"
RESUMED_TAG = "ulorl.resumed_at_step"   # set on a run resumed from a checkpoint: the step it resumed at
BENCHMARK_TAG = "ulorl.benchmark"
MODEL_TAG = "ulorl.model"
MODEL_LABEL_TAG = "ulorl.model_label"
# Final-answer extraction mode of the reward (boxed | boxed_or_final): the param of every training
# run (flattened config) and of every eval run, and a tag of eval runs. Results of different modes
# are not comparable; ulorl-tables keeps them apart.
EXTRACTION_PARAM = "reward.extraction"
EXTRACTION_TAG = "ulorl.reward_extraction"

TRAIN_METRICS: tuple[str, ...] = (
    "train/reward_mean", "train/entropy", "train/pg_loss", "train/clip_frac", "train/ratio_mean",
    "train/mpt_frac", "train/masked_frac", "train/mask_active_frac", "train/groups", "train/samples",
    "train/tokens", "train/grad_norm", "train/nonfinite_grad_steps", "train/entropy_control_frac",
)
# Optimizer steps of one update skipped because the global gradient norm was not finite (0 normally;
# a refused update logs it too, beside train/nonfinite). No rank applied such a step.
NONFINITE_GRAD_METRIC = "train/nonfinite_grad_steps"
ROLLOUT_METRICS: tuple[str, ...] = (
    "rollout/finished", "rollout/truncated", "rollout/response_len_mean", "rollout/response_len_max",
    "rollout/tokens", "rollout/tokens_per_s", "rollout/finished_per_s", "rollout/decode_utilization",
)
# Logged only at steps where some sample finished (EOS or truncated): mean reward of those samples,
# i.e. rollout accuracy, the learning-curve metric.
ROLLOUT_REWARD_METRIC = "rollout/reward_mean"
# Admission-cohort reward (``ulorl.train.cohorts``): mean reward (and response length) of all G x
# prompts samples admitted at step k, logged at step k once the last of them completed (up to S - 1
# steps later). Free of the finish-order bias of rollout/reward_mean under segment rollout.
COHORT_REWARD_METRIC = "rollout/cohort_reward_mean"
COHORT_LEN_METRIC = "rollout/cohort_response_len_mean"
POOL_METRICS: tuple[str, ...] = ("pool/unfinished", "pool/experience", "pool/staleness_max")
TIME_METRICS: tuple[str, ...] = ("time/rollout_s", "time/train_s", "time/step_s", "time/wall_s")
# The trainer process's CPU seconds (all threads) per step and per held-out evaluation, and the 1-minute
# load average at the step's end: the speed figure fair under changing load (ulorl.report.speed).
STEP_CPU_METRIC, EVAL_CPU_METRIC, LOAD_METRIC = "time/step_cpu_s", "time/eval_cpu_s", "sys/load1"
SKIPPED_METRIC = "train/skipped"
# Entropy-control comparators (algo.entropy_control): fraction of the step's response tokens the mode
# acted on (clip_cov: loss zeroed; kl_cov: KL-penalised; high_entropy_minority: low-entropy tokens
# left out of the loss); 0 with mode off. train/masked_frac stays the MPT / DMMPT mask alone.
ENTROPY_CONTROL_METRIC = "train/entropy_control_frac"

# Train / inference mismatch (ulorl.train.mismatch; platform/ulorl/docs/algorithm.md), at update steps
# whose released samples carry the engine's sampled-token log-probs (hf and vllm engines).
# delta = trainer log-prob - engine log-prob of the same token under the same weights (SAIS trainer
# log-probs at each segment's version; else the update's current-model pass on the tokens this version
# decoded); r = exp(delta). mismatch/<stat> over every measured token, mismatch/seg<k>/<stat> per
# segment index k (0-based), mismatch/pos<b>/<stat> per position bucket b (8 equal spans of
# rollout.max_response_len: 0-16k ... 112k-128k at 128k). Stats: tokens, abs_mean, abs_max, delta_mean,
# k3_kl (mean of r - 1 - delta: KL(engine || trainer)), ratio_out_frac (share of r outside [0.5, 2]);
# overall only: coverage (measured / response tokens of the batch), seq_logratio_mean /
# seq_logratio_min (per response, the sum of delta over its measured tokens). correction/<stat> (mode
# not off): rejected_frac, truncated_frac, weight_mean, weight_min, weight_max.
MISMATCH_PREFIX = "mismatch/"
CORRECTION_PREFIX = "correction/"
MISMATCH_STATS: tuple[str, ...] = ("tokens", "abs_mean", "abs_max", "delta_mean", "k3_kl", "ratio_out_frac")
MISMATCH_OVERALL: tuple[str, ...] = ("coverage", "seq_logratio_mean", "seq_logratio_min")
CORRECTION_STATS: tuple[str, ...] = ("rejected_frac", "truncated_frac", "weight_mean", "weight_min", "weight_max")


def mismatch_metric(stat: str, segment: int | None = None, bucket: int | None = None) -> str:
    """``mismatch_metric("abs_max", segment=1) -> "mismatch/seg1/abs_max"``; ``bucket=7``: ``mismatch/pos7/...``."""
    if segment is not None:
        return f"{MISMATCH_PREFIX}seg{segment}/{stat}"
    if bucket is not None:
        return f"{MISMATCH_PREFIX}pos{bucket}/{stat}"
    return MISMATCH_PREFIX + stat


# Mismatch metrics present at every update step of a run whose engine returns log-probs.
MISMATCH_METRICS: tuple[str, ...] = tuple(mismatch_metric(s) for s in MISMATCH_STATS + MISMATCH_OVERALL)


# Where the entropy goes (ulorl.algo.entropy_decomp, platform/ulorl/docs/entropy.md): the first-order change of the mean
# token entropy, split by token class = advantage sign x probability bucket of the sampled token at
# algo.mpt.tau (pos_high = the MPTs; mid: 0.5 <= p < tau; low: p < 0.5), the trained tokens per class,
# "masked" (the terms the loss mask removed), "total" (sum of the classes: the applied update),
# "mpt" (the MPT class, masked or not) and "mpt_share" (mpt / (total + masked); left out when that is 0).
# Every update step: two proxies from the no-grad pass, entropy/proxy/cov/* (Clip-Cov's batch-centred
# covariance, -(A - mean A)(lp - mean lp) / N per token) and entropy/proxy/state/* (centred per position,
# -A (lp + H) / N). Every train.entropy_probe_every steps (opt-in, tiny models): the exact form,
# entropy/exact/sgd/* (a plain gradient step at train.lr) and entropy/exact/adam/* (this AdamW step,
# preconditioner frozen), in nats of mean token entropy of the probe batch; entropy/exact/adam/carry
# (the momentum and weight-decay part of the step), entropy/exact/realized (the entropy change the
# update really made on the probe batch) and entropy/exact/probe_entropy (its entropy before).
ENTROPY_CLASSES: tuple[str, ...] = ("pos_high", "pos_mid", "pos_low", "neg_high", "neg_mid", "neg_low")
ENTROPY_PARTS: tuple[str, ...] = ENTROPY_CLASSES + ("masked", "total", "mpt")
ENTROPY_SHARE = "mpt_share"
ENTROPY_PROXY_PREFIXES: tuple[str, ...] = ("entropy/proxy/cov", "entropy/proxy/state")
ENTROPY_EXACT_PREFIXES: tuple[str, ...] = ("entropy/exact/sgd", "entropy/exact/adam")
ENTROPY_CARRY_METRIC = "entropy/exact/adam/carry"
ENTROPY_REALIZED_METRIC = "entropy/exact/realized"
ENTROPY_PROBE_ENTROPY_METRIC = "entropy/exact/probe_entropy"
# logged at every update step (mpt_share too, when defined)
ENTROPY_PROXY_METRICS: tuple[str, ...] = tuple(f"{p}/{k}" for p in ENTROPY_PROXY_PREFIXES for k in ENTROPY_PARTS)
# logged at probe steps only
ENTROPY_PROBE_METRICS: tuple[str, ...] = tuple(f"{p}/{k}" for p in ENTROPY_EXACT_PREFIXES for k in ENTROPY_PARTS) + (
    ENTROPY_CARRY_METRIC, ENTROPY_REALIZED_METRIC, ENTROPY_PROBE_ENTROPY_METRIC)

# Length audit (ulorl.train.length_audit), every step: for each fate, audit/<fate>/count (samples that
# met it this step; pool fates: samples there now), audit/<fate>/len_p50|len_p90|len_max (their
# response lengths, only when count > 0), audit/<fate>/token_share (cumulative tokens of the fate /
# the run's decoded response tokens; pool fates: tokens held now) and, for final and completion fates,
# audit/<fate>/total (cumulative count). Ledger: audit/started == sum of the final fates' totals +
# audit/unfinished/count + audit/waiting/count. audit/lost_resume/total must stay 0.
AUDIT_FINAL_FATES: tuple[str, ...] = ("trained", "filtered", "stale", "refused", "lost_resume")
AUDIT_COMPLETION_FATES: tuple[str, ...] = ("eos", "truncated", "clipped")
AUDIT_POOL_FATES: tuple[str, ...] = ("unfinished", "waiting")
AUDIT_STATS: tuple[str, ...] = ("count", "total", "len_p50", "len_p90", "len_max", "token_share")
AUDIT_STARTED = "audit/started"                     # cumulative samples admitted
AUDIT_PROMPTS_TOO_LONG = "audit/prompts_too_long"   # prompts dropped at load (cumulative; prompts, not samples)


def audit_metric(fate: str, stat: str) -> str:
    """``audit_metric("filtered", "len_p90") -> "audit/filtered/len_p90"``."""
    return f"audit/{fate}/{stat}"


# Length-audit metrics present at every step (the length quantiles only when the fate's count > 0).
AUDIT_METRICS: tuple[str, ...] = (AUDIT_STARTED, AUDIT_PROMPTS_TOO_LONG) + tuple(
    audit_metric(f, s) for f in AUDIT_FINAL_FATES + AUDIT_COMPLETION_FATES + AUDIT_POOL_FATES
    for s in ("count", "total", "token_share") if not (s == "total" and f in AUDIT_POOL_FATES))

# Metrics present at every step, whether or not the step updated the model.
EVERY_STEP_METRICS: tuple[str, ...] = ROLLOUT_METRICS + POOL_METRICS + TIME_METRICS + (SKIPPED_METRIC,) + AUDIT_METRICS
# Metrics present only at steps that updated the model (train/skipped == 0).
UPDATE_STEP_METRICS: tuple[str, ...] = TRAIN_METRICS + ENTROPY_PROXY_METRICS


@dataclass(frozen=True)
class RunKey:
    """A config key (a param of every training run) that the readers of tracked runs name."""

    key: str
    label: str = ""       # key param: its short column name in tables (the dashboard); "" = not a key param
    legend: int = 0       # > 0: may tell two runs of one paper figure apart in its legend, tried in ascending order
    seed: bool = False    # shifted by a sweep repeat's seed offset; the claims pair runs by these


RUN_KEYS: tuple[RunKey, ...] = (
    RunKey("rollout.segments", "segments", legend=6),
    RunKey("rollout.max_response_len", "max_len", legend=7),
    RunKey("rollout.batching", "batching", legend=8),
    RunKey("algo.mpt.tau", "tau", legend=4),
    RunKey("algo.mpt.sigma", "sigma", legend=5),
    RunKey("algo.mpt.mode", "mask_mode", legend=2),
    RunKey("algo.is_mode", "is_mode", legend=1),
    RunKey("algo.eps_high", legend=3),
    RunKey("model.name_or_path", legend=9),
    RunKey("data.seed", legend=12, seed=True),
    RunKey("rollout.seed", legend=11, seed=True),
    RunKey("train.seed", legend=10, seed=True),
)
# Key params, in the order of the dashboard's runs-table columns; a sweep's ranking keeps them per trial.
KEY_PARAMS: tuple[str, ...] = tuple(k.key for k in RUN_KEYS if k.label)
PARAM_LABELS: dict[str, str] = {k.key: k.label for k in RUN_KEYS if k.label}
# Params that may tell two runs of one figure apart (ulorl.report.figures), in the order they are tried.
DISTINGUISHING_KEYS: tuple[str, ...] = tuple(k.key for k in sorted(RUN_KEYS, key=lambda k: k.legend) if k.legend)
SEED_KEYS: tuple[str, ...] = tuple(k.key for k in RUN_KEYS if k.seed)

SAMPLE_RECORD_FIELDS: tuple[str, ...] = (
    "step", "sample_id", "group_id", "reward", "status", "prompt_text", "response_text",
    "tokens",            # list[str]: decoded text of each response token
    "segments",          # list[{start, end, version}] over response token positions
    "masked_positions",  # list[int]: response token positions excluded from the loss (MPT masking, a
                         # masking entropy control: algo.entropy_control clip_cov / high_entropy_minority, or
                         # a rollout correction's rejection: algo.rollout_correction token_mis / seq_mis / icepop)
)


def per_problem_artifact(bench: str, step: Optional[int] = None) -> str:
    """Artifact path of the per-problem CSV: ``eval/<bench>_per_problem.csv`` for an eval run;
    ``eval/<bench>_per_problem_step_<NNNNNN>.csv`` for a periodic eval inside a training run."""
    return f"eval/{bench}_per_problem.csv" if step is None else f"eval/{bench}_per_problem_step_{step:06d}.csv"


PER_PROBLEM_STEP_RE = re.compile(r"eval/(.+)_per_problem_step_(\d+)\.csv")


def per_problem_steps(paths: Iterable[str]) -> list[tuple[str, int]]:
    """(bench, step) of every periodic per-problem CSV among artifact ``paths``, in their order."""
    out = []
    for p in paths:
        m = PER_PROBLEM_STEP_RE.fullmatch(p)
        if m:
            out.append((m.group(1), int(m.group(2))))
    return out


def last_per_problem_artifact(paths: Iterable[str], bench: str) -> Optional[str]:
    """The artifact path of the last periodic per-problem CSV of ``bench`` among ``paths``; None when none."""
    steps = [st for b, st in per_problem_steps(paths) if b == bench]
    return per_problem_artifact(bench, max(steps)) if steps else None


# Params are logged as strings; the readers turn them back into numbers here.
def int_param(value: Any) -> Optional[int]:
    """A logged param as an int (``"4"``, ``"4.0"`` -> 4); None when absent or not a number."""
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def float_param(value: Any) -> Optional[float]:
    """A logged param as a float; None when absent or not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def typed_param(text: Any) -> Any:
    """A param as logged (a string) back to a number where it is one: ``"0.0931234" -> 0.0931234``."""
    if not isinstance(text, str):
        return text
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def eval_metric(bench: str, name: str) -> str:
    """``eval_metric("aime2025", "avg_at_k") -> "eval/aime2025/avg_at_k"``."""
    return f"eval/{bench}/{name}"
