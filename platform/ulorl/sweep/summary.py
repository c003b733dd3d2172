"""A finished sweep read back from MLflow: every child run of the sweep's parent as a
:class:`~ulorl.sweep.ranking.Trial` (per-problem scores of its last periodic evaluations through
:class:`ulorl.tracking.read.PerProblemReader`), the speedups of segment counts S > 1 against the S = 1
reference trials, and the summary dict (ranking rows, best trial, verdict, the command that re-runs
it, what the verdict does not cover) that ``ulorl-sweep`` prints, logs and returns."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from ulorl.eval.final import final_bench
from ulorl.report import speed
from ulorl.sweep.command import best_trial_overrides, fixed_overrides, train_command
from ulorl.sweep.ranking import (
    PRUNED,
    ROLE_REFERENCE,
    ROLE_SEARCH,
    Trial,
    finite_objective,
    ranking_rows,
    verdict,
)
from ulorl.tracking import schema
from ulorl.tracking.read import PerProblemReader

NOT_COVERED = ("not covered: {seeds} re-run seed(s) of the best configuration; {selection}; {problems} problems "
               "of the embedded task at k={k} say nothing about other tasks or model sizes.")
SELECTION_SPLIT = "it was picked on the selection problems and is judged on the other {confirm}"
SELECTION_FINAL = ("it was picked on the periodic evals' problems and is judged on {final} others, scored once after "
                   "the last step (eval.final)")
SELECTION_NO_SPLIT = ("it was picked on the same held-out problems it would be judged on (selection bias: set "
                      "eval.final or eval.select_problems to judge on problems the search did not see)")


def confirm_bench(metric: str) -> Optional[str]:
    """The confirmation part of a selection metric: ``eval/heldout_select/avg_at_k -> heldout_confirm``;
    None for a metric without a split."""
    if metric.startswith("eval/") and metric.count("/") == 2:
        bench = metric.split("/")[1]
        if bench.endswith("_select"):
            return bench[: -len("_select")] + "_confirm"
    return None


def trials_from_mlflow(client: Any, parent_run_id: str, metric: str, searched: Sequence[str]) -> list[Trial]:
    """Every child run of a sweep parent with its per-problem scores of the last held-out eval."""
    parent = client.get_run(parent_run_id)
    runs = client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'", max_results=1000)
    bench = metric.split("/")[1] if metric.startswith("eval/") and metric.count("/") == 2 else "heldout"
    cbench = confirm_bench(metric)
    reader = PerProblemReader(client)
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
            scores=reader.scores(r.info.run_id, bench), variant=tags.get(schema.VARIANT_TAG, ""),
            confirm=reader.scores(r.info.run_id, cbench) if cbench else {},
            final=reader.scores(r.info.run_id, final_bench(bench.removesuffix("_select"))),
            pruned_reason=tags.get(schema.PRUNED_REASON_TAG, "") if pruned else "",
            pruned_step=schema.int_param(tags.get(schema.PRUNED_STEP_TAG)) if pruned else None,
        ))
    return out


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
                           finished=hist[speed.FINISHED], eval_s=hist[speed.EVAL_TIME],
                           step_cpu_s=hist[speed.STEP_CPU], eval_cpu_s=hist[speed.EVAL_CPU], load=hist[speed.LOAD])


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
            "throughput_x": sp.throughput_x, "cpu_step_s": sp.cpu_step_s,
            "reference_cpu_step_s": sp.reference_cpu_step_s,
            "cpu_step_speedup": sp.cpu_step_speedup, "cpu_throughput_x": sp.cpu_throughput_x, "load": sp.load,
            "reference_load": sp.reference_load, "shown": sp.shown,
            "line": speed.speedup_line(sp), "note": speed.below_one_note(sp)}


def summarize(client: Any, parent_run_id: str, spec: Any, base: dict[str, Any], base_path: Path) -> dict[str, Any]:
    """Ranking rows, best search trial, verdict and the command that re-runs the best trial."""
    metric, mode = spec.metrics[0], spec.modes[0]
    trials = trials_from_mlflow(client, parent_run_id, metric, list(spec.space))
    rows = ranking_rows(trials, mode)
    best = next((r for r in rows if r["role"] == ROLE_SEARCH and r["status"] != PRUNED
                 and finite_objective(r["objective"]) is not None), None)   # the verdict's best trial
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
