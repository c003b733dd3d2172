"""The train / inference mismatch of each run, from the store or from results files (``ulorl-tables --mismatch``).

A run logs ``mismatch/*`` and ``correction/*`` at every update (``ulorl.tracking.schema``). Its summary folds
each metric over the steps by what it means: token counts add up; ``abs_mean``, ``delta_mean``, ``k3_kl``
and ``ratio_out_frac`` are weighted by the tokens each step measured (in the same split); maxima take the
max (``abs_max``, ``weight_max``), minima the min (``seq_logratio_min``, ``weight_min``); the rest (coverage,
``seq_logratio_mean``, ``correction/*`` shares and means) the mean over steps.

    summary = run_summary(source, run)              # {metric key: folded value}; results files hold it
    rows = overview_rows(source, runs)              # one row per run: the headline numbers + held-out
    splits = split_rows(summary, max_response_len)  # one row per segment index and per position bucket
    text = to_markdown(rows, splits_by_run)         # what ulorl-tables --mismatch prints and writes
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Optional

from ulorl.report.store import RunInfo, RunSource
from ulorl.tracking import schema

TOKEN_WEIGHTED: frozenset[str] = frozenset({"abs_mean", "delta_mean", "k3_kl", "ratio_out_frac"})
SUMMED: frozenset[str] = frozenset({"tokens"})
MAXED: frozenset[str] = frozenset({"abs_max", "weight_max"})
MINNED: frozenset[str] = frozenset({"seq_logratio_min", "weight_min"})
SPLIT_STATS: tuple[str, ...] = ("tokens", "abs_mean", "abs_max", "k3_kl", "ratio_out_frac")
HELDOUT = schema.eval_metric("heldout", "avg_at_k")


def mismatch_keys(metric_keys: Iterable[str]) -> list[str]:
    """The mismatch and correction metrics among ``metric_keys``, sorted."""
    return sorted(k for k in metric_keys if k.startswith((schema.MISMATCH_PREFIX, schema.CORRECTION_PREFIX)))


def _split_prefix(key: str) -> str:
    """``mismatch/seg1/abs_mean`` -> ``mismatch/seg1/``; ``mismatch/abs_mean`` -> ``mismatch/``."""
    return key.rsplit("/", 1)[0] + "/"


def fold(key: str, values: Sequence[float], tokens: Optional[Sequence[float]] = None) -> float:
    """One metric's steps folded into one number (module doc). ``tokens``: the same split's token counts at
    the same steps (token-weighted stats; without them, the plain mean)."""
    stat = key.rsplit("/", 1)[1]
    vals = [float(v) for v in values]
    if stat in SUMMED:
        return sum(vals)
    if stat in MAXED:
        return max(vals)
    if stat in MINNED:
        return min(vals)
    if stat in TOKEN_WEIGHTED and tokens is not None and len(tokens) == len(vals) and sum(tokens) > 0:
        return sum(v * t for v, t in zip(vals, tokens)) / sum(tokens)
    return sum(vals) / len(vals)


def summarize(history: Callable[[str], tuple[list[int], list[float]]], keys: Iterable[str]) -> dict[str, Any]:
    """``{"steps": updates measured, key: folded value, ...}`` of the mismatch / correction ``keys``, read
    with ``history(key) -> (steps, values)``."""
    hist = {k: history(k) for k in mismatch_keys(keys)}
    out: dict[str, Any] = {}
    for key, (steps, values) in hist.items():
        if not values:
            continue
        tok_steps, tok_values = hist.get(_split_prefix(key) + "tokens", ([], []))
        by_step = dict(zip(tok_steps, tok_values))
        tokens = [by_step.get(s, 0.0) for s in steps] if by_step else None
        out[key] = fold(key, values, tokens)
    steps_measured = hist.get(schema.mismatch_metric("tokens"), ([], []))[0]
    if out:
        out["steps"] = len(steps_measured)
    return out


def run_summary(source: RunSource, run: RunInfo) -> dict[str, Any]:
    """The run's folded mismatch summary: from a results record when the source holds one, else from the
    store's histories ({} for a run that logged none)."""
    stored = getattr(source, "mismatch_summary", None)
    if callable(stored):
        return dict(stored(run.run_id))
    return summarize(lambda k: source.history(run.run_id, k), run.metrics)


