"""Benchmark metrics: avg@k, unbiased pass@k, bootstrap confidence intervals. Pure NumPy."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray


def _as_correct_matrix(correct: ArrayLike) -> NDArray[np.float64]:
    """[P, k] bool/0-1 matrix -> float64 array; rejects other shapes and values."""
    arr = np.asarray(correct)
    if arr.ndim != 2:
        raise ValueError(f"correct must be a 2-D [problems, samples] array, got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"correct must have at least one problem and one sample, got shape {arr.shape}")
    out = arr.astype(np.float64)
    if not np.all((out == 0.0) | (out == 1.0)):
        raise ValueError("correct must hold only 0/1 (or bool) values")
    return out


def per_problem_accuracy(correct: ArrayLike) -> NDArray[np.float64]:
    """Fraction of correct samples per problem: [P, k] -> Float[P]."""
    acc: NDArray[np.float64] = _as_correct_matrix(correct).mean(axis=1)
    return acc


def avg_at_k(correct: ArrayLike) -> float:
    """avg@k: mean accuracy over all P x k samples (the paper's metric, k = 32).

    Every problem has the same k, so this equals the mean of per-problem accuracies.
    """
    return float(_as_correct_matrix(correct).mean())


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i), which avoids huge binomials
    (Chen et al. 2021, "Evaluating Large Language Models Trained on Code").
    """
    n, c, k = int(n), int(c), int(k)
    if n < 1:
        raise ValueError(f"pass@k needs n >= 1 samples, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)
    return float(1.0 - np.prod(1.0 - k / i))


def pass_at_k_table(correct: ArrayLike, ks: Iterable[int]) -> dict[int, float]:
    """Mean over problems of unbiased pass@k for each k in ``ks``.

    Args:
        correct: [P, n] 0/1 matrix (n samples per problem).
        ks: values of k, each in [1, n].

    Returns:
        {k: pass@k} in the order of ``ks``.
    """
    arr = _as_correct_matrix(correct)
    n = arr.shape[1]
    counts = arr.sum(axis=1).astype(int)
    table: dict[int, float] = {}
    for k in ks:
        k = int(k)
        if not 1 <= k <= n:
            raise ValueError(f"pass@k: k={k} must be in [1, n={n}] (n = samples per problem)")
        table[k] = float(np.mean([pass_at_k(n, int(c), k) for c in counts]))
    return table


def bootstrap_ci(
    per_problem_scores: Sequence[float] | ArrayLike,
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean score, resampling problems with replacement.

    Problems, not samples, are resampled: the k samples of one problem are correlated, and
    the benchmark's uncertainty comes from which problems it contains.

    Args:
        per_problem_scores: Float[P], e.g. ``per_problem_accuracy(correct)``.
        n_boot: bootstrap replicates.
        alpha: 1 - confidence level (0.05 -> 95 %).
        seed: NumPy generator seed (deterministic).

    Returns:
        (low, high) quantiles alpha/2 and 1 - alpha/2 of the bootstrap means.
    """
    scores = np.asarray(per_problem_scores, dtype=np.float64).reshape(-1)
    if scores.size == 0:
        raise ValueError("bootstrap_ci needs at least one problem score")
    if not np.all(np.isfinite(scores)):
        raise ValueError("bootstrap_ci: scores must be finite")
    if int(n_boot) < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    rng = np.random.default_rng(seed)
    p = scores.size
    means = np.empty(int(n_boot), dtype=np.float64)
    # Resample in blocks so the index matrix stays small for large benchmarks.
    block = max(1, (1 << 22) // p)
    for s in range(0, int(n_boot), block):
        e = min(s + block, int(n_boot))
        idx = rng.integers(0, p, size=(e - s, p))
        means[s:e] = scores[idx].mean(axis=1)
    low, high = np.quantile(means, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(low), float(high)
