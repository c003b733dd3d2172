"""The paper's claims checked over seeds: an effect size, intervals, a minimum detectable effect and
a verdict per claim.

Every claim compares two arms of one sweep (runs with one ``ulorl.sweep`` tag, e.g. masking static
vs off) on one metric, paired by seed: the runs of the two arms with the same (data.seed,
rollout.seed, train.seed) form one pair, and d_s = metric(arm a, seed s) - metric(arm b, seed s).
Runs of one sweep made by several launches (seed offsets added in chunks, ``seed_offsets``) are
pooled when their fixed settings agree (:func:`sweep_groups`); the statistics are
:mod:`ulorl.eval.paired`'s:

- effect = mean_s d_s;
- held-out metrics read the final evaluation (``eval.final``: after the last step, on held-out
  problems no periodic eval scores) when every paired run has it, else the periodic evals;
- across seeds: the t-interval over the d_s, usable only with >= 3 seeds and a non-zero spread;
- over problems (held-out metrics only, where every run logged its per-problem CSV): the paired
  bootstrap over the held-out problems all runs share, each problem's score averaged over the
  seeds of its arm first;
- level: 95 % intervals for "a beats b" claims, 90 % for "a equals b within +-margin" (the two
  one-sided tests at alpha 0.05); the row states it;
- verdict (:func:`ulorl.eval.paired.judge`): directional claims hold when every interval excludes
  zero in the paper's direction, do not hold when every one excludes it in the other; a
  no-difference claim holds when every interval lies inside +-margin, does not hold when every one
  lies wholly outside; either needs the t-interval among the intervals (without it: inconclusive,
  and the row says why); anything else is inconclusive; fewer than 2 paired seeds (or 2 without a
  per-problem interval): "not enough seeds";
- "arms identical" when the two arms' runs are bit-identical on every seed; "refused" for a
  configuration a search selected when no held-out problems the search did not see exist;
- a row that repeats or negates an earlier one on the same runs is dropped (:func:`drop_mirrored_rows`);
- minimum detectable effect (directional claims): the true difference each interval would tell
  from zero with 80 % probability, given the observed spread, seeds and problems; the row shows
  the larger (both intervals must agree); no-difference claims show instead the smallest margin
  the two one-sided tests could establish with 80 % probability and the seeds their margin needs.

The headline claim (best tau x sigma vs masking off) reads only the re-run seeds of the best
configuration (seed 0 of the search picked it) on problems the search did not see: the final
evaluation's, else the confirmation part of the held-out problems (``eval/heldout_confirm/avg_at_k``,
``eval.select_problems``).

The paper's direction of every claim is written once, in :data:`CLAIMS`.

    results = evaluate_claims(RunStore.open(uri))          # or ResultsStore.open("experiments/results")
    Path("claims.md").write_text(claims_markdown(results))
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ulorl.eval.final import final_bench
from ulorl.eval.paired import (
    ARMS_IDENTICAL,
    FEW_SEEDS,
    HOLDS,
    INCONCLUSIVE,
    LEVEL_DIRECTIONAL,
    LEVEL_EQUIVALENCE,
    MIN_T_SEEDS,
    NOT_HOLD,
    POWER,
    REFUSED,
    equivalence_margin_problems,
    equivalence_margin_seeds,
    judge,
    mde_problems,
    mde_seeds,
    paired_bootstrap,
    pooled_problem_differences,
    pooled_problem_interval,
    sampling_variance,
    seed_interval_usable,
    seeds_for_effect,
    seeds_for_margin,
    t_cdf_two_sided,
    t_interval,
    t_quantile,
    verdict,
)
from ulorl.report.preregistration import (
    PREREG_RULE,
    UNKNOWN,
    preregistration_markdown,
    preregistration_of,
    repo_root,
)
from ulorl.report.store import RunInfo, RunSource
from ulorl.report.tables import cumulative_samples, point_at_budget, sample_budget
from ulorl.tracking import schema
from ulorl.tracking.provenance import SPEC_TAG
from ulorl.tracking.schema import ROLE_BASELINE, ROLE_RERUN, SEED_KEYS

HELDOUT = schema.eval_metric("heldout", "avg_at_k")
ENTROPY = "train/entropy"
FINAL_WINDOW = 10        # "final entropy": mean train/entropy over a run's last 10 logged steps
CONFIRM = "heldout_confirm"   # the held-out problems a search did not select on (eval.select_problems)
FINAL = final_bench("heldout")  # eval.final: after the last step, on held-out problems no periodic eval scores

# Metrics a claim can compare (see :func:`run_value`).
M_HELDOUT = "heldout_last"             # last eval/<bench>/avg_at_k (the final evaluation when every run has it)
M_HELDOUT_SAMPLES = "heldout_at_samples"  # last periodic eval within the group's equal trained-samples budget
M_ENTROPY = "entropy_final"            # mean train/entropy over the last FINAL_WINDOW steps
M_SIGMA_GAP = "entropy_gap_to_sigma"   # |entropy_final - algo.mpt.sigma of arm a's run of that seed|
METRIC_TEXT = {
    M_HELDOUT: "held-out avg@k, last eval",
    M_HELDOUT_SAMPLES: "held-out avg@k at equal trained samples",
    M_ENTROPY: f"train/entropy, mean of the last {FINAL_WINDOW} steps",
    M_SIGMA_GAP: f"|train/entropy (last {FINAL_WINDOW} steps) - sigma|",
}
PER_PROBLEM = (M_HELDOUT, M_HELDOUT_SAMPLES)

NOT_RUN = "not run"
# What a verdict rests on (ClaimResult.basis).
B_BOTH, B_PROBLEMS, B_SEEDS, B_NONE = "seeds + problems", "problems only", "seeds only", "—"


# ----------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Arm:
    """Runs of one side of a claim within a sweep.

    ``params``: (param, value) pairs the run's params must equal; value ``max`` / ``min`` = the
    largest / smallest numeric value of that param among the sweep's runs. ``role``: the
    ``ulorl.trial_role`` tag (``baseline``; ``rerun``: the best search trial re-run on seed
    offsets > 0, without the selected search trial itself)."""

    label: str
    params: tuple[tuple[str, str], ...] = ()
    role: str = ""


@dataclass(frozen=True)
class Claim:
    name: str
    paper_refs: tuple[str, ...]     # ulorl.paper_ref tags of the runs it reads
    metric: str                      # one of METRIC_TEXT
    a: Arm
    b: Arm
    direction: int                   # +1: the paper says a > b; -1: a < b; 0: a ~ b (within margin)
    paper_says: str
    sweep: str                       # the command that produces its runs
    margin: Optional[float] = None   # direction 0 only: |a - b| below this counts as equal
    floor: Optional[float] = None    # directional only: the practical-size floor, the smallest effect that matters
    with_baseline: bool = False      # True: sweeps with a baseline trial (headline); False: sweeps without
    bench: str = "heldout"           # held-out metrics: eval/<bench>/avg_at_k and its per-problem CSVs
    paper_effect: Optional[float] = None  # the paper's own a - b where it reports one (accuracy as a fraction)

    @property
    def level(self) -> float:
        """Interval level of its verdict: 90 % for a no-difference claim (TOST at alpha 0.05), else 95 %."""
        return LEVEL_EQUIVALENCE if self.direction == 0 else LEVEL_DIRECTIONAL


OFF = Arm("masking off", (("algo.mpt.mode", "off"),))
STATIC = Arm("static masking", (("algo.mpt.mode", "static"),))
DMMPT = Arm("DMMPTs", (("algo.mpt.mode", "dynamic"),))
TOIS = Arm("TOIS (S=1)", (("algo.is_mode", "tois"),))
SAIS = Arm("SAIS", (("algo.is_mode", "sais"),))
POIS = Arm("POIS", (("algo.is_mode", "pois"),))
LOOSE = Arm("loose (longest max_response_len)", (("rollout.max_response_len", "max"),))
TIGHT = Arm("tight (shortest max_response_len)", (("rollout.max_response_len", "min"),))
S_MPT = "ulorl-sweep sweeps/choice/mpt_mode.yaml"
S_LEN = "ulorl-sweep sweeps/choice/output_length.yaml"
S_IS = "ulorl-sweep sweeps/choice/is_mode.yaml"
S_HEAD = "ulorl-sweep sweeps/choice/mpt_threshold.yaml"

CLAIMS: tuple[Claim, ...] = (
    Claim("fig4_entropy", ("fig4",), M_ENTROPY, STATIC, OFF, +1,
          "Fig. 4: baseline entropy falls, static-masked entropy rises (without bound)", S_MPT),
    Claim("fig4_heldout", ("fig4",), M_HELDOUT, STATIC, OFF, +1,
          "not reported for static masking; implied: masking MPTs counters the over-training the paper "
          "blames for entropy collapse", S_MPT),
    Claim("fig5_entropy", ("fig4", "fig5"), M_ENTROPY, DMMPT, OFF, +1,
          "Fig. 5 vs Fig. 4: entropy under DMMPTs stays near sigma while the baseline's falls", S_MPT),
    Claim("fig5_sigma_gap", ("fig4", "fig5"), M_SIGMA_GAP, DMMPT, OFF, -1,
          "Fig. 5: entropy under DMMPTs stays near the target sigma", S_MPT),
    Claim("fig5_heldout", ("fig4", "fig5"), M_HELDOUT, DMMPT, OFF, +1,
          "Table 2: UloRL-A3B-128k 71.5 vs w/o DMMPTs 67.9 (AVG avg@32)", S_MPT, paper_effect=(71.5 - 67.9) / 100),
    Claim("table3_heldout", ("table3",), M_HELDOUT_SAMPLES, LOOSE, TIGHT, +1,
          "Table 3: longer training outputs score higher (AVG 62.9 at 32k, 69.2 at 64k, 71.5 at 128k)", S_LEN),
    Claim("fig2_pois_vs_tois", ("fig2",), M_HELDOUT, POIS, TOIS, 0,
          "Fig. 2: POIS accuracy nearly overlaps TOIS (equal within our margin 0.05)", S_IS, margin=0.05),
    Claim("fig2_pois_vs_sais", ("fig2",), M_HELDOUT, POIS, SAIS, +1,
          "Fig. 2: POIS beats SAIS at all output lengths", S_IS),
    Claim("fig2_sais_vs_tois", ("fig2",), M_HELDOUT, SAIS, TOIS, -1,
          "implied by Fig. 2: SAIS below POIS, which overlaps TOIS", S_IS),
    Claim("headline", ("fig5",), M_HELDOUT, Arm("best tau x sigma, re-run seeds", role=ROLE_RERUN),
          Arm("baseline (masking off)", role=ROLE_BASELINE), +1,
          "Table 2: DMMPTs 71.5 vs w/o DMMPTs 67.9 (AVG avg@32)", S_HEAD, with_baseline=True, bench=CONFIRM,
          paper_effect=(71.5 - 67.9) / 100),
    # DMMPTs beside the other entropy controls (runs tagged entropy_controls, sweeps/choice/entropy_controls.yaml):
    # each comparator vs off on final entropy and held-out, DMMPTs vs each comparator on held-out. Arms
    # pin both keys: the comparator arms run with algo.mpt.mode off.
    *(Claim(f"ec_{key}_{'entropy' if metric == M_ENTROPY else 'heldout'}", ("entropy_controls",), metric,
            Arm(label, (("algo.mpt.mode", "off"), ("algo.entropy_control.mode", key))),
            Arm("off", (("algo.mpt.mode", "off"), ("algo.entropy_control.mode", "off"))), +1, says,
            "ulorl-sweep sweeps/choice/entropy_controls.yaml")
      for key, label, says_entropy, says_heldout in (
          ("clip_cov", "Clip-Cov", "Cui et al. 2025: Clip-Cov keeps entropy well above the GRPO baseline's",
           "Cui et al. 2025: Clip-Cov +1.8 (Qwen2.5-7B) / +4.5 (32B) avg over 7 math benchmarks vs GRPO"),
          ("kl_cov", "KL-Cov", "Cui et al. 2025: KL-Cov keeps entropy >10x the GRPO baseline's plateau",
           "Cui et al. 2025: KL-Cov +2.0 (Qwen2.5-7B) / +6.4 (32B) avg over 7 math benchmarks vs GRPO"),
          ("high_entropy_minority", "80/20 (top-20 % entropy tokens)",
           "not reported as a figure by Wang et al. 2025; expected: dropping the low-entropy tokens' updates "
           "slows the entropy fall",
           "Wang et al. 2025: the top-20 % entropy tokens match full updates on Qwen3-8B and beat them on "
           "Qwen3-32B (+11.04 AIME'25)"))
      for metric, says in ((M_ENTROPY, says_entropy), (M_HELDOUT, says_heldout))),
    *(Claim(f"ec_dmmpt_vs_{key}_heldout", ("entropy_controls",), M_HELDOUT,
            Arm("DMMPTs", (("algo.mpt.mode", "dynamic"), ("algo.entropy_control.mode", "off"))),
            Arm(label, (("algo.mpt.mode", "off"), ("algo.entropy_control.mode", key))), +1,
            f"compared by no paper; 'holds' = DMMPTs score higher than {label}",
            "ulorl-sweep sweeps/choice/entropy_controls.yaml")
      for key, label in (("clip_cov", "Clip-Cov"), ("kl_cov", "KL-Cov"),
                         ("high_entropy_minority", "80/20 (top-20 % entropy tokens)"))),
)


# ----------------------------------------------------------------------------- pure statistics


def final_mean(values: Sequence[float], window: int = FINAL_WINDOW) -> Optional[float]:
    """Mean of the last ``window`` values (all of them when fewer); None when empty."""
    if not values:
        return None
    return float(np.mean(np.asarray(values[-window:], dtype=np.float64)))


# ----------------------------------------------------------------------------- selecting runs


def seed_key(run: RunInfo) -> tuple[str, ...]:
    """What pairs two arms' runs: their (data.seed, rollout.seed, train.seed) params."""
    return tuple(run.param(k, "0") for k in SEED_KEYS)


