"""A sweep's result as a researcher can judge it: every trial against the baseline, paired on the
same held-out problems, with bootstrap intervals, a second-seed check and a one-line verdict.

Pure statistics over :class:`Trial` records (per-problem scores of each trial's last periodic
evaluation, ``eval/<bench>_per_problem_step_<N>.csv``). Reading them from MLflow and assembling the
summary: :mod:`ulorl.sweep.summary`; the printed summary and ``sweep/ranking.csv``:
:mod:`ulorl.sweep.summary_text`; the command that re-runs a trial: :mod:`ulorl.sweep.command`.

Paired bootstrap: for trial A and baseline B evaluated on the same P problems with per-problem
accuracies a[P], b[P] (correct / k), the difference is mean(a - b) and its interval the percentile
bootstrap of mean((a - b)[idx]) over problems resampled with replacement. Pairing removes the
between-problem variance that two separate intervals would count twice; it does not see the
training-seed variance, which is why the baseline and the best trial are also re-run on more seeds.
The verdict (:func:`verdict`) judges the best configuration on its re-run seeds only, on problems
the search never saw: the final evaluation's (``eval.final``) or, with ``eval.select_problems``, the
confirmation part (the search optimises the selection part, ``eval/heldout_select/avg_at_k``); with
neither it refuses. The same rule as the claims (``ulorl.eval.paired``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from ulorl.eval.metrics import bootstrap_ci
from ulorl.eval.paired import (
    ARMS_IDENTICAL,
    FEW_SEEDS,
    HOLDS,
    NOT_HOLD,
    REFUSED,
    judge,
    paired_bootstrap,
    pooled_problem_differences,
    seed_interval_usable,
    t_interval,
)
from ulorl.tracking.schema import ROLE_BASELINE, ROLE_REFERENCE, ROLE_RERUN, ROLE_SEARCH

__all__ = ["ALPHA", "ARMS_IDENTICAL", "N_BOOT", "PRUNED", "RANKING_COLUMNS", "ROLE_BASELINE", "ROLE_REFERENCE",
           "ROLE_RERUN", "ROLE_SEARCH", "Trial", "Verdict", "arms_identical", "baseline_for", "best_index",
           "common_scores", "finite_objective", "paired_bootstrap", "ranking_rows", "score_interval", "verdict"]

N_BOOT = 2000
ALPHA = 0.05
PRUNED = "PRUNED"   # status of a search trial the sweep's scheduler stopped early (``ulorl.sweep.prune``)
# Columns of sweep/ranking.csv (before the key params of the trials).
RANKING_COLUMNS: tuple[str, ...] = (
    "rank", "run_id", "run_name", "trial_id", "role", "seed_offset", "variant", "status", "pruned_reason",
    "pruned_step", "steps", "objective",
    "heldout_problems", "heldout_avg", "heldout_ci_low", "heldout_ci_high",
    "diff_vs_baseline", "diff_ci_low", "diff_ci_high", "baseline_run_id",
)


def common_scores(a: dict[str, float], b: dict[str, float]) -> tuple[list[float], list[float]]:
    """Scores of the problems both have, in sorted problem-id order."""
    ids = sorted(set(a) & set(b))
    return [a[i] for i in ids], [b[i] for i in ids]


@dataclass
class Trial:
    """One child run of a sweep as the ranking sees it."""

    run_id: str
    run_name: str
    trial_id: str
    role: str
    seed_offset: int
    status: str
    objective: Optional[float]
    steps: Optional[float]
    params: dict[str, Any] = field(default_factory=dict)      # key params as logged (strings)
    searched: dict[str, Any] = field(default_factory=dict)    # the searched keys' values
    scores: dict[str, float] = field(default_factory=dict)    # problem_id -> accuracy, last eval
    variant: str = ""
    confirm: dict[str, float] = field(default_factory=dict)   # the confirmation part's scores, last eval
    final: dict[str, float] = field(default_factory=dict)     # the final evaluation's scores (eval.final)
    pruned_reason: str = ""            # status PRUNED: the rule that stopped it
    pruned_step: Optional[int] = None  # status PRUNED: the last step it ran


def score_interval(scores: dict[str, float]) -> tuple[Optional[float], Optional[float], Optional[float]]:
    """(mean, ci_low, ci_high) over problems; Nones without scores."""
    if not scores:
        return None, None, None
    vals = np.array(list(scores.values()), dtype=np.float64)
    lo, hi = bootstrap_ci(vals, n_boot=N_BOOT, alpha=ALPHA, seed=0)
    return float(vals.mean()), lo, hi


def baseline_for(trial: Trial, trials: Sequence[Trial]) -> Optional[Trial]:
    """The baseline run with the trial's seed offset (seed 0 for search trials)."""
    for t in trials:
        if t.role == ROLE_BASELINE and t.seed_offset == trial.seed_offset and t.scores:
            return t
    return None


