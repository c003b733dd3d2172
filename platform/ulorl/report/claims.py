"""The paper's claims checked over seeds: an effect size, intervals and a verdict per claim.

Every claim compares two arms of one sweep (runs of one MLflow parent, e.g. masking static vs off)
on one metric, paired by seed: the runs of the two arms with the same (data.seed, rollout.seed,
train.seed) form one pair, and d_s = metric(arm a, seed s) - metric(arm b, seed s).

- effect = mean_s d_s;
- across seeds: the t-interval mean(d) +- t_{1-alpha/2, n-1} * sd(d) / sqrt(n) (sd with n - 1);
- over problems (held-out metrics only, where every run logged its per-problem CSV): the paired
  bootstrap of :func:`ulorl.sweep.ranking.paired_bootstrap` over the held-out problems all runs share,
  each problem's score averaged over the seeds of its arm first (problems pooled across seeds);
- verdict (:func:`verdict`): "holds" only if every available interval excludes zero in the paper's
  direction, "does not hold" if every one excludes it in the opposite direction, "inconclusive"
  otherwise; fewer than 2 seeds: "not enough seeds" (no interval across seeds exists).
  A claim of no difference (direction 0, "POIS nearly overlaps TOIS") holds only if every interval
  lies inside +-margin (our equivalence margin, not the paper's), does not hold if every interval
  excludes zero.

The paper's direction of every claim is written once, in :data:`CLAIMS`.

    results = evaluate_claims(RunStore.open(uri))
    Path("claims.md").write_text(claims_markdown(results))
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ulorl.report.store import RunInfo, RunStore
from ulorl.report.tables import cumulative_samples, point_at_budget, sample_budget
from ulorl.sweep.ranking import (
    ROLE_BASELINE,
    ROLE_RERUN,
    ROLE_SEARCH,
    best_index,
    paired_bootstrap,
    parse_per_problem_csv,
)
from ulorl.sweep.spec import SEED_KEYS
from ulorl.tracking import schema

ALPHA = 0.05
HELDOUT = schema.eval_metric("heldout", "avg_at_k")
ENTROPY = "train/entropy"
FINAL_WINDOW = 10        # "final entropy": mean train/entropy over a run's last 10 logged steps

# Metrics a claim can compare (see :func:`run_value`).
M_HELDOUT = "heldout_final"            # last periodic eval/heldout/avg_at_k
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

HOLDS, NOT_HOLD, INCONCLUSIVE, FEW_SEEDS, NOT_RUN = (
    "holds", "does not hold", "inconclusive", "not enough seeds", "not run")


# ----------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Arm:
    """Runs of one side of a claim within a sweep.

    ``params``: (param, value) pairs the run's params must equal; value ``max`` / ``min`` = the
    largest / smallest numeric value of that param among the sweep's runs. ``role``: the
    ``ulorl.trial_role`` tag (``baseline``), or ``best``: the best search trial and its re-runs."""

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
    with_baseline: bool = False      # True: sweeps with a baseline trial (headline); False: sweeps without


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
          "Table 2: UloRL-A3B-128k 71.5 vs w/o DMMPTs 67.9 (AVG avg@32)", S_MPT),
    Claim("table3_heldout", ("table3",), M_HELDOUT_SAMPLES, LOOSE, TIGHT, +1,
          "Table 3: longer training outputs score higher (AVG 62.9 at 32k, 69.2 at 64k, 71.5 at 128k)", S_LEN),
    Claim("fig2_pois_vs_tois", ("fig2",), M_HELDOUT, POIS, TOIS, 0,
          "Fig. 2: POIS accuracy nearly overlaps TOIS (equal within our margin 0.05)", S_IS, margin=0.05),
    Claim("fig2_pois_vs_sais", ("fig2",), M_HELDOUT, POIS, SAIS, +1,
          "Fig. 2: POIS beats SAIS at all output lengths", S_IS),
    Claim("fig2_sais_vs_tois", ("fig2",), M_HELDOUT, SAIS, TOIS, -1,
          "implied by Fig. 2: SAIS below POIS, which overlaps TOIS", S_IS),
    Claim("headline", ("fig5",), M_HELDOUT, Arm("best tau x sigma", role="best"),
          Arm("baseline (masking off)", role=ROLE_BASELINE), +1,
          "Table 2: DMMPTs 71.5 vs w/o DMMPTs 67.9 (AVG avg@32)", S_HEAD, with_baseline=True),
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


def t_cdf_two_sided(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with integer ``df`` >= 1 (Abramowitz & Stegun 26.7.3 / 26.7.4,
    finite sums in cos(theta), theta = atan(t / sqrt(df)))."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if t <= 0:
        return 0.0
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for k in range(2, df - 1, 2):      # (1 3 ... (k-1)) / (2 4 ... k) cos^k
            term *= c2 * (k - 1) / k
            total += term
        return s * total
    if df == 1:
        return 2.0 * theta / math.pi
    term = math.cos(theta)
    total = term
    for k in range(3, df - 1, 2):          # (2 4 ... (k-1)) / (3 5 ... k) cos^k
        term *= c2 * (k - 1) / k
        total += term
    return 2.0 / math.pi * (theta + s * total)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t with ``df`` degrees of freedom, by bisection:
    ``t_quantile(0.975, 2) = 4.303``."""
    if not 0.5 < p < 1.0:
        raise ValueError(f"p must be in (0.5, 1), got {p}")
    target = 2.0 * p - 1.0
    lo, hi = 0.0, 1.0
    while t_cdf_two_sided(hi, df) < target:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf_two_sided(mid, df) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def t_interval(diffs: Sequence[float], alpha: float = ALPHA) -> tuple[float, float, float]:
    """(mean, low, high) of the per-seed differences ``diffs`` (Float[n], n >= 2):
    mean +- t_{1-alpha/2, n-1} * sd / sqrt(n), sd with n - 1 in the denominator."""
    x = np.asarray(diffs, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"a t-interval needs >= 2 seeds, got {x.size}")
    mean = float(x.mean())
    half = t_quantile(1.0 - alpha / 2.0, int(x.size) - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half


def pooled_problem_interval(a: Sequence[dict[str, float]], b: Sequence[dict[str, float]]
                            ) -> Optional[tuple[float, float, float, int]]:
    """Paired bootstrap over held-out problems, pooled across seeds: ``a[s]`` / ``b[s]`` are the
    per-problem scores (problem id -> accuracy) of the two arms' runs of seed s. Each problem's
    score is averaged over seeds within its arm, then :func:`paired_bootstrap` resamples the problems
    every run has. Returns (difference, low, high, problems), None without a common problem."""
    if not a or len(a) != len(b) or not all(a) or not all(b):
        return None
    common = set.intersection(*(set(s) for s in list(a) + list(b)))
    if not common:
        return None
    ids = sorted(common)
    a_mean = [float(np.mean([s[i] for s in a])) for i in ids]
    b_mean = [float(np.mean([s[i] for s in b])) for i in ids]
    d, lo, hi = paired_bootstrap(a_mean, b_mean)
    return d, lo, hi, len(ids)


def verdict(direction: int, intervals: Sequence[tuple[float, float]], n_seeds: int,
            margin: Optional[float] = None) -> str:
    """Verdict from the available intervals (low, high) of a - b, see the module docstring."""
    if n_seeds < 2:
        return FEW_SEEDS
    if not intervals:
        return INCONCLUSIVE
    if direction == 0:
        if margin is not None and all(-margin < lo and hi < margin for lo, hi in intervals):
            return HOLDS
        if all(lo > 0 for lo, _ in intervals) or all(hi < 0 for _, hi in intervals):
            return NOT_HOLD
        return INCONCLUSIVE
    if direction not in (-1, 1):
        raise ValueError(f"direction must be -1, 0 or +1, got {direction}")
    with_paper = [lo > 0 if direction > 0 else hi < 0 for lo, hi in intervals]
    against = [hi < 0 if direction > 0 else lo > 0 for lo, hi in intervals]
    if all(with_paper):
        return HOLDS
    if all(against):
        return NOT_HOLD
    return INCONCLUSIVE


def final_mean(values: Sequence[float], window: int = FINAL_WINDOW) -> Optional[float]:
    """Mean of the last ``window`` values (all of them when fewer); None when empty."""
    if not values:
        return None
    return float(np.mean(np.asarray(values[-window:], dtype=np.float64)))


# ----------------------------------------------------------------------------- selecting runs


def seed_key(run: RunInfo) -> tuple[str, ...]:
    """What pairs two arms' runs: their (data.seed, rollout.seed, train.seed) params."""
    return tuple(run.param(k, "0") for k in SEED_KEYS)


def sweep_groups(runs: Sequence[RunInfo]) -> dict[tuple[str, str], list[RunInfo]]:
    """Runs by (sweep name, MLflow parent run): the arms of a claim come from one sweep
    (runs outside any sweep form the group ("", ""))."""
    out: dict[tuple[str, str], list[RunInfo]] = {}
    for r in runs:
        sweep = r.tags.get(schema.SWEEP_TAG, "")
        out.setdefault((sweep, r.parent_id if sweep else ""), []).append(r)
    return out


def _num(v: str) -> Optional[float]:
    try:
        return float(v)
    except ValueError:
        return None


_NOT_CONFIG = SEED_KEYS + ("train.threads", "tracking.run_name")


def _config(run: RunInfo) -> dict[str, str]:
    return {k: v for k, v in run.params.items() if k not in _NOT_CONFIG}


def best_runs(group: Sequence[RunInfo], objective: str = HELDOUT) -> list[RunInfo]:
    """The best search trial and its re-runs on other seeds: the search run with the config of the
    re-runs when there are any, else the best ``objective`` (ties: smaller run name, as the sweep)."""
    search = [r for r in group if r.tags.get(schema.ROLE_TAG, ROLE_SEARCH) == ROLE_SEARCH]
    reruns = [r for r in group if r.tags.get(schema.ROLE_TAG) == ROLE_RERUN]
    if reruns:
        same = [r for r in search if _config(r) == _config(reruns[0])]
        if same:
            return same[-1:] + reruns
    i = best_index([r.metrics.get(objective) for r in search], [r.name for r in search])
    return [search[i]] + reruns if i is not None else []


def arm_runs(arm: Arm, group: Sequence[RunInfo]) -> list[RunInfo]:
    """Runs of ``group`` that belong to ``arm`` (see :class:`Arm`)."""
    if arm.role == "best":
        return best_runs(group)
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


def by_seed(runs: Sequence[RunInfo]) -> tuple[dict[tuple[str, ...], RunInfo], list[str]]:
    """One run per seed key (the latest started wins) and a note per run it replaced."""
    out: dict[tuple[str, ...], RunInfo] = {}
    notes = []
    for r in sorted(runs, key=lambda r: (r.start_time, r.run_id)):
        if seed_key(r) in out:
            notes.append(f"run {out[seed_key(r)].run_id} replaced by the later {r.run_id} (same seeds)")
        out[seed_key(r)] = r
    return out, notes


# ----------------------------------------------------------------------------- reading metrics


def per_problem_scores(store: RunStore, run_id: str, step: Optional[int] = None,
                       bench: str = "heldout") -> dict[str, float]:
    """Per-problem accuracies of the run's periodic eval at ``step`` (None: the last one); {} when absent."""
    try:
        files = [f.path for f in store.client.list_artifacts(run_id, "eval")]
    except Exception:  # noqa: BLE001 -- a run without artifacts has no per-problem scores
        return {}
    prefix = f"eval/{bench}_per_problem_step_"
    found = sorted(p for p in files if p.startswith(prefix) and p.endswith(".csv"))
    if step is not None:
        found = [p for p in found if p == f"{prefix}{step:06d}.csv"]
    if not found:
        return {}
    with tempfile.TemporaryDirectory(prefix="ulorl-claims-") as tmp:
        local = store.client.download_artifacts(run_id, found[-1], tmp)
        return parse_per_problem_csv(Path(local).read_text())


@dataclass
class Value:
    """One run's value of a claim metric, the step it was read at and its per-problem scores."""

    value: Optional[float]
    step: Optional[int] = None
    scores: dict[str, float] = field(default_factory=dict)
    note: str = ""


def run_value(store: RunStore, run: RunInfo, metric: str, budget: Optional[float] = None,
              sigma: Optional[float] = None) -> Value:
    """``metric`` of one run (``budget``: trained samples for M_HELDOUT_SAMPLES; ``sigma``: the
    target entropy for M_SIGMA_GAP)."""
    if metric in (M_ENTROPY, M_SIGMA_GAP):
        steps, values = store.history(run.run_id, ENTROPY)
        h = final_mean(values)
        if h is None:
            return Value(None, note=f"{run.run_id}: no {ENTROPY}")
        if metric == M_SIGMA_GAP:
            if sigma is None:
                return Value(None, note=f"{run.run_id}: no algo.mpt.sigma to compare with")
            h = abs(h - sigma)
        return Value(h, steps[-1])
    steps, values = store.history(run.run_id, HELDOUT)
    if not values:
        return Value(None, note=f"{run.run_id}: no {HELDOUT}")
    if metric == M_HELDOUT:
        return Value(values[-1], steps[-1], per_problem_scores(store, run.run_id, steps[-1]))
    if metric != M_HELDOUT_SAMPLES:
        raise ValueError(f"unknown claim metric {metric!r}; known: {sorted(METRIC_TEXT)}")
    if budget is None:
        return Value(None, note="no equal-samples budget (no run logs train/samples and periodic evals)")
    cum = cumulative_samples(*store.history(run.run_id, "train/samples"))
    hit = point_at_budget(steps, values, cum, budget)
    if hit is None:
        return Value(None, note=f"{run.run_id}: first eval after the budget of {budget:.0f} trained samples")
    return Value(hit[1], hit[0], per_problem_scores(store, run.run_id, hit[0]))


# ----------------------------------------------------------------------------- evaluating claims


@dataclass
class ClaimResult:
    claim: str
    paper_says: str
    metric: str
    arms: str                                  # "a vs b"
    direction: int
    sweep: str                                 # the sweep group ("" when none)
    seeds: int = 0
    effect: Optional[float] = None             # mean over seeds of a - b
    t_low: Optional[float] = None
    t_high: Optional[float] = None
    problem_effect: Optional[float] = None     # pooled paired bootstrap over problems
    problem_low: Optional[float] = None
    problem_high: Optional[float] = None
    problems: int = 0
    verdict: str = NOT_RUN
    per_seed: list[dict[str, Any]] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def evaluate_group(store: RunStore, claim: Claim, group: Sequence[RunInfo], sweep: str) -> Optional[ClaimResult]:
    """The claim on one sweep's runs; None when the sweep lacks one of its arms."""
    a_runs, b_runs = arm_runs(claim.a, group), arm_runs(claim.b, group)
    if not a_runs or not b_runs or set(r.run_id for r in a_runs) & set(r.run_id for r in b_runs):
        return None
    a, notes_a = by_seed(a_runs)
    b, notes_b = by_seed(b_runs)
    res = ClaimResult(claim.name, claim.paper_says, METRIC_TEXT[claim.metric], f"{claim.a.label} vs {claim.b.label}",
                      claim.direction, sweep, notes=notes_a + notes_b)
    seeds = sorted(set(a) & set(b))
    unpaired = sorted(set(a) ^ set(b))
    if unpaired:
        res.notes.append(f"{len(unpaired)} seed(s) with one arm only, left out: "
                         + ", ".join("/".join(s) for s in unpaired))
    budget = sample_budget(store, [a[s] for s in seeds] + [b[s] for s in seeds]) \
        if claim.metric == M_HELDOUT_SAMPLES else None
    if budget is not None:
        res.notes.append(f"equal trained-samples budget {budget:.0f} (the fewest any run had at its last eval)")
    diffs, a_scores, b_scores, missing = [], [], [], []
    for s in seeds:
        sigma = a[s].float_param("algo.mpt.sigma")
        va = run_value(store, a[s], claim.metric, budget, sigma)
        vb = run_value(store, b[s], claim.metric, budget, sigma)
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
    if diffs:
        res.effect = float(np.mean(diffs))
    intervals = []
    if len(diffs) >= 2:
        _, res.t_low, res.t_high = t_interval(diffs)
        intervals.append((res.t_low, res.t_high))
        if claim.metric in PER_PROBLEM:
            pooled = pooled_problem_interval(a_scores, b_scores)
            if pooled is None:
                res.notes.append("no per-problem held-out scores shared by every run: interval across seeds only")
            else:
                res.problem_effect, res.problem_low, res.problem_high, res.problems = pooled
                intervals.append((res.problem_low, res.problem_high))
    res.verdict = verdict(claim.direction, intervals, len(diffs), claim.margin)
    if missing:
        res.notes.append(f"{len(missing)} run(s) without the metric, their seeds left out: " + "; ".join(missing))
    if claim.with_baseline and res.seeds:
        res.notes.append("seed 0 of the best arm was selected on the held-out problems it is scored on")
    return res


def evaluate_claims(store: RunStore, claims: Sequence[Claim] = CLAIMS,
                    finished_only: bool = True) -> list[ClaimResult]:
    """One result per (claim, sweep with both arms); a claim without such a sweep: one ``not run`` row."""
    out: list[ClaimResult] = []
    for claim in claims:
        runs = [r for r in store.runs() if r.paper_ref in claim.paper_refs and r.kind in ("train", "")]
        skipped = [r for r in runs if finished_only and r.status != "FINISHED"]
        runs = [r for r in runs if r not in skipped]
        found = []
        for (sweep, parent), group in sorted(sweep_groups(runs).items()):
            has_baseline = any(r.tags.get(schema.ROLE_TAG) == ROLE_BASELINE for r in group)
            if has_baseline != claim.with_baseline:
                continue
            res = evaluate_group(store, claim, group, sweep + (f" ({parent[:8]})" if parent else ""))
            if res is not None:
                found.append(res)
        if not found:
            found.append(ClaimResult(claim.name, claim.paper_says, METRIC_TEXT[claim.metric],
                                     f"{claim.a.label} vs {claim.b.label}", claim.direction, "",
                                     notes=[f"produce the runs with: {claim.sweep}"]))
        if skipped:
            for res in found:
                res.notes.append(f"{len(skipped)} unfinished run(s) tagged {'/'.join(claim.paper_refs)} left out")
        out += found
    return out


# ----------------------------------------------------------------------------- writers


def _f(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:+.4f}"


def interval_text(r: ClaimResult) -> str:
    """``seeds [lo, hi]; problems [lo, hi] (P)`` (each part only when it exists)."""
    parts = []
    if r.t_low is not None:
        parts.append(f"seeds t95 [{_f(r.t_low)}, {_f(r.t_high)}]")
    if r.problem_low is not None:
        parts.append(f"problems boot95 [{_f(r.problem_low)}, {_f(r.problem_high)}] ({r.problems})")
    return "; ".join(parts) or "—"


CLAIMS_COLUMNS = ("Claim", "Paper says", "Arms (a vs b)", "Metric", "Sweep", "Seeds", "Effect (a - b)", "Interval",
                  "Verdict", "Run ids")


def claims_markdown(results: Sequence[ClaimResult]) -> str:
    """The verdict table with one row per (claim, sweep) and the notes under it."""
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["### The paper's claims over seeds", "",
             "| " + " | ".join(CLAIMS_COLUMNS) + " |", "|" + "|".join("---" for _ in CLAIMS_COLUMNS) + "|"]
    for r in results:
        per_seed = ", ".join(_f(p["diff"]) for p in r.per_seed)
        effect = _f(r.effect) + (f" (per seed {per_seed})" if len(r.per_seed) > 1 else "")
        cells = [r.claim, r.paper_says, r.arms, r.metric, r.sweep or "—", str(r.seeds), effect,
                 interval_text(r), f"**{r.verdict}**", " ".join(rid[:8] for rid in r.run_ids) or "—"]
        lines.append("| " + " | ".join(esc(c) for c in cells) + " |")
    lines += ["", "- Effect: mean over seeds of the per-seed difference a - b (runs paired by data.seed, "
              "rollout.seed, train.seed, within one sweep). seeds t95: t-interval over the per-seed differences; "
              "problems boot95: paired bootstrap over the held-out problems every run shares, each problem "
              "averaged over seeds first.",
              "- Verdict: 'holds' only if every interval excludes zero in the paper's direction, 'does not "
              "hold' if every one excludes it in the opposite direction, else 'inconclusive'; fewer than 2 "
              "seeds: 'not enough seeds'. No-difference claims hold only inside +-margin (ours). Only FINISHED "
              "runs count. Run ids: first 8 characters (claims.json has them in full, per seed)."]
    for r in results:
        lines += [f"- {r.claim} ({r.sweep or 'no sweep'}): {n}" for n in r.notes]
    return "\n".join(lines) + "\n"


def claims_json(results: Sequence[ClaimResult]) -> str:
    return json.dumps([asdict(r) for r in results], indent=1)


def write_claims(store: RunStore, out_dir: str | Path) -> dict[str, Any]:
    """Write ``claims.md`` and ``claims.json`` into ``out_dir``; returns ``{"files": [...], "rows":
    [{claim, sweep, seeds, effect, verdict}, ...]}`` for the ``ulorl-tables --json`` summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = evaluate_claims(store)
    md, js = out / "claims.md", out / "claims.json"
    md.write_text(claims_markdown(results))
    js.write_text(claims_json(results))
    rows = [{"claim": r.claim, "sweep": r.sweep, "seeds": r.seeds, "effect": r.effect, "verdict": r.verdict}
            for r in results]
    return {"files": [str(md), str(js)], "rows": rows}


__all__ = ["CLAIMS", "Arm", "Claim", "ClaimResult", "claims_json", "claims_markdown", "evaluate_claims",
           "pooled_problem_interval", "t_interval", "t_quantile", "verdict", "write_claims"]
