"""Paired comparisons of two arms over seeds and held-out problems: the statistics behind the
claims (``ulorl.report.claims``) and the sweep verdict (``ulorl.sweep.ranking``). Pure functions.

Two arms a, b run on the same seeds s = 1..n and scored on the same P held-out problems:

- per-seed differences d_s = metric(a, s) - metric(b, s); across seeds the t-interval
  mean(d) +- t_{1-alpha/2, n-1} * sd(d) / sqrt(n) (sd with n - 1). It is used only with
  n >= :data:`MIN_T_SEEDS` and sd(d) > 0: with 2 seeds the interval rests on one degree of freedom,
  and identical differences (held-out accuracy moves in steps of 1 / (problems * k)) give a point,
  not evidence (:func:`seed_interval_usable`);
- over problems: each problem's score averaged over the seeds of its arm, then the paired percentile
  bootstrap of the mean difference (:func:`pooled_problem_interval`);
- verdict (:func:`judge`, :func:`verdict`) from the intervals that exist, at the level they were
  computed at (:data:`LEVEL_DIRECTIONAL` for "a beats b", :data:`LEVEL_EQUIVALENCE` for "a equals b
  within +-margin": the 90 % interval is the two one-sided tests at alpha 0.05). "holds" / "does not
  hold" need the t-interval across seeds among them: the problem bootstrap sees one draw of the
  training seeds and alone cannot carry a verdict (the row is "inconclusive" and says why);
- a directional claim may set a practical-size floor, the smallest effect that matters: "holds" then
  needs every interval beyond it (:func:`judge`);
- minimum detectable effect (:func:`mde_seeds`, :func:`mde_problems`) of a directional claim: the
  true difference an interval of that level would tell from zero with probability :data:`POWER`,
  given the observed spread: over seeds by the exact power of the t-test (noncentral t), over
  problems (z_{1-alpha/2} + z_{POWER}) * standard error;
- of a no-difference claim, the smallest margin its design could establish with probability
  :data:`POWER` when the true difference is 0 (:func:`equivalence_margin_seeds`,
  :func:`equivalence_margin_problems`): two one-sided tests at alpha, each must reject, so
  (q_{1-alpha} + q_{(1+POWER)/2}) * standard error, and the seeds a given margin would need
  (:func:`seeds_for_margin`).

Distributions and the bootstrap are ``scipy.stats``' (t, nct, bootstrap); malformed input (a reversed
or NaN interval, a margin or floor that is not finite, a NaN spread) raises ValueError rather than
reaching a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from statistics import NormalDist
from typing import Optional

import numpy as np
from scipy import optimize, stats  # type: ignore[import-untyped]  # scipy ships no stubs

N_BOOT = 2000
ALPHA = 0.05
MIN_T_SEEDS = 3             # a t-interval across seeds needs at least this many seeds
LEVEL_DIRECTIONAL = 0.95    # "a > b" / "a < b": two-sided 95 % intervals
LEVEL_EQUIVALENCE = 0.90    # "a ~ b within +-margin": 90 % intervals = TOST at alpha 0.05
POWER = 0.80                # of the minimum detectable effect

HOLDS, NOT_HOLD, INCONCLUSIVE, FEW_SEEDS = "holds", "does not hold", "inconclusive", "not enough seeds"
ARMS_IDENTICAL = "arms identical"   # the two arms' runs are bit-identical: there is no comparison to make
REFUSED = "refused"                 # a selected configuration with no problems the selection did not see


# ----------------------------------------------------------------------------- over problems


def paired_bootstrap(a: Sequence[float], b: Sequence[float], n_boot: int = N_BOOT, alpha: float = ALPHA,
                     seed: int = 0) -> tuple[float, float, float]:
    """Mean paired difference ``mean(a - b)`` and its percentile bootstrap interval over problems
    (``scipy.stats.bootstrap``, ``method="percentile"``, resampling with ``numpy.random.default_rng(seed)``:
    the same draws as :func:`ulorl.eval.metrics.bootstrap_ci`).

    Args:
        a, b: Float[P] per-problem scores of two models on the SAME problems, same order.
    Returns:
        (difference, low, high); with one problem the interval is that problem's difference.
    """
    x = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if x.size == 0:
        raise ValueError("paired_bootstrap needs at least one common problem")
    if not np.all(np.isfinite(x)):
        raise ValueError("paired_bootstrap: per-problem scores must be finite")
    if x.size == 1:
        return float(x[0]), float(x[0]), float(x[0])
    res = stats.bootstrap((x,), np.mean, n_resamples=int(n_boot), confidence_level=1.0 - alpha,
                          method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    return float(x.mean()), float(res.confidence_interval.low), float(res.confidence_interval.high)


# ----------------------------------------------------------------------------- Student's t (scipy.stats)


def t_cdf_two_sided(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with ``df`` >= 1 (``scipy.stats.t``); 0 for t <= 0.
    ``t_cdf_two_sided(1.5, 2) = 1.5 / sqrt(2 + 1.5^2)``."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if t <= 0:
        return 0.0
    return float(stats.t.cdf(t, df) - stats.t.cdf(-t, df))


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t with ``df`` degrees of freedom (``scipy.stats.t.ppf``):
    ``t_quantile(0.975, 2) = 4.303``."""
    if not 0.5 < p < 1.0:
        raise ValueError(f"p must be in (0.5, 1), got {p}")
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    return float(stats.t.ppf(p, df))


