"""Context buckets for ragged decoding: one torch-free plan shared by the HF engine and the simulator.

Rows sorted by context length are split into a few contiguous buckets; each bucket gets its own
KV cache as wide as its longest context plus the decode budget, so a short row never attends over
a long row's padding::

    plan_buckets([10, 10, 10, 10, 100, 100], decode_len=0)   # [(0, 4), (4, 6)]

``ulorl.rollout.engines.hf`` plans its caches with it; ``ulorl.sim.simulator`` uses the same
function to predict the engine's cost, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Boundary candidates beyond this many distinct lengths are quantised (keeps the DP small).
MAX_BOUNDARY_CANDIDATES = 64


def plan_buckets(ctx_lens: Sequence[int], decode_len: int, max_buckets: int = 4,
                 overhead: float = 256.0) -> list[tuple[int, int]]:
    """Split rows sorted by context length into contiguous buckets ``[(start, end), ...]``.

    Minimises ``sum_b rows_b * (max_ctx_b + decode_len / 2) + overhead * #buckets`` (attention
    row-columns per iteration plus a per-bucket dispatch cost in the same unit) by dynamic
    programming over the distinct lengths; ties keep the earliest boundary. ``ctx_lens`` must be
    sorted ascending; at most ``max_buckets`` buckets.
    """
    n = len(ctx_lens)
    if n == 0:
        return []
    if any(ctx_lens[i] > ctx_lens[i + 1] for i in range(n - 1)):
        raise ValueError("plan_buckets: ctx_lens must be sorted ascending")
    # candidate boundaries: ends of runs of equal length (a bucket ends at row index `end`, exclusive)
    ends = [i + 1 for i in range(n) if i == n - 1 or ctx_lens[i + 1] != ctx_lens[i]]
    num_ends = len(ends)
    if num_ends > MAX_BOUNDARY_CANDIDATES:
        stride = num_ends / MAX_BOUNDARY_CANDIDATES
        ends = sorted({ends[min(num_ends - 1, int(round((k + 1) * stride)) - 1)]
                       for k in range(MAX_BOUNDARY_CANDIDATES)} | {n})
        num_ends = len(ends)
    half_decode = decode_len / 2.0
    inf = float("inf")
    bucket_limit = max(1, max_buckets)
    # best_cost[k][j]: min cost covering rows [0, ends[j]) with k + 1 buckets; prev_end[k][j]: the
    # candidate index where the last of those buckets starts (-1: it starts at row 0)
    best_cost = [[inf] * num_ends for _ in range(bucket_limit)]
    prev_end = [[-1] * num_ends for _ in range(bucket_limit)]
    for j in range(num_ends):
        best_cost[0][j] = ends[j] * (ctx_lens[ends[j] - 1] + half_decode) + overhead
    for k in range(1, bucket_limit):
        for j in range(num_ends):
            end = ends[j]
            row_width = ctx_lens[end - 1] + half_decode
            for i in range(j):
                cost = best_cost[k - 1][i] + (end - ends[i]) * row_width + overhead
                if cost < best_cost[k][j]:
                    best_cost[k][j], prev_end[k][j] = cost, i
    k = min(range(bucket_limit), key=lambda kk: best_cost[kk][num_ends - 1])
    plan, j = [], num_ends - 1
    while k >= 0 and j >= 0:
        i = prev_end[k][j] if k > 0 else -1
        plan.append((ends[i] if i >= 0 else 0, ends[j]))
        j, k = i, k - 1
    return plan[::-1]