# Params that differ between runs of one launch without making them another configuration.
_NOT_CONFIG = SEED_KEYS + ("train.threads", "tracking.run_name", "train.output_dir")


def _config(run: RunInfo) -> dict[str, str]:
    return {k: v for k, v in run.params.items() if k not in _NOT_CONFIG}


def launch_settings(launches: dict[str, list[RunInfo]]) -> dict[str, dict[str, str]]:
    """Per launch (MLflow parent run id -> its runs): the params every run of it shares, without
    the keys that vary within any launch of the sweep (its arms) and the seeds."""
    varied = {k for runs in launches.values() for k in {k for r in runs for k in r.params}
              if len({r.param(k, "\0") for r in runs}) > 1}
    out = {}
    for parent, runs in launches.items():
        shared = {k: v for k, v in _config(runs[0]).items() if k not in varied
                  and all(r.param(k, "\0") == v for r in runs)}
        out[parent] = shared
    return out


def sweep_groups(runs: Sequence[RunInfo]) -> dict[tuple[str, str], list[RunInfo]]:
    """Runs by (sweep name, label): the launches (MLflow parents) of one sweep name are pooled when
    their shared settings (:func:`launch_settings`) agree on every key both have AND the later launch
    only adds seeds (no run of it repeats a configuration and seeds an earlier launch of the group
    ran), so seeds added by a later launch pair with the earlier ones; launches that differ (e.g.
    another learning rate after an edit of the spec) or that re-run seeds already run form groups of
    their own: a later run of a seed never replaces or joins an earlier one unseen. The label names
    every pooled parent (first 8 characters, ``+``-joined). Runs outside any sweep form the group ("", "")."""
    by_sweep: dict[str, list[RunInfo]] = {}
    for r in runs:
        by_sweep.setdefault(r.tags.get(schema.SWEEP_TAG, ""), []).append(r)
    out: dict[tuple[str, str], list[RunInfo]] = {}
    for sweep, rs in by_sweep.items():
        if not sweep:
            out[("", "")] = rs
            continue
        launches: dict[str, list[RunInfo]] = {}
        for r in rs:
            launches.setdefault(r.parent_id, []).append(r)
        settings = launch_settings(launches)
        clusters: list[tuple[dict[str, str], list[str]]] = []
        for parent in sorted(launches, key=lambda p: min((r.start_time, r.run_id) for r in launches[p])):
            mine, ran = settings[parent], {_run_key(r) for r in launches[parent]}
            for shared, parents, seen in clusters:
                if all(shared[k] == v for k, v in mine.items() if k in shared) and not (ran & seen):
                    shared.update(mine)
                    parents.append(parent)
                    seen |= ran
                    break
            else:
                clusters.append((dict(mine), [parent], set(ran)))
        for _, parents, _ in clusters:
            out[(sweep, "+".join(p[:8] for p in parents if p))] = [r for p in parents for r in launches[p]]
    return out


