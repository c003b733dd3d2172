"""What a claim reads of a run: its value of the claim's metric (final entropy, held-out at the
last eval or at equal trained samples, per-problem scores), what runs cost, how much of a
difference evaluation sampling explains, whether two runs are bit-identical. Part of
:mod:`ulorl.report.claims`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from ulorl.eval.paired import (
    sampling_variance,
)
from ulorl.report.claims_registry import (
    ENTROPY,
    FINAL,
    FINAL_WINDOW,
    M_ENTROPY,
    M_HELDOUT,
    M_HELDOUT_SAMPLES,
    M_SIGMA_GAP,
    METRIC_TEXT,
)
from ulorl.report.store import RunInfo, RunSource
from ulorl.report.tables import cumulative_samples, point_at_budget
from ulorl.tracking import schema

# ----------------------------------------------------------------------------- pure statistics


def final_mean(values: Sequence[float], window: int = FINAL_WINDOW) -> Optional[float]:
    """Mean of the last ``window`` values (all of them when fewer); None when empty."""
    if not values:
        return None
    return float(np.mean(np.asarray(values[-window:], dtype=np.float64)))


# ----------------------------------------------------------------------------- reading metrics


@dataclass
class Value:
    """One run's value of a claim metric, the step it was read at and its per-problem scores."""

    value: Optional[float]
    step: Optional[int] = None
    scores: dict[str, float] = field(default_factory=dict)
    note: str = ""


def run_value(source: RunSource, run: RunInfo, metric: str, budget: Optional[float] = None,
              sigma: Optional[float] = None, bench: str = "heldout") -> Value:
    """``metric`` of one run (``budget``: trained samples for M_HELDOUT_SAMPLES; ``sigma``: the
    target entropy for M_SIGMA_GAP; ``bench``: which held-out part the held-out metrics read)."""
    if metric in (M_ENTROPY, M_SIGMA_GAP):
        steps, values = source.history(run.run_id, ENTROPY)
        h = final_mean(values)
        if h is None:
            return Value(None, note=f"{run.run_id}: no {ENTROPY}")
        if metric == M_SIGMA_GAP:
            if sigma is None:
                return Value(None, note=f"{run.run_id}: no algo.mpt.sigma to compare with")
            h = abs(h - sigma)
        return Value(h, steps[-1])
    key = schema.eval_metric(bench, "avg_at_k")
    steps, values = source.history(run.run_id, key)
    if not values:
        return Value(None, note=f"{run.run_id}: no {key}")
    if metric == M_HELDOUT:
        return Value(values[-1], steps[-1], _scores_at(source, run, steps[-1], bench))
    if metric != M_HELDOUT_SAMPLES:
        raise ValueError(f"unknown claim metric {metric!r}; known: {sorted(METRIC_TEXT)}")
    if budget is None:
        return Value(None, note="no equal-samples budget (no run logs train/samples and periodic evals)")
    cum = cumulative_samples(*source.history(run.run_id, "train/samples"))
    hit = point_at_budget(steps, values, cum, budget)
    if hit is None:
        return Value(None, note=f"{run.run_id}: first eval after the budget of {budget:.0f} trained samples")
    return Value(hit[1], hit[0], _scores_at(source, run, hit[0], bench))


def _samples_text(source: RunSource, a_runs: Sequence[RunInfo], b_runs: Sequence[RunInfo]) -> str:
    """``a 9,472 / 9,600 / ..., b ...``: the trained samples (train/samples summed) of each arm's runs."""
    def total(r: RunInfo) -> str:
        _, values = source.history(r.run_id, "train/samples")
        return f"{sum(values):,.0f}" if values else "?"
    return "a " + " / ".join(total(r) for r in a_runs) + ", b " + " / ".join(total(r) for r in b_runs)


def _scores_at(source: RunSource, run: RunInfo, step: int, bench: str) -> dict[str, float]:
    """Per-problem scores behind the held-out value logged at ``step``: the trainer logs the last
    eval's metrics at every step, so they come from its latest eval at or before ``step``."""
    done = [s for s in source.per_problem_steps(run.run_id, bench) if s <= step]
    return source.per_problem(run.run_id, done[-1], bench) if done else {}


def _mean_of(source: RunSource, run: RunInfo, key: str) -> Optional[float]:
    """Mean over a run's logged steps of ``key``: the results files keep it (``means``), a store its history."""
    means = getattr(source, "means", None)
    if callable(means):
        m = means(run.run_id)
        return float(m[key]) if key in m else None
    _, values = source.history(run.run_id, key)
    return float(np.mean(values)) if values else None


