"""avg@k, unbiased pass@k, pass@k tables and bootstrap CIs against hand-computed values."""

import math

import numpy as np
import pytest

from ulorl.eval.metrics import avg_at_k, bootstrap_ci, pass_at_k, pass_at_k_table, per_problem_accuracy


def test_pass_at_k_hand_values():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5, abs=1e-15)
    # n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10 = 0.9
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9, abs=1e-15)
    # k=1 is the plain accuracy c/n; c=0 -> 0; n-c < k -> 1
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    assert pass_at_k(8, 0, 4) == 0.0
    assert pass_at_k(8, 6, 3) == 1.0
    assert pass_at_k(32, 32, 32) == 1.0


def test_pass_at_k_matches_binomial_formula_and_large_n_is_stable():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1.0 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    # C(1000, 500) ~ 2.7e299 is at the edge of float range; the product form never forms it.
    # Python ints are exact, and int / int rounds correctly, so this is the exact value.
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5, abs=1e-12)  # 1 - C(999,500)/C(1000,500) = 1 - 500/1000
    exact = 1.0 - math.comb(990, 500) / math.comb(1000, 500)
    assert pass_at_k(1000, 10, 500) == pytest.approx(exact, abs=1e-12)
    assert pass_at_k(5000, 3, 2500) == pytest.approx(1.0 - math.comb(4997, 2500) / math.comb(5000, 2500), abs=1e-12)


def test_pass_at_k_errors():
    for args in [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)]:
        with pytest.raises(ValueError):
            pass_at_k(*args)


def test_avg_at_k_and_per_problem_accuracy():
    correct = np.array([[1, 0, 1, 1], [0, 0, 0, 1]], dtype=bool)
    # 4 of 8 correct
    assert avg_at_k(correct) == 0.5
    np.testing.assert_allclose(per_problem_accuracy(correct), [0.75, 0.25])
    assert avg_at_k([[1], [0], [1]]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="2-D"):
        avg_at_k([1, 0, 1])
    with pytest.raises(ValueError, match="0/1"):
        avg_at_k([[0.5, 1.0]])
    with pytest.raises(ValueError, match="at least one"):
        avg_at_k(np.zeros((0, 4)))


def test_pass_at_k_table():
    # problem 0: c=1 of n=4 -> pass@1 .25, pass@2 .5, pass@4 1; problem 1: all correct -> 1
    correct = [[1, 0, 0, 0], [1, 1, 1, 1]]
    table = pass_at_k_table(correct, [1, 2, 4])
    assert list(table) == [1, 2, 4]
    assert table[1] == pytest.approx(0.625) and table[2] == pytest.approx(0.75) and table[4] == 1.0
    assert table[1] == pytest.approx(avg_at_k(correct))  # pass@1 == avg@k
    with pytest.raises(ValueError, match="k=5"):
        pass_at_k_table(correct, [5])


def test_bootstrap_ci_contains_mean_and_is_deterministic():
    rng = np.random.default_rng(1)
    for scores in (rng.random(30), rng.integers(0, 2, 100).astype(float), np.r_[np.zeros(29), 1.0]):
        low, high = bootstrap_ci(scores)
        assert low <= scores.mean() <= high
        assert 0.0 <= low < high <= 1.0
        assert bootstrap_ci(scores) == (low, high)  # same seed, same answer
    s = rng.random(50)
    lo90, hi90 = bootstrap_ci(s, alpha=0.10)
    lo99, hi99 = bootstrap_ci(s, alpha=0.01)
    assert lo99 <= lo90 and hi90 <= hi99  # higher confidence -> wider


def test_bootstrap_ci_degenerate_and_errors():
    assert bootstrap_ci([0.4, 0.4, 0.4]) == (pytest.approx(0.4), pytest.approx(0.4))
    assert bootstrap_ci([0.7]) == (pytest.approx(0.7), pytest.approx(0.7))
    with pytest.raises(ValueError):
        bootstrap_ci([])
    with pytest.raises(ValueError):
        bootstrap_ci([0.1, float("nan")])
    with pytest.raises(ValueError):
        bootstrap_ci([0.1], alpha=1.5)
    with pytest.raises(ValueError):
        bootstrap_ci([0.1], n_boot=0)
