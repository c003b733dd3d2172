"""The verdict functions of ulorl.eval.paired refuse what they cannot judge: each case an audit found
accepted ("holds", or a number) is refused with a stated reason or raises ValueError. Hand-derived on
tiny inputs; the distributions are checked against closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ulorl.eval import paired as P


def test_a_verdict_without_a_declared_t_interval_is_not_holds() -> None:
    # 20 seeds, but nothing says the interval passed is the t-interval across them: the problem bootstrap
    # alone cannot carry a verdict (before: "holds", t_usable defaulted to true for >= 3 seeds)
    word, why = P.judge(1, [(0.01, 0.07)], 20)
    assert word == P.INCONCLUSIVE and "no t-interval across seeds" in why and "'holds'" in why
    assert P.verdict(1, [(0.01, 0.07)], 20) == P.INCONCLUSIVE
    assert P.verdict(1, [(0.01, 0.07)], 20, t_usable=True) == P.HOLDS


def test_t_usable_with_two_seeds_is_a_contradiction() -> None:
    # before: "holds"
    with pytest.raises(ValueError, match="t_usable=True with 2 seed"):
        P.judge(1, [(0.01, 0.07)], 2, t_usable=True)


def test_a_nan_difference_makes_no_t_interval_and_says_so() -> None:
    # before: (True, "") -- then a verdict whose reason was "the intervals disagree in sign"
    ok, why = P.seed_interval_usable([0.04, math.nan, 0.05])
    assert not ok and "not finite" in why and "seed index 1" in why
    assert P.mde_seeds([0.04, math.nan, 0.05]) is None
    with pytest.raises(ValueError, match="finite"):
        P.t_interval([0.04, math.nan, 0.05])


@pytest.mark.parametrize("sd, effect", [(math.nan, 0.05), (0.05, math.nan), (-0.1, 0.05), (math.inf, 0.05),
                                        (0.05, 0.0)])
def test_seeds_for_effect_refuses_a_spread_or_effect_it_cannot_use(sd: float, effect: float) -> None:
    # before: seeds_for_effect(nan, 0.05) == 3
    with pytest.raises(ValueError):
        P.seeds_for_effect(sd, effect)


def test_seeds_for_margin_refuses_a_nan_spread() -> None:
    with pytest.raises(ValueError, match="spread"):
        P.seeds_for_margin(math.nan, 0.05)


@pytest.mark.parametrize("interval", [(0.05, 0.01), (math.nan, 0.05), (0.01, math.nan)])
def test_a_reversed_or_nan_interval_raises(interval: tuple[float, float]) -> None:
    # before: [(0.05, 0.01)] "holds"
    with pytest.raises(ValueError, match="reversed|NaN"):
        P.judge(1, [interval], 5, t_usable=True)


@pytest.mark.parametrize("margin", [math.inf, math.nan, -0.05, 0.0])
def test_a_margin_that_is_not_finite_and_positive_raises(margin: float) -> None:
    # before: margin=inf "holds" (every interval lies inside (-inf, inf))
    with pytest.raises(ValueError, match="finite margin > 0"):
        P.judge(0, [(-0.01, 0.01)], 5, margin=margin, t_usable=True)


def test_a_directional_claim_takes_no_margin() -> None:
    with pytest.raises(ValueError, match="takes no margin"):
        P.judge(1, [(0.01, 0.07)], 5, margin=0.05, t_usable=True)


def test_the_practical_size_floor_refuses_an_effect_too_small_to_matter() -> None:
    # an entropy effect of 1e-6 nats, t-interval [5e-7, 1.5e-6]: "holds" without a floor (before: no floor
    # could be set), "does not hold" with the floor 0.01 nats and says why
    tiny = [(5e-7, 1.5e-6)]
    assert P.verdict(1, tiny, 12, t_usable=True) == P.HOLDS
    word, why = P.judge(1, tiny, 12, t_usable=True, floor=0.01)
    assert word == P.NOT_HOLD and "practical-size floor 0.01" in why and "too small" in why
    # beyond the floor: holds; excludes zero but reaches below it: inconclusive; the other way: does not hold
    assert P.judge(1, [(0.02, 0.05)], 12, t_usable=True, floor=0.01) == (P.HOLDS, "")
    word, why = P.judge(1, [(0.005, 0.05)], 12, t_usable=True, floor=0.01)
    assert word == P.INCONCLUSIVE and "below the practical-size floor" in why
    assert P.verdict(1, [(-0.05, -0.02)], 12, t_usable=True, floor=0.01) == P.NOT_HOLD
    # a < b: the floor is read in the paper's direction
    assert P.verdict(-1, [(-0.05, -0.02)], 12, t_usable=True, floor=0.01) == P.HOLDS
    assert P.verdict(-1, [(-0.008, -0.001)], 12, t_usable=True, floor=0.01) == P.NOT_HOLD
    assert P.verdict(-1, [(-0.05, -0.005)], 12, t_usable=True, floor=0.01) == P.INCONCLUSIVE


@pytest.mark.parametrize("direction, floor", [(1, 0.0), (1, -0.01), (1, math.nan), (1, math.inf), (0, 0.01)])
def test_a_floor_must_be_finite_positive_and_directional(direction: int, floor: float) -> None:
    with pytest.raises(ValueError, match="floor"):
        P.judge(direction, [(0.02, 0.03)], 5, margin=0.05 if direction == 0 else None, t_usable=True, floor=floor)


# ----------------------------------------------------------------------------- scipy against closed forms


def test_student_t_from_scipy_matches_closed_forms() -> None:
    # df 2: P(|T| < t) = t / sqrt(2 + t^2); df 1 (Cauchy): 2 atan(t) / pi; quantiles invert them
    for t in (0.3, 1.5, 4.0):
        assert P.t_cdf_two_sided(t, 2) == pytest.approx(t / math.sqrt(2 + t * t), rel=1e-12)
        assert P.t_cdf_two_sided(t, 1) == pytest.approx(2 * math.atan(t) / math.pi, rel=1e-12)
    # 2p - 1 = t / sqrt(2 + t^2) -> t^2 = 2 q^2 / (1 - q^2), q = 2p - 1
    for p in (0.8, 0.9, 0.975):
        q = 2 * p - 1
        assert P.t_quantile(p, 2) == pytest.approx(math.sqrt(2 * q * q / (1 - q * q)), rel=1e-12)


def test_exact_power_at_hand_derived_points() -> None:
    # no effect: the test rejects at its own level; a huge effect: always
    assert P.power_seeds(0.0, 1.0, 5) == pytest.approx(0.05, abs=1e-12)
    assert P.power_seeds(100.0, 1.0, 5) == pytest.approx(1.0, abs=1e-9)
    # the MDE is where the power is 0.80, and more seeds detect less
    diffs3, diffs12 = [0.1, 0.2, 0.3], [0.1, 0.2, 0.3] * 4
    m3, m12 = P.mde_seeds(diffs3), P.mde_seeds(diffs12)
    assert m3 is not None and m12 is not None and m12 < m3
    assert P.power_seeds(m12, float(np.std(diffs12, ddof=1)), 12) == pytest.approx(P.POWER, abs=1e-9)
    # seeds_for_effect is the first n whose exact MDE reaches the effect
    n = P.seeds_for_effect(0.1, 0.1)
    assert n is not None and P.power_seeds(0.1, 0.1, n) >= P.POWER > P.power_seeds(0.1, 0.1, n - 1)


def test_the_problem_bootstrap_is_scipys_with_the_same_draws_as_bootstrap_ci() -> None:
    from ulorl.eval.metrics import bootstrap_ci

    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 3, 128) / 2, rng.integers(0, 3, 128) / 2
    d, lo, hi = P.paired_bootstrap(a, b)
    assert d == pytest.approx(float(np.mean(a - b)))
    assert (lo, hi) == pytest.approx(bootstrap_ci(a - b, seed=0), abs=1e-12)
    assert P.paired_bootstrap([0.5], [0.25]) == (0.25, 0.25, 0.25)