def _fmt(x: Any, digits: int = 4, integer: bool = False) -> str:
    if x is None:
        return "—"
    if integer and isinstance(x, (int, float)):
        return str(int(round(x)))
    if isinstance(x, float):
        if x != 0 and (abs(x) < 10 ** -digits or abs(x) >= 10 ** 5):
            return f"{x:.2e}"
        return f"{x:.{digits}f}"
    return str(x)


OVERVIEW_COLUMNS: tuple[str, ...] = (
    "run", "variant", "seed", "is_mode", "correction", "engine_dtype", "segments", "updates", "tokens", "coverage",
    "abs_mean", "abs_max", "k3_kl", "ratio_out_frac", "seq_logratio_mean", "seq_logratio_min", "rejected_frac",
    "truncated_frac", "weight_mean", "heldout_avg_at_k",
)


def overview_rows(source: RunSource, runs: Sequence[RunInfo]) -> list[dict[str, Any]]:
    """One row per run that logged the mismatch: its arm, the folded headline numbers, held-out avg@k
    (the last eval)."""
    rows = []
    for run in runs:
        s = run_summary(source, run)
        if not s:
            continue
        m = schema.MISMATCH_PREFIX
        c = schema.CORRECTION_PREFIX
        rows.append({
            "run": run.name, "run_id": run.run_id, "variant": run.tags.get(schema.VARIANT_TAG, ""),
            "seed": run.tags.get(schema.SEED_TAG, ""), "is_mode": run.param("algo.is_mode"),
            "correction": run.param("algo.rollout_correction.mode", "off"),
            "engine_dtype": run.param("rollout.engine_dtype", "") or run.param("model.dtype"),
            "segments": run.param("rollout.segments"), "updates": s.get("steps"),
            "tokens": s.get(m + "tokens"), "coverage": s.get(m + "coverage"), "abs_mean": s.get(m + "abs_mean"),
            "abs_max": s.get(m + "abs_max"), "k3_kl": s.get(m + "k3_kl"), "ratio_out_frac": s.get(m + "ratio_out_frac"),
            "seq_logratio_mean": s.get(m + "seq_logratio_mean"), "seq_logratio_min": s.get(m + "seq_logratio_min"),
            "rejected_frac": s.get(c + "rejected_frac"), "truncated_frac": s.get(c + "truncated_frac"),
            "weight_mean": s.get(c + "weight_mean"), "heldout_avg_at_k": run.metrics.get(HELDOUT),
        })
    return rows


def _bucket_span(b: int, max_response_len: Optional[int]) -> str:
    if not max_response_len:
        return f"bucket {b}"
    from ulorl.algo.rollout_correction import POSITION_BUCKETS, bucket_width

    w = bucket_width(max_response_len)
    hi = max_response_len if b == POSITION_BUCKETS - 1 else min((b + 1) * w, max_response_len)
    return f"{b * w}-{hi}"


def split_rows(summary: dict[str, Any], max_response_len: Optional[int] = None) -> list[dict[str, Any]]:
    """One row per segment index, then per position bucket (its token span), with the folded split stats."""
    out = []
    for kind, prefix in (("segment", "seg"), ("position", "pos")):
        idx = sorted({int(k.split("/")[1][len(prefix):]) for k in summary
                      if k.startswith(f"{schema.MISMATCH_PREFIX}{prefix}") and k.split("/")[1][len(prefix):].isdigit()})
        for i in idx:
            key = schema.mismatch_metric
            stats = {s: summary.get(key(s, segment=i) if kind == "segment" else key(s, bucket=i)) for s in SPLIT_STATS}
            label = f"segment {i}" if kind == "segment" else f"tokens {_bucket_span(i, max_response_len)}"
            out.append({"split": kind, "index": i, "label": label, **stats})
    return out


