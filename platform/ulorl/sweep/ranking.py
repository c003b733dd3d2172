"""A sweep's result as a researcher can judge it: every trial against the baseline, paired on the
same held-out problems, with bootstrap intervals, a second-seed check and a one-line verdict.

Pure functions over per-problem scores (``eval/<bench>_per_problem_step_<N>.csv`` of each trial's
last periodic evaluation) plus the reading of those files from MLflow and the printed summary.

Paired bootstrap: for trial A and baseline B evaluated on the same P problems with per-problem
accuracies a[P], b[P] (correct / k), the difference is mean(a - b) and its interval the percentile
bootstrap of mean((a - b)[idx]) over problems resampled with replacement. Pairing removes the
between-problem variance that two separate intervals would count twice; it does not see the
training-seed variance, which is why the baseline and the best trial are also re-run on a second
seed and the verdict asks for a positive interval on every seed.
"""

from __future__ import annotations

import csv
import io
import shlex
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd
import yaml
from rich.console import Console
from rich.table import Table

from ulorl.config import apply_overrides, config_from_dict, flatten_config
from ulorl.eval.metrics import bootstrap_ci
from ulorl.report import speed
from ulorl.sweep.spec import seed_overrides
from ulorl.tracking import schema

N_BOOT = 2000
ALPHA = 0.05
ROLE_SEARCH, ROLE_BASELINE, ROLE_RERUN = "search", "baseline", "rerun"
ROLE_REFERENCE = "reference"   # a reference trial of another comparison (spec ``references``: the S = 1 of the speedup)
# Columns of sweep/ranking.csv (before the key params of the trials).
RANKING_COLUMNS: tuple[str, ...] = (
    "rank", "run_id", "run_name", "trial_id", "role", "seed_offset", "variant", "status", "steps", "objective",
    "heldout_problems", "heldout_avg", "heldout_ci_low", "heldout_ci_high",
    "diff_vs_baseline", "diff_ci_low", "diff_ci_high", "baseline_run_id",
)


# ----------------------------------------------------------------------------- pure statistics
def paired_bootstrap(a: Sequence[float], b: Sequence[float], n_boot: int = N_BOOT, alpha: float = ALPHA,
                     seed: int = 0) -> tuple[float, float, float]:
    """Mean paired difference ``mean(a - b)`` and its percentile bootstrap interval.

    Args:
        a, b: Float[P] per-problem scores of two models on the SAME problems, same order.
    Returns:
        (difference, low, high).
    """
    x = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if x.size == 0:
        raise ValueError("paired_bootstrap needs at least one common problem")
    low, high = bootstrap_ci(x, n_boot=n_boot, alpha=alpha, seed=seed)
    return float(x.mean()), low, high


def parse_per_problem_csv(text: str) -> dict[str, float]:
    """``problem_id -> accuracy`` (num_correct / k) from a per-problem eval CSV."""
    out: dict[str, float] = {}
    for row in csv.DictReader(io.StringIO(text)):
        k = float(row.get("k") or 0)
        if k > 0 and row.get("num_correct") not in (None, ""):
            out[str(row["problem_id"])] = float(row["num_correct"]) / k
        elif row.get("accuracy") not in (None, ""):
            out[str(row["problem_id"])] = float(row["accuracy"])
    return out


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


def ranking_rows(trials: Sequence[Trial], mode: str = "max") -> list[dict[str, Any]]:
    """Rows of ``sweep/ranking.csv``: search trials ranked by the objective (ties: smaller trial id
    first, the same rule as :func:`best_index`), then the baseline and
    re-run trials; every row with its held-out interval and its paired difference vs the baseline
    of the same seed (columns :data:`RANKING_COLUMNS` then the key params)."""
    sign = -1.0 if mode == "max" else 1.0
    search = sorted([t for t in trials if t.role == ROLE_SEARCH],
                    key=lambda t: (t.objective is None, sign * (t.objective or 0.0), t.trial_id))
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
            "status": t.status, "steps": t.steps, "objective": t.objective, "heldout_problems": len(t.scores),
            "heldout_avg": avg, "heldout_ci_low": lo, "heldout_ci_high": hi,
            "diff_vs_baseline": d[0], "diff_ci_low": d[1], "diff_ci_high": d[2],
            "baseline_run_id": base.run_id if base is not None and base.run_id != t.run_id else None,
            **t.params,
        })
    return rows


