"""A sweep's result as a researcher can judge it: every trial against the baseline, paired on the
same held-out problems, with bootstrap intervals, a second-seed check and a one-line verdict.

Pure functions over per-problem scores (``eval/<bench>_per_problem_step_<N>.csv`` of each trial's
last periodic evaluation) plus the reading of those files from MLflow and the printed summary.

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
from ulorl.eval.final import final_bench
from ulorl.eval.metrics import bootstrap_ci
from ulorl.eval.paired import (
    FEW_SEEDS,
    HOLDS,
    NOT_HOLD,
    REFUSED,
    judge,
    paired_bootstrap,
    parse_per_problem_csv,
    pooled_problem_differences,
    seed_interval_usable,
    t_interval,
)
from ulorl.report import speed
from ulorl.sweep.spec import seed_overrides
from ulorl.tracking import schema
from ulorl.tracking.schema import ROLE_BASELINE, ROLE_REFERENCE, ROLE_RERUN, ROLE_SEARCH

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


# ----------------------------------------------------------------------------- pure statistics
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


def ranking_rows(trials: Sequence[Trial], mode: str = "max") -> list[dict[str, Any]]:
    """Rows of ``sweep/ranking.csv``: search trials ranked by the objective (ties: smaller trial id
    first, the same rule as :func:`best_index`), the pruned ones after all others, then the baseline and
    re-run trials; every row with its held-out interval and its paired difference vs the baseline
    of the same seed (columns :data:`RANKING_COLUMNS` then the key params)."""
    sign = -1.0 if mode == "max" else 1.0
    search = sorted([t for t in trials if t.role == ROLE_SEARCH],
                    key=lambda t: (t.status == PRUNED, t.objective is None, sign * (t.objective or 0.0), t.trial_id))
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
    """Index of the best trial: best objective, ties broken by the smaller trial id."""
    sign = -1.0 if mode == "max" else 1.0
    valid = [(i, float(v)) for i, v in enumerate(objectives) if v is not None and np.isfinite(v)]
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


def confirm_bench(metric: str) -> Optional[str]:
    """The confirmation part of a selection metric: ``eval/heldout_select/avg_at_k -> heldout_confirm``;
    None for a metric without a split."""
    if metric.startswith("eval/") and metric.count("/") == 2:
        bench = metric.split("/")[1]
        if bench.endswith("_select"):
            return bench[: -len("_select")] + "_confirm"
    return None


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


def verdict(trials: Sequence[Trial], mode: str = "max") -> Verdict:
    """Does the best search trial's configuration beat the baseline beyond problem and seed noise?

    Judged like the claims (``ulorl.eval.paired``): on the re-run seeds only (seed 0 picked the best
    trial) and on problems the search did not see: the final evaluation's (``Trial.final``,
    ``eval.final``) when every judged run has it, else the confirmation part (``Trial.confirm``,
    ``eval.select_problems``); without either the verdict is REFUSED (the best trial was picked on
    the problems it would be judged on). "BEATS" when every usable interval lies above zero: the
    t-interval of the per-seed differences (>= 3 re-run seeds with a spread, required) and the paired
    bootstrap over the problems pooled across the re-run seeds (95 %); "WORSE" when every one lies
    below; without the t-interval, fewer than 2 re-run seeds, or 2 without problems: not judged.
    """
    rows = ranking_rows(trials, mode)
    search = [r for r in rows if r["role"] == ROLE_SEARCH and r["objective"] is not None and r["status"] != PRUNED]
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
    if word == REFUSED:
        text, beats = ("is not judged (REFUSED): it was picked on the same held-out problems it would be judged "
                       "on; set eval.final (or eval.select_problems) and re-run the sweep"), None
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


NOT_COVERED = ("not covered: {seeds} re-run seed(s) of the best configuration; {selection}; {problems} problems "
               "of the embedded task at k={k} say nothing about other tasks or model sizes.")
SELECTION_SPLIT = "it was picked on the selection problems and is judged on the other {confirm}"
SELECTION_FINAL = ("it was picked on the periodic evals' problems and is judged on {final} others, scored once after "
                   "the last step (eval.final)")
SELECTION_NO_SPLIT = ("it was picked on the same held-out problems it would be judged on (selection bias: set "
                      "eval.final or eval.select_problems to judge on problems the search did not see)")


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
    last = schema.last_per_problem_artifact(files, bench)
    if last is None:
        return {}
    with tempfile.TemporaryDirectory(prefix="ulorl-rank-") as tmp:
        local = client.download_artifacts(run_id, last, tmp)
        return parse_per_problem_csv(Path(local).read_text())


def trials_from_mlflow(client: Any, parent_run_id: str, metric: str, searched: Sequence[str]) -> list[Trial]:
    """Every child run of a sweep parent with its per-problem scores of the last held-out eval."""
    parent = client.get_run(parent_run_id)
    runs = client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'", max_results=1000)
    bench = metric.split("/")[1] if metric.startswith("eval/") and metric.count("/") == 2 else "heldout"
    cbench = confirm_bench(metric)
    out = []
    for r in runs:
        tags, params = r.data.tags, r.data.params
        pruned = tags.get(schema.PRUNED_TAG) == "true"
        out.append(Trial(
            run_id=r.info.run_id, run_name=r.info.run_name or r.info.run_id[:8],
            trial_id=tags.get(schema.TRIAL_TAG, ""), role=tags.get(schema.ROLE_TAG, ROLE_SEARCH),
            seed_offset=int(tags.get(schema.SEED_TAG, 0) or 0), status=PRUNED if pruned else r.info.status,
            objective=r.data.metrics.get(metric), steps=r.data.metrics.get("train/policy_version"),
            params={k: v for k, v in params.items() if k in schema.KEY_PARAMS or k in searched},
            searched={k: params.get(k) for k in searched if k in params},
            scores=last_per_problem(client, r.info.run_id, bench), variant=tags.get(schema.VARIANT_TAG, ""),
            confirm=last_per_problem(client, r.info.run_id, cbench) if cbench else {},
            final=last_per_problem(client, r.info.run_id, final_bench(bench.removesuffix("_select"))),
            pruned_reason=tags.get(schema.PRUNED_REASON_TAG, "") if pruned else "",
            pruned_step=schema.int_param(tags.get(schema.PRUNED_STEP_TAG)) if pruned else None,
        ))
    return out


def ranking_csv(rows: Sequence[dict[str, Any]]) -> str:
    df = pd.DataFrame(list(rows))
    first = [c for c in RANKING_COLUMNS if c in df]
    return df[first + [c for c in df.columns if c not in first]].to_csv(index=False)


def run_speed_of(client: Any, trial: Trial) -> Optional[speed.RunSpeed]:
    """The trial's speed over its steady window (:mod:`ulorl.report.speed`), read from MLflow."""
    segments = schema.int_param(trial.params.get("rollout.segments"))
    if segments is None:
        return None
    hist: dict[str, dict[int, float]] = {}
    for key in speed.SPEED_METRICS:
        pts = sorted(client.get_metric_history(trial.run_id, key), key=lambda m: (m.step, m.timestamp))
        hist[key] = {int(m.step): float(m.value) for m in pts}
    return speed.run_speed(hist[speed.STEP_TIME], segments, trained=hist[speed.TRAINED],
                           finished=hist[speed.FINISHED], eval_s=hist[speed.EVAL_TIME])