def _run_key(run: RunInfo) -> str:
    """A run's configuration and seeds: two runs with the same key are the same seed of one arm run twice."""
    return json.dumps([_config(run), seed_key(run)], sort_keys=True)


def _num(v: str) -> Optional[float]:
    try:
        return float(v)
    except ValueError:
        return None


def arm_runs(arm: Arm, group: Sequence[RunInfo]) -> list[RunInfo]:
    """Runs of ``group`` that belong to ``arm`` (see :class:`Arm`)."""
    runs = [r for r in group if not arm.role or r.tags.get(schema.ROLE_TAG) == arm.role]
    for param, value in arm.params:
        if value in ("max", "min"):
            nums = [x for x in (_num(r.param(param)) for r in group) if x is not None]
            if not nums:
                return []
            want = max(nums) if value == "max" else min(nums)
            runs = [r for r in runs if _num(r.param(param)) == want]
        else:
            runs = [r for r in runs if r.param(param) == value]
    return runs


def one_config(runs: Sequence[RunInfo]) -> tuple[list[RunInfo], list[str]]:
    """The runs of the most common configuration (ties: the latest started) and a note when
    others were left out (re-runs of two launches that picked different best trials)."""
    configs: dict[str, list[RunInfo]] = {}
    for r in runs:
        configs.setdefault(json.dumps(_config(r), sort_keys=True), []).append(r)
    if len(configs) <= 1:
        return list(runs), []
    keep = max(configs.values(), key=lambda rs: (len(rs), max(r.start_time for r in rs)))
    left = [r.run_id[:8] for rs in configs.values() if rs is not keep for r in rs]
    return keep, [f"{len(configs)} configurations among the re-runs; kept the most common, left out {', '.join(left)}"]