def best_index(objectives: Sequence[Optional[float]], trial_ids: Sequence[str], mode: str = "max") -> Optional[int]:
    """Index of the best trial: best objective, ties broken by the smaller trial id."""
    sign = -1.0 if mode == "max" else 1.0
    valid = [(i, float(v)) for i, v in enumerate(objectives) if v is not None and np.isfinite(v)]
    if not valid:
        return None
    return min(valid, key=lambda iv: (sign * iv[1], trial_ids[iv[0]]))[0]


@dataclass
class Verdict:
    line: str                      # the one-line verdict
    beats: Optional[bool]          # None: not enough runs to say
    per_seed: list[dict[str, Any]]  # seed_offset, diff, low, high of best vs baseline
    seed_spread: Optional[float]   # |baseline seed 0 - baseline seed 1| on the held-out mean


def verdict(trials: Sequence[Trial], mode: str = "max") -> Verdict:
    """Does the best search trial beat the baseline beyond problem and seed noise?

    "Beats" needs the paired interval of (best - baseline) above 0 on EVERY seed both were run with
    (seed 0 and the re-runs); "worse" needs it below 0 on every seed; else "no difference shown".
    """
    rows = ranking_rows(trials, mode)
    search = [r for r in rows if r["role"] == ROLE_SEARCH and r["objective"] is not None]
    bases = {t.seed_offset: t for t in trials if t.role == ROLE_BASELINE and t.scores}
    if not search or not bases:
        return Verdict("verdict: no baseline with held-out results to compare against", None, [], None)
    best = next(t for t in trials if t.run_id == search[0]["run_id"])
    same_config = [best] + [t for t in trials if t.role == ROLE_RERUN]
    per_seed: list[dict[str, Any]] = []
    for t in sorted(same_config, key=lambda t: t.seed_offset):
        base = bases.get(t.seed_offset)
        if base is None or not t.scores:
            continue
        d, lo, hi = paired_bootstrap(*common_scores(t.scores, base.scores))
        per_seed.append({"seed_offset": t.seed_offset, "run_id": t.run_id, "diff": d, "low": lo, "high": hi,
                         "problems": len(set(t.scores) & set(base.scores))})
    spread = None
    if len(bases) >= 2:
        means = [float(np.mean(list(b.scores.values()))) for _, b in sorted(bases.items())]
        spread = max(means) - min(means)
    if not per_seed:
        return Verdict("verdict: the best trial has no held-out results paired with a baseline", None, [], spread)
    seeds = ", ".join(f"seed+{p['seed_offset']}: {p['diff']:+.4f} [{p['low']:+.4f}, {p['high']:+.4f}]"
                      for p in per_seed)
    n = len(per_seed)
    if all(p["low"] > 0 for p in per_seed):
        word, beats = f"BEATS the baseline on all {n} seed(s)", True
    elif all(p["high"] < 0 for p in per_seed):
        word, beats = f"is WORSE than the baseline on all {n} seed(s)", False
    else:
        word, beats = "does NOT beat the baseline beyond the spread", False
    line = (f"verdict: best trial {best.run_name} {word} (paired difference on the same held-out problems, "
            f"95% bootstrap interval: {seeds}"
            + (f"; baseline seed-to-seed spread {spread:.4f}" if spread is not None else "") + ")")
    return Verdict(line, beats, per_seed, spread)


NOT_COVERED = ("not covered: only {seeds} training seed(s); the best trial was picked on the same held-out "
               "problems it is scored on (selection bias); {problems} problems of the embedded task at k={k} "
               "say nothing about other tasks or model sizes.")


# ----------------------------------------------------------------------------- the command
def override_value(value: Any) -> str:
    """A value as ``key=value`` text that ``ulorl-train`` parses back to the same type
    (YAML): ``0.95 -> 0.95``, ``'off' -> "'off'"`` (bare ``off`` would be the boolean False)."""
    if isinstance(value, str):
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = None
        return value if parsed == value else "'" + value.replace("'", "''") + "'"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value) if not isinstance(value, (list, dict)) else yaml.safe_dump(value, default_flow_style=True).strip()


