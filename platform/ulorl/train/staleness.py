"""How stale the samples of one update are: the versions each trajectory spans and how far each token's
decoding version lies behind the policy that trains on it.

A released sample carries its segments (``SegmentSpan(start, end, version)``); the update trains it at
``train_version`` (the policy version before the optimizer step). A token of a segment decoded at version
``v`` has lag ``train_version - v``; it is *stale* when that lag is at least 1. Under the synchronous
schedule with S = 1 every lag is 0; with S > 1 a response's early segments lag by the steps it waited; an
overlapped schedule adds its own lag to every segment. Pure function over samples; no tracker here.
"""

from __future__ import annotations

from collections.abc import Sequence

from ulorl.rollout.types import Sample

__all__ = ["LAG_BUCKETS", "STALENESS_PREFIX", "staleness_metrics"]

STALENESS_PREFIX = "staleness/"
LAG_BUCKETS = 4   # token lag histogram: lag 0, 1, 2 and >= 3 (the last bucket "lag3p")


def _bucket(lag: int) -> str:
    return f"lag{lag}" if lag < LAG_BUCKETS - 1 else f"lag{LAG_BUCKETS - 1}p"


def staleness_metrics(samples: Sequence[Sample], train_version: int) -> dict[str, float]:
    """Per update, over the released ``samples`` trained at ``train_version``:

    * ``staleness/versions_per_sample_mean`` / ``_max``: distinct decoding versions per trajectory;
    * ``staleness/token_lag_mean`` / ``staleness/token_lag_max``: ``train_version - version`` per token;
    * ``staleness/stale_token_frac``: share of tokens with lag >= 1;
    * ``staleness/tokens_lag0`` ... ``staleness/tokens_lag3p``: the token-lag histogram as shares (sum 1).

    {} when no sample has a decoded token. ``staleness_metrics([s], 5)`` with ``s`` decoded 3 tokens at
    version 4 then 1 at version 5 gives versions 2, lag mean 0.75, stale share 0.75, lag0 0.25, lag1 0.75.
    """
    counts = [0] * LAG_BUCKETS
    lag_sum, lag_max, tokens = 0, 0, 0
    versions: list[int] = []
    for s in samples:
        spans = [sp for sp in s.segments if sp.end > sp.start]
        if not spans:
            continue
        versions.append(len({sp.version for sp in spans}))
        for sp in spans:
            n, lag = sp.end - sp.start, train_version - sp.version
            counts[min(max(lag, 0), LAG_BUCKETS - 1)] += n
            lag_sum += n * lag
            lag_max = max(lag_max, lag)
            tokens += n
    if not tokens:
        return {}
    p = STALENESS_PREFIX
    out = {f"{p}versions_per_sample_mean": sum(versions) / len(versions),
           f"{p}versions_per_sample_max": float(max(versions)),
           f"{p}token_lag_mean": lag_sum / tokens, f"{p}token_lag_max": float(lag_max),
           f"{p}stale_token_frac": (tokens - counts[0]) / tokens}
    out.update({f"{p}tokens_{_bucket(k)}": c / tokens for k, c in enumerate(counts)})
    return out