def run_costs(source: RunSource, runs: Sequence[RunInfo]) -> dict[str, float]:
    """What ``runs`` cost, from those that ran in one sitting (a run resumed from a checkpoint,
    ``schema.RESUMED_TAG``, spans sittings whose machine load need not match; ``runs``: how many were
    read). Seconds are means over those runs: wall (``wall_s``), periodic evals (``eval_s``: mean
    ``time/eval_s`` x the timed periodic evals, those after step 0) and the final evaluation
    (``final_eval_s``, ``eval.final``, with ``final_min_s`` / ``final_max_s``, and ``final_k`` /
    ``final_problems`` when every run ran the same). Shares are each run's own, then averaged (the seconds
    of runs on an idle and a loaded machine do not average, their shares do): ``eval_share`` (periodic
    evals / wall), ``final_share`` (final / wall), ``final_added`` (final / the rest of the run) and
    ``final_vs_periodic`` (final / periodic evals). {} without a run in one sitting."""
    out: dict[str, float] = {}
    runs = [r for r in runs if schema.RESUMED_TAG not in r.tags]
    walls = [r.metrics["time/wall_s"] for r in runs if "time/wall_s" in r.metrics]
    if not runs or len(walls) != len(runs):
        return out
    out["runs"] = float(len(runs))
    out["wall_s"] = float(np.mean(walls))
    evals = []
    for r in runs:   # the eval steps: where a per-problem CSV was written (the curve is logged at every step)
        steps = source.per_problem_steps(r.run_id, "heldout")
        per = _mean_of(source, r, "time/eval_s")
        if per is not None:
            evals.append(per * len([s for s in steps if s > 0]))
    if len(evals) == len(runs):
        out["eval_s"] = float(np.mean(evals))
        out["eval_share"] = float(np.mean([e / w for e, w in zip(evals, walls)]))
    finals = [r.metrics["time/final_eval_s"] for r in runs if "time/final_eval_s" in r.metrics]
    if len(finals) == len(runs):
        out["final_eval_s"] = float(np.mean(finals))
        out["final_min_s"], out["final_max_s"] = float(min(finals)), float(max(finals))
        out["final_share"] = float(np.mean([f / w for f, w in zip(finals, walls)]))
        out["final_added"] = float(np.mean([f / (w - f) for f, w in zip(finals, walls)]))
        if len(evals) == len(runs) and all(evals):
            out["final_vs_periodic"] = float(np.mean([f / e for f, e in zip(finals, evals)]))
        sizes = {(r.params.get("eval.final.k", ""), r.params.get("eval.final.num_problems", "")) for r in runs}
        k, problems = next(iter(sizes))
        if len(sizes) == 1 and k.isdigit() and problems.isdigit():
            out["final_k"], out["final_problems"] = float(k), float(problems)
    return out


def eval_noise(source: RunSource, per_seed: Sequence[dict[str, Any]], bench: str, diffs: Sequence[float]
               ) -> tuple[Optional[int], Optional[float]]:
    """(k, share): the samples per problem of the evaluation read and the share of the per-seed
    differences' variance that its sampling alone explains: mean over seeds of
    :func:`~ulorl.eval.paired.sampling_variance` (arm a's run + arm b's run, the per-problem scores
    behind each value) over the sample variance of ``diffs``; Nones when a run lacks its k or scores."""
    key = "eval.final.k" if bench == FINAL else "eval.k"
    noise, ks = [], set()
    for p in per_seed:
        v = 0.0
        for rid, step in ((p["a_run"], p["a_step"]), (p["b_run"], p["b_step"])):
            run = source.get(rid)
            k = int(float(run.param(key, "0"))) if run is not None else 0
            scores = _scores_at(source, run, step, bench) if run is not None and step is not None else {}
            var = sampling_variance(list(scores.values()), k)
            if var is None:
                return None, None
            ks.add(k)
            v += var
        noise.append(v)
    spread = float(np.var(diffs, ddof=1))
    return (ks.pop() if len(ks) == 1 else None), (float(np.mean(noise)) / spread if spread > 0 else None)


def arms_identical(source: RunSource, ra: RunInfo, rb: RunInfo, bench: Optional[str]) -> bool:
    """Whether two runs are bit-identical as far as the claims can see: the same non-empty
    ``train/entropy`` at every step, the same held-out curve on ``bench`` and, when given, the same
    per-problem scores at its last eval (the same model trained twice)."""
    ha, hb = source.history(ra.run_id, ENTROPY), source.history(rb.run_id, ENTROPY)
    if not ha[1] or ha != hb:
        return False
    if bench is None:
        return True
    key = schema.eval_metric(bench, "avg_at_k")
    ca, cb = source.history(ra.run_id, key), source.history(rb.run_id, key)
    if ca != cb:
        return False
    return not ca[0] or _scores_at(source, ra, ca[0][-1], bench) == _scores_at(source, rb, cb[0][-1], bench)