def train_command(base_path: Path, overrides: dict[str, Any], cwd: Optional[Path] = None) -> str:
    """``ulorl-train <base> key=value ...`` that re-runs a trial (shell-quoted)."""
    base = Path(base_path)
    try:
        base = base.relative_to((cwd or Path.cwd()).resolve())
    except ValueError:
        pass
    parts = ["ulorl-train", str(base)] + [f"{k}={override_value(v)}" for k, v in overrides.items()]
    return " ".join(_shell_quote(p) for p in parts)


def _shell_quote(arg: str) -> str:
    """Like ``shlex.quote`` but ``key='off'`` becomes ``"key='off'"`` (readable) when safe."""
    if "'" in arg and not any(c in arg for c in '"$`\\!'):
        return f'"{arg}"'
    return shlex.quote(arg)


# ----------------------------------------------------------------------------- reading MLflow
def last_per_problem(client: Any, run_id: str, bench: str = "heldout") -> dict[str, float]:
    """Per-problem accuracy of the run's last periodic evaluation on ``bench`` ({} when none)."""
    try:
        files = [f.path for f in client.list_artifacts(run_id, "eval")]
    except Exception:
        return {}
    prefix = f"eval/{bench}_per_problem_step_"
    steps = sorted(p for p in files if p.startswith(prefix) and p.endswith(".csv"))
    if not steps:
        return {}
    with tempfile.TemporaryDirectory(prefix="ulorl-rank-") as tmp:
        local = client.download_artifacts(run_id, steps[-1], tmp)
        return parse_per_problem_csv(Path(local).read_text())


def trials_from_mlflow(client: Any, parent_run_id: str, metric: str, searched: Sequence[str]) -> list[Trial]:
    """Every child run of a sweep parent with its per-problem scores of the last held-out eval."""
    parent = client.get_run(parent_run_id)
    runs = client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'", max_results=1000)
    bench = metric.split("/")[1] if metric.startswith("eval/") and metric.count("/") == 2 else "heldout"
    out = []
    for r in runs:
        tags, params = r.data.tags, r.data.params
        out.append(Trial(
            run_id=r.info.run_id, run_name=r.info.run_name or r.info.run_id[:8],
            trial_id=tags.get(schema.TRIAL_TAG, ""), role=tags.get(schema.ROLE_TAG, ROLE_SEARCH),
            seed_offset=int(tags.get(schema.SEED_TAG, 0) or 0), status=r.info.status,
            objective=r.data.metrics.get(metric), steps=r.data.metrics.get("train/policy_version"),
            params={k: v for k, v in params.items() if k in schema.KEY_PARAMS or k in searched},
            searched={k: params.get(k) for k in searched if k in params},
            scores=last_per_problem(client, r.info.run_id, bench), variant=tags.get(schema.VARIANT_TAG, ""),
        ))
    return out


def ranking_csv(rows: Sequence[dict[str, Any]]) -> str:
    df = pd.DataFrame(list(rows))
    first = [c for c in RANKING_COLUMNS if c in df]
    return df[first + [c for c in df.columns if c not in first]].to_csv(index=False)


def run_speed_of(client: Any, trial: Trial) -> Optional[speed.RunSpeed]:
    """The trial's speed over its steady window (:mod:`ulorl.report.speed`), read from MLflow."""
    segments = _int_param(trial.params.get("rollout.segments"))
    if segments is None:
        return None
    hist: dict[str, dict[int, float]] = {}
    for key in speed.SPEED_METRICS:
        pts = sorted(client.get_metric_history(trial.run_id, key), key=lambda m: (m.step, m.timestamp))
        hist[key] = {int(m.step): float(m.value) for m in pts}
    return speed.run_speed(hist[speed.STEP_TIME], segments, trained=hist[speed.TRAINED],
                           finished=hist[speed.FINISHED], eval_s=hist[speed.EVAL_TIME])