def by_seed(runs: Sequence[RunInfo]) -> tuple[dict[tuple[str, ...], RunInfo], list[str]]:
    """One run per seed key, the FIRST started (a seed counts once, and a later run of it may not replace
    the one that was planned: choosing between them after their results is choosing the result), and a
    note naming every duplicate left out."""
    out: dict[tuple[str, ...], RunInfo] = {}
    notes = []
    for r in sorted(runs, key=lambda r: (r.start_time, r.run_id)):
        key = seed_key(r)
        if key in out:
            notes.append(f"duplicate seed {'/'.join(key)}: run {r.run_id} left out, the first started "
                         f"{out[key].run_id} counts (a later run of a seed never replaces it)")
            continue
        out[key] = r
    return out, notes


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


# ----------------------------------------------------------------------------- writers


def _f(x: Optional[float], digits: int = 4) -> str:
    return "—" if x is None else f"{x:+.{digits}f}"


def _pct(level: float) -> str:
    return f"{100 * level:.0f}"


def interval_text(r: ClaimResult) -> str:
    """``seeds t95 [lo, hi]; problems boot95 [lo, hi] (P)`` (each part only when it exists)."""
    parts = []
    if r.t_low is not None:
        parts.append(f"seeds t{_pct(r.level)} [{_f(r.t_low)}, {_f(r.t_high)}]")
    if r.problem_low is not None:
        parts.append(f"problems boot{_pct(r.level)} [{_f(r.problem_low)}, {_f(r.problem_high)}] ({r.problems})")
    return "; ".join(parts) or "—"


def mde_text(r: ClaimResult, digits: int = 4) -> str:
    """``0.0512 (seeds 0.0512, problems 0.0301)``; a no-difference claim: ``margin 0.0700 (seeds 0.0700,
    problems 0.0410); +-0.05 needs ~14 seeds``; ``—`` without an interval."""
    if r.direction == 0:
        best, pairs = r.eq_margin, (("seeds", r.eq_margin_seeds), ("problems", r.eq_margin_problems))
    else:
        best, pairs = r.mde, (("seeds", r.mde_seeds), ("problems", r.mde_problems))
    if best is None:
        return "—"
    parts = [f"{name} {v:.{digits}f}" for name, v in pairs if v is not None]
    text = f"{best:.{digits}f}" + (f" ({', '.join(parts)})" if len(parts) > 1 else f" ({parts[0].split()[0]})")
    if r.direction == 0:
        text = "margin " + text + _needs(r)
    return text + _floor(r)