def finite_objective(value: Optional[float]) -> Optional[float]:
    """The objective as the ranking reads it: None when missing, NaN or infinite (such a trial ranks
    after every trial with a finite objective, in :func:`ranking_rows`, :func:`best_index` and
    :func:`verdict` alike)."""
    if value is None:
        return None
    v = float(value)
    return v if np.isfinite(v) else None


def _rank_key(t: Trial, sign: float) -> tuple[bool, bool, float, str]:
    v = finite_objective(t.objective)
    return (t.status == PRUNED, v is None, sign * v if v is not None else 0.0, t.trial_id)


def ranking_rows(trials: Sequence[Trial], mode: str = "max") -> list[dict[str, Any]]:
    """Rows of ``sweep/ranking.csv``: search trials ranked by the objective (ties: smaller trial id
    first, the same rule as :func:`best_index`), those without a finite objective (missing, NaN) after
    them, the pruned ones after all others, then the baseline and re-run trials; every row with its
    held-out interval and its paired difference vs the baseline of the same seed (columns
    :data:`RANKING_COLUMNS` then the key params)."""
    sign = -1.0 if mode == "max" else 1.0
    search = sorted([t for t in trials if t.role == ROLE_SEARCH], key=lambda t: _rank_key(t, sign))
    others = sorted([t for t in trials if t.role != ROLE_SEARCH], key=lambda t: (t.role, t.seed_offset))
    rows = []
    for i, t in enumerate(search + others, 1):
        avg, lo, hi = score_interval(t.scores)
        base = baseline_for(t, trials)
        d: tuple[Optional[float], Optional[float], Optional[float]] = (None, None, None)
        if base is not None and base.run_id != t.run_id and t.scores:
            a, b = common_scores(t.scores, base.scores)
            if a:
                d = paired_bootstrap(a, b)
        rows.append({
            "rank": i if t.role == ROLE_SEARCH else None, "run_id": t.run_id, "run_name": t.run_name,
            "trial_id": t.trial_id, "role": t.role, "seed_offset": t.seed_offset, "variant": t.variant,
            "status": t.status, "pruned_reason": t.pruned_reason or None, "pruned_step": t.pruned_step,
            "steps": t.steps, "objective": t.objective, "heldout_problems": len(t.scores),
            "heldout_avg": avg, "heldout_ci_low": lo, "heldout_ci_high": hi,
            "diff_vs_baseline": d[0], "diff_ci_low": d[1], "diff_ci_high": d[2],
            "baseline_run_id": base.run_id if base is not None and base.run_id != t.run_id else None,
            **t.params,
        })
    return rows


def best_index(objectives: Sequence[Optional[float]], trial_ids: Sequence[str], mode: str = "max") -> Optional[int]:
    """Index of the best trial: best finite objective, ties broken by the smaller trial id (NaN / None
    never best: :func:`finite_objective`)."""
    sign = -1.0 if mode == "max" else 1.0
    valid = [(i, v) for i, o in enumerate(objectives) if (v := finite_objective(o)) is not None]
    if not valid:
        return None
    return min(valid, key=lambda iv: (sign * iv[1], trial_ids[iv[0]]))[0]