def _int_param(value: Any) -> Optional[int]:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def trial_speedups(client: Any, trials: Sequence[Trial]) -> list[speed.Speedup]:
    """Every segment count S > 1 of the sweep against its S = 1 reference trial(s) of the same batching
    (role ``reference``), medians over the runs of each cell; [] without a reference."""
    refs = [t for t in trials if t.role == ROLE_REFERENCE and _int_param(t.params.get("rollout.segments")) == 1]
    if not refs:
        return []
    speeds = {t.run_id: run_speed_of(client, t) for t in trials}
    out = []
    for batching in sorted({str(t.params.get("rollout.batching", "")) for t in refs}):
        ref = [sp for t in refs if str(t.params.get("rollout.batching", "")) == batching
               and (sp := speeds[t.run_id]) is not None]
        by_s: dict[int, list[speed.RunSpeed]] = {}
        for t in trials:
            s = _int_param(t.params.get("rollout.segments"))
            sp = speeds[t.run_id]
            if s and s > 1 and sp is not None and str(t.params.get("rollout.batching", "")) == batching:
                by_s.setdefault(s, []).append(sp)
        out += [speed.speedup(ref, by_s[s], s, batching) for s in sorted(by_s)] if ref else []
    return out


def speedup_record(sp: speed.Speedup) -> dict[str, Any]:
    """A speedup as the summary (``--json``, ``sweep/best.json``) carries it, with its printed lines."""
    return {"segments": sp.segments, "batching": sp.batching, "runs": sp.runs, "reference_runs": sp.reference_runs,
            "step_s": sp.step_s, "reference_step_s": sp.reference_step_s, "trained_per_s": sp.trained_per_s,
            "reference_trained_per_s": sp.reference_trained_per_s, "step_speedup": sp.step_speedup,
            "throughput_x": sp.throughput_x, "line": speed.speedup_line(sp), "note": speed.below_one_note(sp)}


# ----------------------------------------------------------------------------- the sweep summary
def typed_values(base: dict[str, Any], fixed: dict[str, Any], logged: dict[str, Any]) -> dict[str, Any]:
    """MLflow params are strings: read them back through the experiment schema so the command
    carries typed values (``'0.95' -> 0.95``, ``'off'`` stays the string ``off``)."""
    cfg = config_from_dict(apply_overrides(base, {**fixed, **logged}))
    flat = flatten_config(cfg)
    return {k: flat.get(k, v) for k, v in logged.items()}


def fixed_overrides(spec: Any) -> dict[str, Any]:
    """The overrides every trial of ``spec`` gets (spec overrides plus the stop settings)."""
    fixed = dict(spec.overrides)
    if spec.stop.steps:
        fixed["train.max_steps"] = spec.stop.steps
    if spec.stop.wall_s:
        fixed["train.max_wall_s"] = spec.stop.wall_s
    return fixed


def best_trial_overrides(spec: Any, base: dict[str, Any], fixed: dict[str, Any], trial: Trial) -> dict[str, Any]:
    """The overrides that re-run ``trial``: the sweep's fixed ones, its variant's (a grid sweep over
    ``variants``), its searched values (typed through the schema) and, for a repeat on seed offset
    r > 0, that repeat's seeds."""
    variant = next((v for v in getattr(spec, "variants", []) or [] if v.name and v.name == trial.variant), None)
    out = {**fixed, **(dict(variant.overrides) if variant is not None else {})}
    out.update(typed_values(base, out, trial.searched))
    if trial.seed_offset:
        out.update(seed_overrides(apply_overrides(base, out), trial.seed_offset))
    return out