def _floor(r: ClaimResult) -> str:
    """The practical-size floor beside the MDE, when the claim sets one."""
    return "" if r.floor is None else f"; floor {r.floor:g}"


def _needs(r: ClaimResult) -> str:
    if r.margin is None or r.seeds_for_margin is None:
        return ""
    return f"; +-{r.margin:g} needs ~{r.seeds_for_margin} seeds"


def verdict_text(r: ClaimResult) -> str:
    """The verdict cell's reason, when the verdict is not one the intervals decided: no t-interval
    across seeds, a refused verdict; "" otherwise (the notes hold every reason in full)."""
    if r.verdict == REFUSED:
        return "no selection / confirmation split"
    if r.verdict in (INCONCLUSIVE, FEW_SEEDS) and "no t-interval" in r.why:
        return "no t-interval across seeds; the problem bootstrap alone decides nothing"
    return ""


CLAIMS_COLUMNS = ("Claim", "Paper says", "Arms (a vs b)", "Metric", "Sweep", "Seeds", "Effect (a - b)", "Interval",
                  "Level", "Verdict rests on", "MDE", "Verdict", "Run ids")

RULES = [
    "- Effect: mean over seeds of the per-seed difference a - b (runs paired by data.seed, rollout.seed, "
    "train.seed, within one sweep; launches of one sweep pooled when their fixed settings agree). seeds tNN: "
    f"t-interval over the per-seed differences, used only with >= {MIN_T_SEEDS} seeds and a non-zero spread; "
    "problems bootNN: paired bootstrap over the held-out problems every run shares, each problem averaged over "
    "seeds first. Level: 95 % for 'a beats b' claims, 90 % for 'a equals b within +-margin' (two one-sided "
    "tests at alpha 0.05).",
    "- Verdict: a directional claim 'holds' only if every interval excludes zero in the paper's direction, 'does "
    "not hold' if every one excludes it in the opposite direction; a no-difference claim holds if every interval "
    "lies inside +-margin (ours), does not hold if every one lies wholly outside it; else 'inconclusive'. Fewer "
    "than 2 paired seeds, or 2 without an interval over problems: 'not enough seeds'. Only FINISHED runs count.",
    f"- 'holds' / 'does not hold' need the t-interval across seeds (>= {MIN_T_SEEDS} seeds with a spread): without "
    "it the row is 'inconclusive' whatever the problem bootstrap says (it sees one draw of the training seeds). "
    f"'{ARMS_IDENTICAL}': the two arms' runs are bit-identical on every seed. '{REFUSED}': a configuration a "
    "search selected, with no held-out problems the search did not see (no eval.final, no eval.select_problems). "
    "A row that repeats or negates another on the same runs is not shown (the other row's notes say so).",
    f"- MDE (minimum detectable effect): the true difference an interval of the row's level would tell from zero "
    f"with {100 * POWER:.0f} % probability given the observed spread: (t_(1+level)/2,n-1 + t_{POWER:.2f},n-1) x "
    "sd / sqrt(n) over seeds, (z_(1+level)/2 + z_0.80) x sd / sqrt(P) over problems; the larger one is shown "
    "first (both intervals must agree). An inconclusive row leaves effects of about this size undecided. "
    f"A no-difference claim shows instead the smallest margin its design could establish with {100 * POWER:.0f} % "
    "probability when the true difference is 0 (two one-sided tests at alpha 0.05: (t_0.95,n-1 + t_0.90,n-1) x "
    "sd / sqrt(n), z over problems) and the seeds its own margin would need at the observed spread.",
    "- Run ids: first 8 characters (claims.json has them in full, per seed).",
]


def claims_markdown(results: Sequence[ClaimResult]) -> str:
    """The verdict table with one row per (claim, sweep) and the notes under it."""
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["### The paper's claims over seeds", "",
             "| " + " | ".join(CLAIMS_COLUMNS) + " |", "|" + "|".join("---" for _ in CLAIMS_COLUMNS) + "|"]
    for r in results:
        per_seed = ", ".join(_f(p["diff"]) for p in r.per_seed)
        effect = _f(r.effect) + (f" (per seed {per_seed})" if len(r.per_seed) > 1 else "")
        metric = r.metric + (f" ({r.bench})" if r.bench and r.bench != "heldout" else "")
        level = f"{_pct(r.level)} %" + (f", margin +-{r.margin:g}" if r.margin is not None else "")
        cells = [r.claim, r.paper_says, r.arms, metric, r.sweep or "—", str(r.seeds), effect, interval_text(r),
                 level, r.basis, mde_text(r), f"**{r.verdict}**" + (f" ({verdict_text(r)})" if verdict_text(r) else ""),
                 " ".join(rid[:8] for rid in r.run_ids) or "—"]
        lines.append("| " + " | ".join(esc(c) for c in cells) + " |")
    lines += [""] + RULES
    for r in results:
        lines += [f"- {r.claim} ({r.sweep or 'no sweep'}): {n}" for n in r.notes]
    return "\n".join(lines) + "\n"


DOCS_COLUMNS = ("claim", "sweep", "seeds", "effect a - b (per seed)", "t-interval across seeds",
                "paired bootstrap over problems", "MDE (no-difference claims: smallest margin)", "verdict")