@dataclass
class Verdict:
    line: str                      # the one-line verdict
    beats: Optional[bool]          # None: not enough re-run seeds to say
    per_seed: list[dict[str, Any]]  # per re-run seed: seed_offset, run_id, diff, low, high, problems (best vs baseline)
    seed_spread: Optional[float]   # max - min of the baselines' held-out means over their seeds
    selected: Optional[dict[str, Any]] = None   # seed 0 (the selected search trial): shown, not counted
    t_interval: Optional[tuple[float, float]] = None        # across re-run seeds, when usable
    problem_interval: Optional[tuple[float, float]] = None  # paired bootstrap over the pooled problems
    part: str = "confirmation"     # the held-out part scored: "final" (eval.final), "confirmation", or "all"

def _part_scores(t: Trial, part: str) -> dict[str, float]:
    return {"final": t.final, "confirmation": t.confirm}.get(part, t.scores)


def _paired(t: Trial, base: Trial, part: str) -> Optional[dict[str, Any]]:
    a, b = _part_scores(t, part), _part_scores(base, part)
    if not a or not b:
        return None
    xa, xb = common_scores(a, b)
    if not xa:
        return None
    d, lo, hi = paired_bootstrap(xa, xb)
    return {"seed_offset": t.seed_offset, "run_id": t.run_id, "diff": d, "low": lo, "high": hi, "problems": len(xa),
            "a_scores": a, "b_scores": b}


def arms_identical(per_seed: Sequence[dict[str, Any]]) -> bool:
    """Whether every judged pair (a re-run of the best configuration and the baseline of its seed,
    :func:`_paired` records) scores exactly the same on every problem: no difference to judge."""
    return bool(per_seed) and all(p["a_scores"] == p["b_scores"] for p in per_seed)


def identical_search(trials: Sequence[Trial]) -> int:
    """The number of finished search trials when there are >= 2 and all have the same per-problem
    scores (the search had nothing to select on), else 0."""
    search = [t.scores for t in trials if t.role == ROLE_SEARCH and t.status != PRUNED and t.scores]
    return len(search) if len(search) >= 2 and all(s == search[0] for s in search) else 0