def summarize(client: Any, parent_run_id: str, spec: Any, base: dict[str, Any], base_path: Path) -> dict[str, Any]:
    """Ranking rows, best search trial, verdict and the command that re-runs the best trial."""
    metric, mode = spec.metrics[0], spec.modes[0]
    trials = trials_from_mlflow(client, parent_run_id, metric, list(spec.space))
    rows = ranking_rows(trials, mode)
    best = next((r for r in rows if r["role"] == ROLE_SEARCH), None)
    fixed = fixed_overrides(spec)
    command = None
    if best is not None:
        trial = next(t for t in trials if t.run_id == best["run_id"])
        command = train_command(base_path, best_trial_overrides(spec, base, fixed, trial))
    v = verdict(trials, mode)
    k = config_from_dict(apply_overrides(base, fixed)).eval.k
    problems = max((len(t.scores) for t in trials), default=0)
    seeds = spec.baseline.seeds if spec.baseline is not None else 1
    return {"ranking": rows, "best": best, "verdict": v.line, "beats_baseline": v.beats, "per_seed": v.per_seed,
            "seed_spread": v.seed_spread, "command": command,
            "speedup": [speedup_record(sp) for sp in trial_speedups(client, trials)],
            "not_covered": NOT_COVERED.format(seeds=seeds, problems=problems, k=k)
            if spec.baseline is not None else None}


def _fmt(v: Any, signed: bool = False) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:+.3f}" if signed else f"{v:.3f}"
    return str(v)


def print_summary(summary: dict[str, Any], spec: Any, file: Any = None) -> None:
    """What a researcher reads at the end: where the runs are, then the ranking (one row per trial
    with its held-out interval and paired difference vs the baseline), the best configuration and its
    command, the speedup against S = 1, what the verdict does not cover, and the verdict last."""
    out = file or sys.stdout
    console = Console(file=out, width=None if getattr(out, "isatty", lambda: False)() else 200)
    uri = summary.get("tracking_uri", "")
    console.print(f"parent run: {summary.get('parent_run_id')}  tracking: {uri}  log: "
                  f"{Path(summary.get('sweep_dir', '.')) / 'sweep.log'}", soft_wrap=True, markup=False)
    console.print(f"next: ulorl-dashboard --tracking-uri {uri}   (Sweep, Benchmarks: difference vs baseline, "
                  "Speedup: S vs S = 1)", soft_wrap=True, markup=False)
    console.print(f"      ulorl-tables --tracking-uri {uri} --out tables   (paper tables and figures; "
                  "ranking.csv is in the parent run's artifacts under sweep/)", soft_wrap=True, markup=False)
    rows = summary["ranking"]
    table = Table(title=f"sweep {spec.name}: trials ranked by {spec.metrics[0]} ({spec.modes[0]}), "
                        "held-out avg@k with 95% bootstrap intervals over problems")
    searched = list(spec.space)
    cols = ["#", "run", "role", "status", "heldout [95% CI]", "vs baseline [95% CI, paired]"]
    for c in cols:
        table.add_column(c, no_wrap=True)
    for r in rows:
        ci = f"{_fmt(r['heldout_avg'])} [{_fmt(r['heldout_ci_low'])}, {_fmt(r['heldout_ci_high'])}]"
        diff = ("(baseline)" if r["role"] == ROLE_BASELINE else
                f"{_fmt(r['diff_vs_baseline'], True)} "
                f"[{_fmt(r['diff_ci_low'], True)}, {_fmt(r['diff_ci_high'], True)}]")
        role = r["role"] + (f" seed+{r['seed_offset']}" if r["seed_offset"] else "")
        table.add_row(_fmt(r["rank"]), r["run_name"], role, r["status"], ci, diff)
    console.print(table)
    best = summary.get("best")
    if best is not None:
        values = ", ".join([f"variant {best['variant']}"] * bool(best.get("variant"))
                           + [f"{k}={best.get(k)}" for k in searched if k in best])
        console.print(f"best search trial: {best['run_name']} (run {best['run_id']}): {values}", soft_wrap=True)
    if summary.get("command"):
        console.print("re-run the best config:", soft_wrap=True)
        console.print("  " + summary["command"], soft_wrap=True, markup=False, highlight=False)
    for sp in summary.get("speedup") or []:
        console.print(sp["line"], soft_wrap=True, markup=False, highlight=False)
        if sp.get("note"):
            console.print("  " + sp["note"], soft_wrap=True, markup=False, highlight=False)
    if summary.get("not_covered"):
        console.print(summary["not_covered"], soft_wrap=True)
    console.print(summary.get("verdict") or "verdict: -", soft_wrap=True)