DOCS_BEGIN, DOCS_END = "<!-- claims-table:begin -->", "<!-- claims-table:end -->"


# A sweep named <folder>_<rest> in these folders is sweeps/<folder>/<rest>.yaml (its ``name:``).
SWEEP_FOLDERS = ("choice", "entropy")


def _sweep_command(r: ClaimResult, claims: Sequence[Claim]) -> str:
    name = r.sweep.split(" ")[0]
    for folder in SWEEP_FOLDERS:
        if name.startswith(folder + "_"):
            return f"`ulorl-sweep sweeps/{folder}/{name[len(folder) + 1:]}.yaml`"
    cmd = next((c.sweep for c in claims if c.name == r.claim), "")
    return f"`{cmd}`" if cmd else "—"


@dataclass(frozen=True)
class _Cells:
    """The cells both claims tables share, formatted once: held-out metrics to 3 decimals, entropy
    (nats / token) to 4."""
    digits: int
    claim: str
    t: str
    problems: str
    mde: str
    margin: str

    @classmethod
    def of(cls, r: ClaimResult) -> _Cells:
        d = 3 if r.bench else 4
        return cls(
            digits=d,
            claim=f"{r.claim}: {r.arms}" + (f", {r.bench}" if r.bench and r.bench != "heldout" else ""),
            t=f"[{_f(r.t_low, d)}, {_f(r.t_high, d)}]" if r.t_low is not None else "—",
            problems=f"[{_f(r.problem_low, d)}, {_f(r.problem_high, d)}]" if r.problem_low is not None else "—",
            mde=_mde_cell(r, d),
            margin=f", margin +-{r.margin:g}" if r.margin is not None else "",
        )


def _mde_cell(r: ClaimResult, d: int) -> str:
    """The MDE of a directional row; a no-difference row's smallest establishable margin and the seeds
    its own margin would need."""
    if r.direction == 0:
        return "—" if r.eq_margin is None else f"margin {r.eq_margin:.{d}f}{_needs(r)}"
    return ("—" if r.mde is None else f"{r.mde:.{d}f}") + _floor(r)


def _verdict_cell(r: ClaimResult, c: _Cells, level: str = "") -> str:
    """``**inconclusive** (95 %, seeds + problems)``, with the reason when the intervals did not decide."""
    inside = ", ".join(x for x in (level, r.basis if r.basis != B_NONE else "") if x) + (
        c.margin if r.basis != B_NONE else "")
    why = verdict_text(r)
    inside = "; ".join(x for x in (inside, why) if x)
    return f"**{r.verdict}**" + (f" ({inside})" if inside else "")


def _table_head(columns: Sequence[str]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]


def _table_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def docs_table(results: Sequence[ClaimResult], claims: Sequence[Claim] = CLAIMS) -> str:
    """The claims table of ``platform/ulorl/docs/paper_claims.md`` (between :data:`DOCS_BEGIN` and
    :data:`DOCS_END`): three decimals, the level beside each interval and verdict."""
    lines = _table_head(DOCS_COLUMNS)
    for r in results:
        c = _Cells.of(r)
        per_seed = ", ".join(_f(p["diff"], c.digits) for p in r.per_seed)
        effect = _f(r.effect, c.digits) + (f" ({per_seed})" if len(r.per_seed) > 1 else "")
        level = f"{_pct(r.level)} %"
        t = f"{c.t} ({level})" if r.t_low is not None else c.t
        pb = f"{c.problems} ({level}, {r.problems} problems)" if r.problem_low is not None else c.problems
        lines.append(_table_row((c.claim, _sweep_command(r, claims), str(r.seeds), effect, t, pb, c.mde,
                                 _verdict_cell(r, c))))
    return "\n".join(lines) + "\n"


SUMMARY_COLUMNS = ("claim (paper)", "seeds", "effect a - b", "t-interval across seeds",
                   "bootstrap over problems", "MDE (no-difference: smallest margin)", "verdict", "command")
SUMMARY_BEGIN, SUMMARY_END = "<!-- claims-summary:begin -->", "<!-- claims-summary:end -->"


def summary_table(results: Sequence[ClaimResult], claims: Sequence[Claim] = CLAIMS) -> str:
    """The README's short claims table (between :data:`SUMMARY_BEGIN` and :data:`SUMMARY_END`): the
    paper's own claims only (the entropy-control comparisons stay on the docs page), without the
    per-seed differences."""
    paper = {c.name for c in claims if "entropy_controls" not in c.paper_refs}
    lines = _table_head(SUMMARY_COLUMNS)
    for r in results:
        if r.claim not in paper:
            continue
        c = _Cells.of(r)
        v = _verdict_cell(r, c, f"{_pct(r.level)} %" if r.basis != B_NONE else "")
        lines.append(_table_row((c.claim, str(r.seeds), _f(r.effect, c.digits), c.t, c.problems, c.mde, v,
                                 _sweep_command(r, claims))))
    return "\n".join(lines) + "\n"


READING_BEGIN, READING_END = "<!-- claims-reading:begin -->", "<!-- claims-reading:end -->"


def _sweep_name(r: ClaimResult) -> str:
    return r.sweep.split(" ")[0]


def _seeds(n: int) -> str:
    return f"{n} seed" + ("s" if n != 1 else "")