def t_interval(diffs: Sequence[float], alpha: float = ALPHA) -> tuple[float, float, float]:
    """(mean, low, high) of the per-seed differences ``diffs`` (Float[n], n >= 2, finite):
    mean +- t_{1-alpha/2, n-1} * sd / sqrt(n), sd with n - 1 in the denominator."""
    x = np.asarray(diffs, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"a t-interval needs >= 2 seeds, got {x.size}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"a t-interval needs finite per-seed differences, got {list(map(float, x))}")
    mean = float(x.mean())
    half = t_quantile(1.0 - alpha / 2.0, int(x.size) - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half


def power_seeds(effect: float, sd: float, n: int, level: float = LEVEL_DIRECTIONAL) -> float:
    """Probability that the two-sided t-interval at ``level`` over ``n`` seeds excludes zero when the
    per-seed differences are normal with mean ``effect`` and spread ``sd``: the exact power of the
    one-sample t-test from the noncentral t (``scipy.stats.nct``, noncentrality effect * sqrt(n) / sd),
    both tails counted."""
    if n < 2:
        raise ValueError(f"power needs >= 2 seeds, got {n}")
    if not (math.isfinite(effect) and math.isfinite(sd) and sd > 0):
        raise ValueError(f"power needs a finite effect and a finite sd > 0, got effect {effect}, sd {sd}")
    df = n - 1
    crit = t_quantile((1.0 + level) / 2.0, df)
    ncp = effect * math.sqrt(n) / sd
    return float(stats.nct.sf(crit, df, ncp) + stats.nct.cdf(-crit, df, ncp))


def _noncentrality_for_power(df: int, level: float, power: float) -> float:
    """The noncentrality delta > 0 at which the two-sided t-test at ``level`` with ``df`` degrees of
    freedom rejects with probability ``power`` (root of the exact noncentral-t power, ``brentq``)."""
    crit = t_quantile((1.0 + level) / 2.0, df)

    def gap(delta: float) -> float:
        return float(stats.nct.sf(crit, df, delta) + stats.nct.cdf(-crit, df, delta)) - power

    hi = crit + t_quantile(max(power, 0.5 + 1e-9), df) + 1.0   # the normal-style guess, then doubled until past
    while gap(hi) < 0:
        hi *= 2.0
    return float(optimize.brentq(gap, 0.0, hi, xtol=1e-12, rtol=1e-12))


def seed_interval_usable(diffs: Sequence[float]) -> tuple[bool, str]:
    """Whether the t-interval over ``diffs`` (Float[n]) may enter a verdict, and why not:
    n >= :data:`MIN_T_SEEDS` finite differences with a non-zero spread. ``seed_interval_usable([0.04, 0.04])``
    -> ``(False, "only 2 seed(s) (a t-interval needs >= 3)")``; a NaN or infinite difference (a run
    without a value) -> not usable, and the seeds named."""
    n = len(diffs)
    x = np.asarray(diffs, dtype=np.float64)
    bad = [i for i, v in enumerate(x.tolist()) if not math.isfinite(v)]
    if bad:
        return False, (f"{len(bad)} of the {n} per-seed differences are not finite (seed index "
                       f"{', '.join(map(str, bad))}): no t-interval")
    if n < MIN_T_SEEDS:
        return False, f"only {n} seed(s) (a t-interval needs >= {MIN_T_SEEDS})"
    if float(np.std(x, ddof=1)) <= 1e-12:
        return False, f"the {n} per-seed differences are identical (zero spread: the t-interval is a point)"
    return True, ""


def pooled_problem_interval(a: Sequence[dict[str, float]], b: Sequence[dict[str, float]], alpha: float = ALPHA
                            ) -> Optional[tuple[float, float, float, int]]:
    """Paired bootstrap over held-out problems, pooled across seeds: ``a[s]`` / ``b[s]`` are the
    per-problem scores (problem id -> accuracy) of the two arms' runs of seed s. Each problem's
    score is averaged over seeds within its arm, then :func:`paired_bootstrap` resamples the problems
    every run has. Returns (difference, low, high, problems), None without a common problem."""
    x = pooled_problem_differences(a, b)
    if x is None:
        return None
    d, lo, hi = paired_bootstrap(x, [0.0] * len(x), alpha=alpha)
    return d, lo, hi, len(x)


def pooled_problem_differences(a: Sequence[dict[str, float]], b: Sequence[dict[str, float]]) -> Optional[list[float]]:
    """Per-problem differences (Float[P], sorted problem ids) of the seed-averaged scores of the
    problems every run of ``a`` and ``b`` has; None without one."""
    if not a or len(a) != len(b) or not all(a) or not all(b):
        return None
    common = set.intersection(*(set(s) for s in list(a) + list(b)))
    if not common:
        return None
    ids = sorted(common)
    return [float(np.mean([s[i] for s in a])) - float(np.mean([s[i] for s in b])) for i in ids]


# ----------------------------------------------------------------------------- verdict and power


def _check_intervals(intervals: Sequence[tuple[float, float]]) -> None:
    for iv in intervals:
        lo, hi = (float(v) for v in iv)
        if math.isnan(lo) or math.isnan(hi):
            raise ValueError(f"interval {tuple(iv)} has a NaN bound; leave an interval that could not be computed out")
        if lo > hi:
            raise ValueError(f"interval {tuple(iv)} is reversed (low > high): pass (low, high)")


def judge(direction: int, intervals: Sequence[tuple[float, float]], n_seeds: int, margin: Optional[float] = None,
          t_usable: bool = False, floor: Optional[float] = None) -> tuple[str, str]:
    """Verdict on a - b from the intervals (low, high) that may be used, all at one level, and why
    when it is not "holds" / "does not hold" ("" otherwise, or the floor's reason when the whole
    interval lies short of it).

    ``t_usable``: the caller states that the t-interval across seeds (:func:`seed_interval_usable`:
    >= :data:`MIN_T_SEEDS` seeds with a spread) is among ``intervals``. Default False: nothing is
    assumed, and without it the verdict is "inconclusive": what is left, the bootstrap over problems,
    sees one draw of the training seeds, not their spread. ``t_usable=True`` with fewer than
    :data:`MIN_T_SEEDS` seeds is a contradiction (ValueError).
    direction +1 / -1 (the paper says a > b / a < b): "holds" when every interval excludes zero in
    that direction, "does not hold" when every one excludes it in the other, else "inconclusive".
    ``floor`` (directional claims only, > 0): the practical-size floor, the smallest effect that
    matters in the claim's units: "holds" then needs every interval beyond the floor in the paper's
    direction (low > floor for +1), and an interval wholly between zero and the floor is "does not
    hold" (real but too small to matter); one that excludes zero but reaches below the floor is
    "inconclusive".
    direction 0 (a equals b within +-``margin``; two one-sided tests): "holds" when every interval
    lies inside (-margin, margin), "does not hold" when every one lies wholly outside it
    (low >= margin or high <= -margin), else "inconclusive".
    Fewer than 2 paired seeds, or no interval with fewer than :data:`MIN_T_SEEDS`: "not enough seeds".
    Malformed input (a reversed or NaN interval, a margin or floor that is not finite and > 0)
    raises ValueError. ``judge(1, [(0.01, 0.07)], 2)[0] == "inconclusive"``.
    """
    if direction not in (-1, 0, 1):
        raise ValueError(f"direction must be -1, 0 or +1, got {direction}")
    if direction == 0 and (margin is None or not math.isfinite(margin) or margin <= 0):
        raise ValueError(f"a no-difference claim (direction 0) needs a finite margin > 0, got {margin}")
    if direction != 0 and margin is not None:
        raise ValueError(f"a directional claim (direction {direction:+d}) takes no margin, got {margin}; "
                         "the smallest effect that matters is its floor")
    if floor is not None and (direction == 0 or not math.isfinite(floor) or floor <= 0):
        raise ValueError(f"floor must be a finite number > 0 on a directional claim, got {floor} "
                         f"(direction {direction}); a no-difference claim's margin plays its part")
    if t_usable and n_seeds < MIN_T_SEEDS:
        raise ValueError(f"t_usable=True with {n_seeds} seed(s): a t-interval across seeds needs >= {MIN_T_SEEDS}")
    _check_intervals(intervals)
    if n_seeds < 2:
        return FEW_SEEDS, f"{n_seeds} paired seed(s)"
    if not intervals:
        if n_seeds < MIN_T_SEEDS:
            return FEW_SEEDS, f"{n_seeds} paired seeds and no interval over problems"
        return INCONCLUSIVE, "no interval to judge by"
    why_word = ""
    if direction == 0:
        assert margin is not None
        if all(-margin < lo and hi < margin for lo, hi in intervals):
            word = HOLDS
        elif all(lo >= margin or hi <= -margin for lo, hi in intervals):
            word = NOT_HOLD
        else:
            return INCONCLUSIVE, f"an interval crosses +-{margin:g}"
    else:
        lows = [lo * direction if direction > 0 else -hi for lo, hi in intervals]    # in the paper's direction
        highs = [hi * direction if direction > 0 else -lo for lo, hi in intervals]
        bar = floor or 0.0
        if all(lo > bar for lo in lows):
            word = HOLDS
        elif all(hi < 0 for hi in highs):
            word = NOT_HOLD
        elif floor is not None and all(lo > 0 and hi < floor for lo, hi in zip(lows, highs)):
            word, why_word = NOT_HOLD, (f"every interval lies between zero and the practical-size floor {floor:g}: "
                                        "an effect too small to matter")
        elif floor is not None and all(lo > 0 for lo in lows):
            return INCONCLUSIVE, f"the intervals exclude zero but reach below the practical-size floor {floor:g}"
        else:
            return INCONCLUSIVE, "an interval includes zero" if any(lo <= 0 <= hi for lo, hi in intervals) \
                else "the intervals disagree in sign"
    if not t_usable:
        why = (f"only {n_seeds} seed(s)" if n_seeds < MIN_T_SEEDS
               else "none was computed or declared (t_usable): the per-seed differences may have no spread")
        return INCONCLUSIVE, (f"the problem bootstrap alone would say '{word}', but there is no t-interval across "
                              f"seeds ({why}; a verdict needs >= {MIN_T_SEEDS} seeds with a spread): one draw of "
                              "the training seeds says nothing of their spread")
    return word, why_word


def verdict(direction: int, intervals: Sequence[tuple[float, float]], n_seeds: int,
            margin: Optional[float] = None, t_usable: bool = False, floor: Optional[float] = None) -> str:
    """The verdict word of :func:`judge`."""
    return judge(direction, intervals, n_seeds, margin, t_usable, floor)[0]


def mde_seeds(diffs: Sequence[float], level: float = LEVEL_DIRECTIONAL, power: float = POWER) -> Optional[float]:
    """Smallest true mean difference the two-sided t-interval at ``level`` over these seeds would exclude
    zero for with probability ``power``, by the exact power of the t-test (noncentral t,
    :func:`power_seeds`): delta * sd / sqrt(n), delta the noncentrality at that power (the normal-style
    (t_{(1+level)/2, n-1} + t_{power, n-1}) underestimates it, by 5 % at n = 3); None when the
    t-interval is not usable (:func:`seed_interval_usable`)."""
    if not seed_interval_usable(diffs)[0]:
        return None
    x = np.asarray(diffs, dtype=np.float64)
    return _noncentrality_for_power(int(x.size) - 1, level, power) * float(x.std(ddof=1)) / math.sqrt(x.size)


def equivalence_margin_seeds(diffs: Sequence[float], alpha: float = ALPHA,
                             power: float = POWER) -> Optional[float]:
    """Smallest margin +-m the two one-sided tests at ``alpha`` over these seeds would establish with
    probability ``power`` when the true difference is 0: (t_{1-alpha, n-1} + t_{(1+power)/2, n-1}) *
    sd / sqrt(n) (the usual t approximation of the TOST's power); None when the t-interval is not usable."""
    if not seed_interval_usable(diffs)[0]:
        return None
    x = np.asarray(diffs, dtype=np.float64)
    df = int(x.size) - 1
    return (t_quantile(1.0 - alpha, df) + t_quantile((1.0 + power) / 2.0, df)) * float(x.std(ddof=1)) \
        / math.sqrt(x.size)


def equivalence_margin_problems(diffs: Sequence[float], alpha: float = ALPHA,
                                power: float = POWER) -> Optional[float]:
    """The same over problems (Float[P] seed-averaged differences): (z_{1-alpha} + z_{(1+power)/2}) *
    sd / sqrt(P); None with fewer than 2 problems."""
    x = np.asarray(diffs, dtype=np.float64)
    if x.size < 2:
        return None
    z = NormalDist()
    return (z.inv_cdf(1.0 - alpha) + z.inv_cdf((1.0 + power) / 2.0)) * float(x.std(ddof=1)) / math.sqrt(x.size)


def _seeds_needed(sd: float, target: float, needed_at: Callable[[int], float], max_seeds: int) -> Optional[int]:
    """The smallest n >= :data:`MIN_T_SEEDS` with ``needed_at(n)`` (the smallest difference n seeds
    tell, falling with n) <= ``target``: double, then bisect; None beyond ``max_seeds``."""
    if not (math.isfinite(sd) and sd >= 0):
        raise ValueError(f"the per-seed spread must be a finite number >= 0, got {sd}")
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"the target difference must be a finite number > 0, got {target}")
    lo = MIN_T_SEEDS
    if needed_at(lo) <= target:
        return lo
    hi = lo
    while needed_at(hi) > target:
        if hi >= max_seeds:
            return None
        lo, hi = hi, min(2 * hi, max_seeds)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if needed_at(mid) <= target else (mid, hi)
    return hi


def seeds_for_margin(sd: float, margin: float, alpha: float = ALPHA, power: float = POWER,
                     max_seeds: int = 100_000) -> Optional[int]:
    """Seeds (>= :data:`MIN_T_SEEDS`) at which the two one-sided tests would establish +-``margin``
    with probability ``power`` if the per-seed differences keep the spread ``sd`` and their true mean
    is 0: the smallest n with (t_{1-alpha, n-1} + t_{(1+power)/2, n-1}) * sd / sqrt(n) <= margin;
    None beyond ``max_seeds``. A NaN / negative ``sd`` or a margin not > 0 raises ValueError."""
    def needed(n: int) -> float:
        return (t_quantile(1.0 - alpha, n - 1) + t_quantile((1.0 + power) / 2.0, n - 1)) * sd / math.sqrt(n)
    return _seeds_needed(sd, margin, needed, max_seeds)


def seeds_for_effect(sd: float, effect: float, level: float = LEVEL_DIRECTIONAL, power: float = POWER,
                     max_seeds: int = 100_000) -> Optional[int]:
    """Seeds (>= :data:`MIN_T_SEEDS`) at which the t-interval at ``level`` would tell a true difference
    ``effect`` from zero with probability ``power`` (exact noncentral-t power) if the per-seed differences
    keep the spread ``sd``: the smallest n whose :func:`mde_seeds` is <= |effect|; None beyond ``max_seeds``.
    A NaN / negative ``sd`` or a NaN / zero ``effect`` raises ValueError."""
    def needed(n: int) -> float:
        return _noncentrality_for_power(n - 1, level, power) * sd / math.sqrt(n)
    if not math.isfinite(effect):
        raise ValueError(f"the effect must be a finite number, got {effect}")
    return _seeds_needed(sd, abs(effect), needed, max_seeds)


def sampling_variance(scores: Sequence[float], k: int) -> Optional[float]:
    """Evaluation sampling variance of a run's held-out mean, given its problems: each problem's
    accuracy p_i is a mean of k Bernoulli draws, so Var(mean) = sum_i p_i (1 - p_i) / k / P^2, with
    p_i (1 - p_i) estimated without bias by p^_i (1 - p^_i) k / (k - 1):
    sum_i p^_i (1 - p^_i) / (k - 1) / P^2. ``scores``: Float[P] accuracies; None for k < 2 or no problems.
    ``sampling_variance([0.5, 0.5], 2) == 0.125``."""
    x = np.asarray(scores, dtype=np.float64)
    if k < 2 or x.size == 0:
        return None
    return float(np.sum(x * (1.0 - x)) / (k - 1) / x.size ** 2)


def mde_problems(diffs: Sequence[float], level: float = LEVEL_DIRECTIONAL, power: float = POWER) -> Optional[float]:
    """The same over problems for the paired bootstrap: (z_{(1+level)/2} + z_{power}) * sd / sqrt(P)
    of the per-problem differences ``diffs`` (Float[P], seed-averaged); None with fewer than 2 problems."""
    x = np.asarray(diffs, dtype=np.float64)
    if x.size < 2:
        return None
    z = NormalDist()
    return (z.inv_cdf((1.0 + level) / 2.0) + z.inv_cdf(power)) * float(x.std(ddof=1)) / math.sqrt(x.size)


__all__ = ["ALPHA", "ARMS_IDENTICAL", "FEW_SEEDS", "HOLDS", "INCONCLUSIVE", "LEVEL_DIRECTIONAL", "LEVEL_EQUIVALENCE",
           "MIN_T_SEEDS", "NOT_HOLD", "POWER", "REFUSED", "equivalence_margin_problems", "equivalence_margin_seeds",
           "judge", "mde_problems", "mde_seeds", "paired_bootstrap",
           "pooled_problem_differences", "pooled_problem_interval", "power_seeds", "sampling_variance",
           "seed_interval_usable", "seeds_for_effect",
           "seeds_for_margin",
           "t_cdf_two_sided", "t_interval", "t_quantile", "verdict"]