def trial_speedups(client: Any, trials: Sequence[Trial]) -> list[speed.Speedup]:
    """Every segment count S > 1 of the sweep against its S = 1 reference trial(s) of the same batching
    (role ``reference``), medians over the runs of each cell; [] without a reference."""
    refs = [t for t in trials if t.role == ROLE_REFERENCE and schema.int_param(t.params.get("rollout.segments")) == 1]
    if not refs:
        return []
    speeds = {t.run_id: run_speed_of(client, t) for t in trials}
    out = []
    for batching in sorted({str(t.params.get("rollout.batching", "")) for t in refs}):
        ref = [sp for t in refs if str(t.params.get("rollout.batching", "")) == batching
               and (sp := speeds[t.run_id]) is not None]
        by_s: dict[int, list[speed.RunSpeed]] = {}
        for t in trials:
            s = schema.int_param(t.params.get("rollout.segments"))
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
    best = next((r for r in rows if r["role"] == ROLE_SEARCH and r["status"] != PRUNED), None)
    fixed = fixed_overrides(spec)
    command = None
    if best is not None:
        trial = next(t for t in trials if t.run_id == best["run_id"])
        command = train_command(base_path, best_trial_overrides(spec, base, fixed, trial))
    v = verdict(trials, mode)
    k = next((t.params.get("eval.k") for t in trials if t.params.get("eval.k")), None)
    problems = max((len(t.scores) + len(t.confirm) for t in trials), default=0)
    seeds = len(v.per_seed)
    confirm = max((len(t.confirm) for t in trials), default=0)
    selection = SELECTION_SPLIT.format(confirm=confirm) if confirm else SELECTION_NO_SPLIT
    if v.part == "final":
        problems = max((len(t.final) for t in trials), default=0)
        k = spec.overrides.get("eval.final.k") or base.get("eval", {}).get("final", {}).get("k") or "?"
        selection = SELECTION_FINAL.format(final=problems)
    return {"ranking": rows, "best": best, "verdict": v.line, "beats_baseline": v.beats, "per_seed": v.per_seed,
            "seed_spread": v.seed_spread, "command": command,
            "speedup": [speedup_record(sp) for sp in trial_speedups(client, trials)],
            "not_covered": NOT_COVERED.format(seeds=seeds, selection=selection, problems=problems,
                                              k=k or base.get("eval", {}).get("k", "?"))
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
        status = r["status"] + (f" ({r['pruned_reason']}, step {r['pruned_step']})" if r["status"] == PRUNED else "")
        table.add_row(_fmt(r["rank"]), r["run_name"], role, status, ci, diff)
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