def reading_markdown(results: Sequence[ClaimResult]) -> str:
    """What the claims table says, in sentences whose every number comes from ``results`` (the block
    between :data:`READING_BEGIN` and :data:`READING_END` of ``platform/ulorl/docs/paper_claims.md``):
    per row with runs its effect, how many seeds point each way, the interval(s), the verdict and
    why, what the design could have detected (or the smallest margin a no-difference claim could
    establish), the paper's own difference beside it; then per sweep what its runs cost."""
    lines = []
    for r in results:
        if not r.seeds and r.verdict == NOT_RUN:
            lines.append(f"- **{r.claim}** ({r.arms}): not run; {_sweep_command(r, CLAIMS)} produces it.")
            continue
        c = _Cells.of(r)
        d = c.digits
        head = f"- **{r.claim}** ({r.arms}; `{_sweep_name(r)}`, {_seeds(r.seeds)}" + (
            f", {r.bench}" if r.bench and r.bench != "heldout" else "") + ")"
        if r.verdict == REFUSED:
            lines.append(f"{head}: **{r.verdict}**: {r.why}.")
            continue
        if r.verdict == ARMS_IDENTICAL:
            lines.append(f"{head}: **{r.verdict}**: the two arms' runs are bit-identical on all {r.seeds} seeds, "
                         "so there is no difference to test.")
            continue
        diffs = [p["diff"] for p in r.per_seed]
        up, down = sum(x > 0 for x in diffs), sum(x < 0 for x in diffs)
        ivs = [f"seeds t{_pct(r.level)} {c.t}"] * (r.t_low is not None) + [
            f"problems boot{_pct(r.level)} {c.problems} over {r.problems} problems"] * (r.problem_low is not None)
        text = (f"{head}: a - b = {_f(r.effect, d)}, above zero in {up} and below in {down} of {_seeds(len(diffs))}"
                + (f"; {'; '.join(ivs)}" if ivs else "") + f": **{r.verdict}**")
        text += f" ({r.why})." if r.why and r.verdict in (INCONCLUSIVE, FEW_SEEDS) and "no t-interval" in r.why \
            else "."
        if r.direction == 0 and r.eq_margin is not None and r.margin is not None:
            side = "above" if r.eq_margin > r.margin else "inside"
            text += (f" The smallest margin this design could establish with {100 * POWER:.0f} % power is "
                     f"{r.eq_margin:.{d}f}, {side} its +-{r.margin:g}")
            text += (f"; +-{r.margin:g} would need about {r.seeds_for_margin} seeds at this spread."
                     if r.seeds_for_margin else ".")
        elif r.mde is not None and r.verdict == INCONCLUSIVE:
            text += f" A true difference below about {r.mde:.{d}f} could hide here ({100 * POWER:.0f} % power)."
        if r.eval_noise_share is not None:
            text += (f" Evaluation sampling alone (k = {r.eval_k}, {r.problems} problems) explains about "
                     f"{100 * r.eval_noise_share:.0f} % of the per-seed differences' variance.")
        if r.paper_effect is not None and r.mde is not None:
            rel = "below" if abs(r.paper_effect) < r.mde else "above"
            text += f" The paper's own difference, {r.paper_effect:+.3f}, is {rel} this MDE"
            text += (f"; detecting it at this spread would take about {r.seeds_for_paper_effect} seeds."
                     if r.seeds_for_paper_effect else ".")
        lines.append(text)
    done: set[str] = set()
    cost_lines = []
    for r in results:
        name = _sweep_name(r)
        if not all(r.costs.get(arm) for arm in ("a", "b")) or name in done:
            continue
        done.add(name)
        parts = []
        for label, k in zip(r.arms.split(" vs "), (r.costs["a"], r.costs["b"])):
            text = f"{label}: {k['wall_s'] / 60:.1f} min per run"
            if "eval_share" in k:
                text += f", {100 * k['eval_share']:.1f} % of it in periodic evals"
            if "final_share" in k:
                text += f", {100 * k['final_share']:.1f} % in the final evaluation"
            parts.append(text)
        counts = {int(r.costs[arm]["runs"]) for arm in ("a", "b")}
        read = "" if counts == {r.seeds} else f", {'/'.join(str(int(r.costs[arm]['runs'])) for arm in ('a', 'b'))} " \
            "of them in one sitting"
        cost_lines.append(f"- `{name}` ({_seeds(r.seeds)}{read}): " + "; ".join(parts) + ".")
    if cost_lines:
        lines += ["", "Wall time of the runs (`time/wall_s`, `time/eval_s`, `time/final_eval_s` in the results files; "
                  "runs resumed from a checkpoint left out; the machines were shared, see below):", ""] + cost_lines
    return "\n".join(lines) + "\n"


FINAL_COST_BEGIN, FINAL_COST_END = "<!-- claims-final-cost:begin -->", "<!-- claims-final-cost:end -->"
PREREG_BEGIN, PREREG_END = "<!-- claims-preregistration:begin -->", "<!-- claims-preregistration:end -->"