def verdict(trials: Sequence[Trial], mode: str = "max") -> Verdict:
    """Does the best search trial's configuration beat the baseline beyond problem and seed noise?

    Judged like the claims (``ulorl.eval.paired``): on the re-run seeds only (seed 0 picked the best
    trial) and on problems the search did not see: the final evaluation's (``Trial.final``,
    ``eval.final``) when every judged run has it, else the confirmation part (``Trial.confirm``,
    ``eval.select_problems``); without either the verdict is REFUSED (the best trial was picked on
    the problems it would be judged on). "BEATS" when every usable interval lies above zero: the
    t-interval of the per-seed differences (>= 3 re-run seeds with a spread, required) and the paired
    bootstrap over the problems pooled across the re-run seeds (95 %); "WORSE" when every one lies
    below; without the t-interval, fewer than 2 re-run seeds, or 2 without problems: not judged. When
    every re-run scores exactly as its seed's baseline on every problem the line says "arms identical"
    instead of a verdict, and it says so when all search trials scored identically (nothing to select on).
    """
    rows = ranking_rows(trials, mode)
    search = [r for r in rows if r["role"] == ROLE_SEARCH and finite_objective(r["objective"]) is not None
              and r["status"] != PRUNED]
    bases = {t.seed_offset: t for t in trials if t.role == ROLE_BASELINE and (t.scores or t.confirm or t.final)}
    if not search or not bases:
        return Verdict("verdict: no baseline with held-out results to compare against", None, [], None)
    best = next(t for t in trials if t.run_id == search[0]["run_id"])
    reruns = sorted((t for t in trials if t.role == ROLE_RERUN), key=lambda t: t.seed_offset)
    judged = [t for t in reruns if t.seed_offset in bases] + [bases[t.seed_offset] for t in reruns
                                                               if t.seed_offset in bases]
    part = ("final" if judged and all(t.final for t in judged)
            else "confirmation" if any(t.confirm for t in [best, *reruns, *bases.values()]) else "all")
    spread = None
    if len(bases) >= 2:
        means = [float(np.mean(list(_part_scores(b, part).values()) or [np.nan])) for _, b in sorted(bases.items())]
        spread = max(means) - min(means)
    per_seed = [p for p in (_paired(t, bases[t.seed_offset], part) for t in reruns if t.seed_offset in bases) if p]
    selected = _paired(best, bases[best.seed_offset], part) if best.seed_offset in bases else None
    where = {"final": "the final evaluation's problems (eval.final: no periodic eval, so no search, saw them)",
             "confirmation": "confirmation problems",
             "all": "all held-out problems, the ones the search selected on (no eval.select_problems split)"}[part]
    diffs = [p["diff"] for p in per_seed]
    intervals: list[tuple[float, float]] = []
    t_iv = p_iv = None
    notes = []
    usable, why = seed_interval_usable(diffs)
    if usable:
        _, lo, hi = t_interval(diffs)
        t_iv = (lo, hi)
        intervals.append(t_iv)
    elif len(diffs) >= 2:
        notes.append(f"no t-interval: {why}")
    x = pooled_problem_differences([p["a_scores"] for p in per_seed], [p["b_scores"] for p in per_seed])
    if x is not None and len(diffs) >= 2:
        _, lo, hi = paired_bootstrap(x, [0.0] * len(x))
        p_iv = (lo, hi)
        intervals.append(p_iv)
    word, reason = judge(1 if mode == "max" else -1, intervals, len(diffs), t_usable=usable)
    n = len(diffs)
    if part == "all":    # picked and judged on the same problems: no verdict (the claims refuse it too)
        word = REFUSED
    elif arms_identical(per_seed):
        word = ARMS_IDENTICAL
    if word == REFUSED:
        text, beats = ("is not judged (REFUSED): it was picked on the same held-out problems it would be judged "
                       "on; set eval.final (or eval.select_problems) and re-run the sweep"), None
    elif word == ARMS_IDENTICAL:
        text, beats = (f"is not judged ({ARMS_IDENTICAL}): on all {n} re-run seed(s) it scores exactly as the "
                       f"baseline on every one of the {per_seed[0]['problems']} problems, so there is no "
                       "difference to judge"), None
    elif word == HOLDS:
        text, beats = f"BEATS the baseline on {n} re-run seeds", True
    elif word == NOT_HOLD:
        text, beats = f"is WORSE than the baseline on {n} re-run seeds", False
    elif word == FEW_SEEDS:
        text, beats = f"cannot be judged: {n} re-run seed(s) paired with a baseline (needs >= 2, >= 3 for a " \
                      "t-interval)", None
    elif not usable and n >= 2:
        text, beats = f"cannot be judged without a t-interval across seeds ({reason.split(' (')[0]})", None
    else:
        text, beats = "does NOT beat the baseline beyond the spread", False
    parts = [f"effect {float(np.mean(diffs)):+.4f}" if diffs else "no paired re-run"]
    if t_iv is not None:
        parts.append(f"seeds t95 [{t_iv[0]:+.4f}, {t_iv[1]:+.4f}]")
    if p_iv is not None:
        parts.append(f"problems boot95 [{p_iv[0]:+.4f}, {p_iv[1]:+.4f}] ({len(x or [])})")
    parts += notes
    if (same := identical_search(trials)):
        parts.append(f"all {same} search trials scored identically on every problem: the search had nothing to "
                     "select on")
    if per_seed:
        parts.append("per seed " + ", ".join(f"seed+{p['seed_offset']}: {p['diff']:+.4f}" for p in per_seed))
    if selected is not None:
        parts.append(f"selected seed {best.seed_offset}, not counted: {selected['diff']:+.4f}")
    if spread is not None:
        parts.append(f"baseline seed-to-seed spread {spread:.4f}")
    line = f"verdict: best trial {best.run_name} {text} ({where}: " + "; ".join(parts) + ")"
    for p in per_seed + ([selected] if selected else []):
        p.pop("a_scores", None)
        p.pop("b_scores", None)
    return Verdict(line, beats, per_seed, spread, selected, t_iv, p_iv, part)