def to_markdown(rows: Sequence[dict[str, Any]], splits: dict[str, list[dict[str, Any]]]) -> str:
    """The overview table, then each run's split table (``splits``: run name -> ``split_rows``)."""
    lines = ["# Train / inference mismatch per run", "",
             "delta = trainer log-prob - engine log-prob of the same sampled token under the same weights "
             "(platform/ulorl/docs/algorithm.md); folded over the run's updates (abs_mean, k3_kl, ratio_out_frac "
             "token-weighted; abs_max the max; seq_logratio_min the min).", ""]
    if not rows:
        return "\n".join(lines + ["No run in this source logged mismatch/* metrics (a run logs them when its "
                                  "engine returns the sampled tokens' log-probs).", ""])
    cols = list(OVERVIEW_COLUMNS)
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c), integer=c == "tokens") for c in cols) + " |" for r in rows]
    for name, split in splits.items():
        if not split:
            continue
        lines += ["", f"## {name}: by segment and position", "",
                  "| split | " + " | ".join(SPLIT_STATS) + " |", "|---|" + "---|" * len(SPLIT_STATS)]
        lines += ["| " + " | ".join([s["label"]] + [_fmt(s.get(c), integer=c == "tokens") for c in SPLIT_STATS]) + " |"
                  for s in split]
    return "\n".join(lines) + "\n"


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(OVERVIEW_COLUMNS) + ["run_id"], extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def arm_rows(rows: Sequence[dict[str, Any]], by: str = "variant", baseline: str = "off") -> list[dict[str, Any]]:
    """Rows of the same arm (``by``: variant, else correction mode) averaged over their seeds: mean of each
    numeric column, the seeds count, the held-out spread (min-max) and ``heldout_vs_baseline``: the mean over
    seeds of (arm - ``baseline`` arm) held-out avg@k, paired by seed (None without a common seed)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(str(r.get(by) or r.get("correction")), []).append(r)

    def by_seed(rs: list[dict[str, Any]]) -> dict[str, float]:
        return {str(r.get("seed")): float(r["heldout_avg_at_k"]) for r in rs
                if isinstance(r.get("heldout_avg_at_k"), (int, float))}

    base = by_seed(groups.get(baseline, []))
    out = []
    for arm, rs in groups.items():
        row: dict[str, Any] = {"arm": arm, "seeds": len(rs), "correction": rs[0].get("correction")}
        for col in OVERVIEW_COLUMNS[7:]:
            vals = [float(r[col]) for r in rs if isinstance(r.get(col), (int, float))]
            row[col] = sum(vals) / len(vals) if vals else None
            if col == "abs_max" and vals:
                row[col] = max(vals)
            if col == "seq_logratio_min" and vals:
                row[col] = min(vals)
        held = [float(r["heldout_avg_at_k"]) for r in rs if isinstance(r.get("heldout_avg_at_k"), (int, float))]
        row["heldout_min"], row["heldout_max"] = (min(held), max(held)) if held else (None, None)
        mine = by_seed(rs)
        diffs = [mine[s] - base[s] for s in mine if s in base]
        row["heldout_vs_baseline"] = sum(diffs) / len(diffs) if diffs else None
        out.append(row)
    return out


def arms_markdown(arms: Sequence[dict[str, Any]]) -> str:
    cols = ["arm", "seeds", "abs_mean", "abs_max", "k3_kl", "ratio_out_frac", "seq_logratio_min", "rejected_frac",
            "truncated_frac", "weight_mean", "heldout_avg_at_k", "heldout_min", "heldout_max", "heldout_vs_baseline"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(a.get(c)) for c in cols) + " |" for a in arms]
    return "\n".join(lines) + "\n"


__all__ = ["OVERVIEW_COLUMNS", "SPLIT_STATS", "arm_rows", "arms_markdown", "fold", "mismatch_keys", "overview_rows",
           "run_summary", "split_rows", "summarize", "to_csv", "to_markdown"]