def final_cost_markdown(results: Sequence[ClaimResult]) -> str:
    """What the final evaluation (``eval.final``) cost, per sweep whose claim rows read it, from the
    paired runs' ``time/final_eval_s``, ``time/eval_s`` and ``time/wall_s`` (:func:`run_costs`): per arm
    its seconds, its share of a run's wall time, what it adds to the run without it, and how many times
    the run's periodic evals together it took (the block between :data:`FINAL_COST_BEGIN` and
    :data:`FINAL_COST_END` of ``platform/ulorl/docs/paper_claims.md``)."""
    lines, done = [], set()
    for r in results:
        name = _sweep_name(r)
        arms = [r.costs.get(arm, {}) for arm in ("a", "b")]
        if r.bench != FINAL or name in done or not all("final_eval_s" in k for k in arms):
            continue
        done.add(name)
        size = ""
        if all("final_k" in k for k in arms) and len({(k["final_k"], k["final_problems"]) for k in arms}) == 1:
            size = f", k = {arms[0]['final_k']:.0f} on {arms[0]['final_problems']:.0f} problems"
        parts = []
        for label, k in zip(r.arms.split(" vs "), arms):
            lo, hi, n = k["final_min_s"], k["final_max_s"], int(k["runs"])
            secs = f"{lo:.0f} s" if n == 1 else f"{lo:.0f}-{hi:.0f} s over {n} runs"
            text = (f"{label}: {secs}, {100 * k['final_share']:.1f} % of a run "
                    f"(+{100 * k['final_added']:.1f} % on the run without it)")
            if "final_vs_periodic" in k:
                text += f", {k['final_vs_periodic']:.1f} x its periodic evals together"
            parts.append(text)
        lines.append(f"- `{name}` ({_seeds(r.seeds)}{size}): " + "; ".join(parts) + ".")
    if not lines:
        return "No results file holds a final evaluation yet.\n"
    return ("The final evaluation's cost, measured on each arm's paired runs that ran in one sitting (a run "
            "resumed from a checkpoint is left out: its wall time spans sittings). The machines were shared "
            "with other work, so the seconds of one run and the next differ many times over; the shares are "
            "each run's own, averaged:\n\n" + "\n".join(lines) + "\n")


def replace_docs_table(text: str, table: str, begin: str = DOCS_BEGIN, end: str = DOCS_END) -> str:
    """``text`` with the block between ``begin`` and ``end`` replaced by ``table``."""
    m = re.search(re.escape(begin) + r"\n.*?" + re.escape(end), text, flags=re.S)
    if m is None:
        raise ValueError(f"no {begin} ... {end} block to replace")
    return text[: m.start()] + begin + "\n" + table + end + text[m.end():]


def update_docs(text: str, results: Sequence[ClaimResult]) -> str:
    """``text`` with every claims block it holds rewritten: the full table (:func:`docs_table`), the
    README's summary (:func:`summary_table`), the reading of the table (:func:`reading_markdown`) and
    the final evaluation's cost (:func:`final_cost_markdown`); a ValueError when it holds none."""
    blocks = ((DOCS_BEGIN, DOCS_END, docs_table), (SUMMARY_BEGIN, SUMMARY_END, summary_table),
              (READING_BEGIN, READING_END, reading_markdown),
              (FINAL_COST_BEGIN, FINAL_COST_END, final_cost_markdown),
              (PREREG_BEGIN, PREREG_END, preregistration_markdown))
    present = [(b, e, make) for b, e, make in blocks if b in text]
    if not present:
        raise ValueError(f"no {DOCS_BEGIN} or {SUMMARY_BEGIN} block to replace")
    for begin, end, make in present:
        text = replace_docs_table(text, make(results), begin, end)
    return text


def claims_json(results: Sequence[ClaimResult]) -> str:
    return json.dumps([{**asdict(r), "mde": r.mde} for r in results], indent=1)


def write_claims(source: RunSource, out_dir: str | Path) -> dict[str, Any]:
    """Write ``claims.md`` and ``claims.json`` into ``out_dir``; returns ``{"files": [...], "rows":
    [{claim, sweep, seeds, effect, verdict, level, mde}, ...], "results": [ClaimResult, ...]}``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = evaluate_claims(source)
    md, js = out / "claims.md", out / "claims.json"
    md.write_text(claims_markdown(results) + "\n### Pre-registration\n\n" + PREREG_RULE + "\n\n"
                  + preregistration_markdown(results))
    js.write_text(claims_json(results))
    repo = repo_root()
    prereg = {id(r): p.status for r in results if (p := preregistration_of(r, repo)) is not None}
    rows = [{"claim": r.claim, "sweep": r.sweep, "seeds": r.seeds, "effect": r.effect, "verdict": r.verdict,
             "level": r.level, "mde": r.mde, "basis": r.basis, "preregistered": prereg.get(id(r), UNKNOWN)}
            for r in results]
    return {"files": [str(md), str(js)], "rows": rows, "results": results}


__all__ = ["ARMS_IDENTICAL", "CLAIMS", "REFUSED", "Arm", "Claim", "ClaimResult", "arms_identical", "claims_json",
           "claims_markdown", "docs_table", "drop_mirrored_rows", "evaluate_claims", "final_cost_markdown", "judge",
           "mirror_of",
           "reading_markdown", "run_costs",
           "pooled_problem_interval", "replace_docs_table", "summary_table", "t_cdf_two_sided", "t_interval",
           "t_quantile", "update_docs", "verdict", "write_claims", "FEW_SEEDS", "HOLDS", "INCONCLUSIVE", "NOT_HOLD",
           "NOT_RUN"]
