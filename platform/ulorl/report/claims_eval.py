"""A claim judged on one sweep group's paired runs (:func:`evaluate_group`) and over a whole
store (:func:`evaluate_claims`). Part of :mod:`ulorl.report.claims`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from ulorl.eval.paired import (
    ARMS_IDENTICAL,
    LEVEL_DIRECTIONAL,
    REFUSED,
    equivalence_margin_problems,
    equivalence_margin_seeds,
    judge,
    mde_problems,
    mde_seeds,
    paired_bootstrap,
    pooled_problem_differences,
    seed_interval_usable,
    seeds_for_effect,
    seeds_for_margin,
    t_interval,
)
from ulorl.report.claims_metrics import (
    _samples_text,
    arms_identical,
    eval_noise,
    run_costs,
    run_value,
)
from ulorl.report.claims_registry import (
    B_BOTH,
    B_NONE,
    B_PROBLEMS,
    B_SEEDS,
    CLAIMS,
    ENTROPY,
    FINAL,
    M_HELDOUT,
    M_HELDOUT_SAMPLES,
    M_SIGMA_GAP,
    METRIC_TEXT,
    NOT_RUN,
    PER_PROBLEM,
    Claim,
)
from ulorl.report.claims_select import (
    arm_runs,
    by_seed,
    one_config,
    sweep_groups,
)
from ulorl.report.store import RunInfo, RunSource
from ulorl.report.tables import sample_budget
from ulorl.tracking import schema
from ulorl.tracking.provenance import SPEC_TAG
from ulorl.tracking.schema import ROLE_BASELINE, ROLE_RERUN, SEED_KEYS

# ----------------------------------------------------------------------------- evaluating claims


@dataclass
class ClaimResult:
    claim: str
    paper_says: str
    metric: str
    arms: str                                  # "a vs b"
    direction: int
    sweep: str                                 # the sweep group ("" when none)
    level: float = LEVEL_DIRECTIONAL           # of every interval below
    margin: Optional[float] = None
    floor: Optional[float] = None              # the claim's practical-size floor (``ulorl.eval.paired.judge``)
    bench: str = ""                            # held-out part read (held-out metrics)
    seeds: int = 0
    effect: Optional[float] = None             # mean over seeds of a - b
    t_low: Optional[float] = None              # only when the t-interval is usable (>= 3 seeds, spread > 0)
    t_high: Optional[float] = None
    problem_effect: Optional[float] = None     # pooled paired bootstrap over problems
    problem_low: Optional[float] = None
    problem_high: Optional[float] = None
    problems: int = 0
    mde_seeds: Optional[float] = None          # minimum detectable effect of the t-interval (directional claims)
    mde_problems: Optional[float] = None       # ... of the bootstrap over problems
    eq_margin_seeds: Optional[float] = None    # no-difference claims: the smallest margin the TOST over seeds
    eq_margin_problems: Optional[float] = None  # ... over problems would establish with 80 % power
    seeds_for_margin: Optional[int] = None     # no-difference claims: the seeds +-margin would need
    basis: str = B_NONE                        # what the verdict rests on
    verdict: str = NOT_RUN
    why: str = ""                              # why the verdict is not holds / does not hold
    paper_effect: Optional[float] = None       # the paper's own a - b (Claim.paper_effect)
    seeds_for_paper_effect: Optional[int] = None  # seeds that would detect it at the observed spread (80 %)
    costs: dict[str, dict[str, float]] = field(default_factory=dict)  # per arm ("a", "b"): run_costs of its runs
    eval_k: Optional[int] = None               # held-out metrics: samples per problem of the evaluation read
    eval_noise_share: Optional[float] = None   # evaluation sampling variance / variance of the per-seed differences
    per_seed: list[dict[str, Any]] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seed_offsets: list[int] = field(default_factory=list)  # of the runs in run_ids (their ulorl.seed_offset)
    first_start: Optional[int] = None          # earliest start (ms since the epoch) of those runs; None: unknown
    spec: str = ""                             # the spec file their runs name (ulorl.spec), "" when they name none

    @property
    def mde(self) -> Optional[float]:
        """The larger of the two minimum detectable effects (a verdict needs every interval)."""
        vals = [v for v in (self.mde_seeds, self.mde_problems) if v is not None]
        return max(vals) if vals else None

    @property
    def eq_margin(self) -> Optional[float]:
        """No-difference claims: the larger of the two smallest establishable margins."""
        vals = [v for v in (self.eq_margin_seeds, self.eq_margin_problems) if v is not None]
        return max(vals) if vals else None


def _empty(claim: Claim, sweep: str, notes: Optional[list[str]] = None) -> ClaimResult:
    return ClaimResult(claim.name, claim.paper_says, METRIC_TEXT[claim.metric], f"{claim.a.label} vs {claim.b.label}",
                       claim.direction, sweep, level=claim.level, margin=claim.margin, notes=list(notes or []),
                       paper_effect=claim.paper_effect, floor=claim.floor)


def evaluate_group(source: RunSource, claim: Claim, group: Sequence[RunInfo], sweep: str) -> Optional[ClaimResult]:
    """The claim on one sweep's runs; None when the sweep has neither arm (or one run in both); a
    ``not run`` row naming the missing arm when it has only one of them."""
    a_runs, b_runs = arm_runs(claim.a, group), arm_runs(claim.b, group)
    if (not a_runs and not b_runs) or set(r.run_id for r in a_runs) & set(r.run_id for r in b_runs):
        return None
    if not a_runs or not b_runs:
        absent = claim.a if not a_runs else claim.b
        return _empty(claim, sweep, [f"no FINISHED run of '{absent.label}' in this sweep yet"])
    res = _empty(claim, sweep)
    if claim.a.role == ROLE_RERUN:
        a_runs, note = one_config(a_runs)
        res.notes += note + ["re-run seeds only: seed 0 of the best configuration is the search trial that "
                             "picked it, left out"]
    a, notes_a = by_seed(a_runs)
    b, notes_b = by_seed(b_runs)
    res.notes += notes_a + notes_b
    alpha = 1.0 - claim.level
    bench = claim.bench
    seeds = sorted(set(a) & set(b))
    metric = claim.metric
    if claim.metric in PER_PROBLEM:
        paired_runs = [a[s] for s in seeds] + [b[s] for s in seeds]
        with_final = [r for r in paired_runs if schema.eval_metric(FINAL, "avg_at_k") in r.metrics]
        if paired_runs and len(with_final) == len(paired_runs):
            bench, metric = FINAL, M_HELDOUT
            res.notes.append(f"read the final evaluation ({FINAL}: eval.final, held-out problems no periodic eval "
                             "scored, so no search saw them)")
            if claim.metric == M_HELDOUT_SAMPLES:
                res.notes.append("the final evaluation is after the last step: arms compared at equal steps (equal "
                                 "rollout prompts), not equal trained samples; trained samples per run "
                                 + _samples_text(source, [a[s] for s in seeds], [b[s] for s in seeds]))
        else:
            if with_final:
                res.notes.append(f"{len(with_final)} of {len(paired_runs)} paired runs have the final evaluation "
                                 f"({FINAL}): it needs every one, so the periodic evals are read")
            if bench != "heldout" and not any(schema.eval_metric(bench, "avg_at_k") in r.metrics
                                              for r in list(a.values()) + list(b.values())):
                if claim.a.role == ROLE_RERUN:   # a selected configuration: only unseen problems may judge it
                    res.bench, res.seeds, res.verdict = bench, len(seeds), REFUSED
                    res.why = (f"no selection / confirmation split: the runs have neither {FINAL} (eval.final) nor "
                               f"{bench} (eval.select_problems), so the only held-out problems are the ones the "
                               "search selected on; re-run the sweep with eval.final or eval.select_problems")
                    res.notes.append(res.why)
                    return res
                res.notes.append(f"no {bench} part in these runs: scored on all held-out problems")
                bench = "heldout"
        res.bench = bench
    unpaired = sorted(set(a) ^ set(b))
    if unpaired:
        res.notes.append(f"{len(unpaired)} seed(s) with one arm only, left out: "
                         + ", ".join("/".join(s) for s in unpaired))
    budget = sample_budget(source, [a[s] for s in seeds] + [b[s] for s in seeds]) \
        if metric == M_HELDOUT_SAMPLES else None
    if budget is not None:
        res.notes.append(f"equal trained-samples budget {budget:.0f} (the fewest any run had at its last eval)")
    diffs, a_scores, b_scores, missing = [], [], [], []
    for s in seeds:
        sigma = a[s].float_param("algo.mpt.sigma")
        va = run_value(source, a[s], metric, budget, sigma, bench)
        vb = run_value(source, b[s], metric, budget, sigma, bench)
        if va.value is None or vb.value is None:
            missing += [v.note for v in (va, vb) if v.note]
            continue
        d = va.value - vb.value
        diffs.append(d)
        a_scores.append(va.scores)
        b_scores.append(vb.scores)
        res.run_ids += [a[s].run_id, b[s].run_id]
        res.per_seed.append({"seeds": dict(zip(SEED_KEYS, s)), "a_run": a[s].run_id, "b_run": b[s].run_id,
                             "a": va.value, "b": vb.value, "diff": d, "a_step": va.step, "b_step": vb.step})
    res.seeds = len(diffs)
    if missing:
        res.notes.append(f"{len(missing)} run(s) without the metric, their seeds left out: " + "; ".join(missing))
    if diffs:
        res.effect = float(np.mean(diffs))
    paired = [(a[s], b[s]) for s in seeds if a[s].run_id in res.run_ids]
    res.costs = {arm: run_costs(source, [pair[i] for pair in paired]) for i, arm in enumerate(("a", "b"))}
    if paired and all(arms_identical(source, ra, rb, bench if claim.metric in PER_PROBLEM else None)
                      for ra, rb in paired):
        res.verdict = ARMS_IDENTICAL
        res.why = (f"on all {len(paired)} seeds the two arms' runs are bit-identical ({ENTROPY} at every step, the "
                   "claim's metric and every per-problem score): the arms trained the same model, there is no "
                   "difference to test")
        res.notes.append(res.why)
        return res
    intervals = []
    used_seeds = used_problems = usable = False
    equivalence = claim.direction == 0
    if len(diffs) >= 2:
        usable, why = seed_interval_usable(diffs)
        if usable:
            _, res.t_low, res.t_high = t_interval(diffs, alpha)
            if equivalence:
                res.eq_margin_seeds = equivalence_margin_seeds(diffs)
            else:
                res.mde_seeds = mde_seeds(diffs, claim.level)
            intervals.append((res.t_low, res.t_high))
            used_seeds = True
        if claim.metric in PER_PROBLEM:
            x = pooled_problem_differences(a_scores, b_scores)
            if x is None:
                res.notes.append("no per-problem held-out scores shared by every run: no interval over problems")
            else:
                res.problem_effect, res.problem_low, res.problem_high = paired_bootstrap(x, [0.0] * len(x),
                                                                                         alpha=alpha)
                res.problems = len(x)
                if equivalence:
                    res.eq_margin_problems = equivalence_margin_problems(x)
                else:
                    res.mde_problems = mde_problems(x, claim.level)
                intervals.append((res.problem_low, res.problem_high))
                used_problems = True
        if not usable:
            res.notes.append(f"no t-interval across seeds: {why}; "
                             + ("the problem bootstrap alone cannot carry a verdict" if used_problems
                                else "no interval to judge by"))
    if equivalence and used_seeds and claim.margin is not None:
        res.seeds_for_margin = seeds_for_margin(float(np.std(diffs, ddof=1)), claim.margin)
        res.notes.append(f"equivalence within +-{claim.margin:g}: with 80 % power this design could establish a "
                         f"margin of {res.eq_margin:.3f} at best (two one-sided tests, true difference 0); "
                         f"+-{claim.margin:g} would need about {res.seeds_for_margin} seeds at the observed spread")
    if used_seeds and claim.metric in PER_PROBLEM:
        res.eval_k, res.eval_noise_share = eval_noise(source, res.per_seed, bench, diffs)
    if claim.paper_effect is not None and used_seeds:
        res.seeds_for_paper_effect = seeds_for_effect(float(np.std(diffs, ddof=1)), claim.paper_effect, claim.level)
    res.basis = {(True, True): B_BOTH, (False, True): B_PROBLEMS, (True, False): B_SEEDS}.get(
        (used_seeds, used_problems), B_NONE)
    res.verdict, res.why = judge(claim.direction, intervals, len(diffs), claim.margin, t_usable=usable,
                                   floor=claim.floor)
    return res


def evaluate_claims(source: RunSource, claims: Sequence[Claim] = CLAIMS,
                    finished_only: bool = True) -> list[ClaimResult]:
    """One result per (claim, sweep group with both arms); a claim without such a group: one ``not run`` row."""
    out: list[ClaimResult] = []
    for claim in claims:
        runs = [r for r in source.runs() if r.paper_ref in claim.paper_refs and r.kind in ("train", "")]
        skipped = [r for r in runs if finished_only and r.status != "FINISHED"]
        runs = [r for r in runs if r not in skipped]
        found = []
        for (sweep, parents), group in sorted(sweep_groups(runs).items()):
            has_baseline = any(r.tags.get(schema.ROLE_TAG) == ROLE_BASELINE for r in group)
            if has_baseline != claim.with_baseline:
                continue
            res = evaluate_group(source, claim, group, sweep + (f" ({parents})" if parents else ""))
            if res is not None:
                attach_run_provenance(res, group)
                found.append(res)
        if not found:
            found.append(_empty(claim, "", [f"produce the runs with: {claim.sweep}"]))
        if skipped:
            for res in found:
                res.notes.append(f"{len(skipped)} unfinished run(s) tagged {'/'.join(claim.paper_refs)} left out")
        out += found
    return drop_mirrored_rows(out)


def attach_run_provenance(res: ClaimResult, runs: Sequence[RunInfo]) -> None:
    """Set the row's ``seed_offsets``, ``first_start`` and ``spec`` from every run of its sweep group
    (the search trials that picked a configuration too): what the pre-registration check needs
    (``ulorl.report.preregistration``)."""
    res.seed_offsets = sorted({schema.int_param(r.tags.get(schema.SEED_TAG)) or 0 for r in runs})
    starts = [r.start_time for r in runs if r.start_time]
    res.first_start = min(starts) if len(starts) == len(runs) and starts else None
    specs = {r.tags.get(SPEC_TAG, "") for r in runs}
    res.spec = specs.pop() if len(specs) == 1 else ""


def mirror_of(r: ClaimResult, earlier: ClaimResult) -> Optional[int]:
    """+1 when ``r`` is ``earlier`` again, -1 when it is ``earlier`` negated: the same sweep, the same
    (a run, b run) pairs and per-seed differences, not all zero, equal to +-1 x earlier's (to 1e-12);
    else None."""
    if not r.per_seed or r.sweep != earlier.sweep or len(r.per_seed) != len(earlier.per_seed) \
            or ARMS_IDENTICAL in (r.verdict, earlier.verdict) or all(p["diff"] == 0 for p in r.per_seed):
        return None   # all-zero differences match anything: bit-identical arms say so row by row
    if [(p["a_run"], p["b_run"]) for p in r.per_seed] != [(p["a_run"], p["b_run"]) for p in earlier.per_seed]:
        return None
    for sign in (1, -1):
        if all(abs(p["diff"] - sign * q["diff"]) <= 1e-12 for p, q in zip(r.per_seed, earlier.per_seed)):
            return sign
    return None


def drop_mirrored_rows(results: Sequence[ClaimResult]) -> list[ClaimResult]:
    """``results`` without a row that repeats an earlier one, or negates it, on the same runs
    (``fig5_sigma_gap`` = -``fig5_entropy`` when every run ends below sigma): it adds no evidence and
    would count one comparison twice; the earlier row's notes say so."""
    kept: list[ClaimResult] = []
    for r in results:
        hit = next(((e, sign) for e in kept if (sign := mirror_of(r, e)) is not None), None)
        if hit is None:
            kept.append(r)
            continue
        e, sign = hit
        why = (": every run's final entropy is below its sigma, so |entropy - sigma| = sigma - entropy"
               if r.metric == METRIC_TEXT[M_SIGMA_GAP] and sign < 0 else "")
        e.notes.append(f"{r.claim} ({r.metric}, {r.arms}) is this row {'negated' if sign < 0 else 'again'} on "
                       f"the same runs (per-seed differences {'-' if sign < 0 else ''}1 x these{why}): not a row of "
                       "its own")
    return kept
