"""DAPO-style fill (``algo.dynamic_sampling_fill``): several rollout rounds feed one training step.

With fill on, the scheduler releases groups only once ``rollout.min_ready_groups`` ready groups have
mixed rewards (``ulorl.rollout.pools.has_mixed_rewards``), and ``Trainer.train_step`` repeats the
rollout (each round admits new prompts and decodes one segment of every unfinished sample) until a
release happens or ``algo.dynamic_sampling_fill_max_rounds`` rounds ran. This module merges the
rounds' metrics into the step's::

    metrics = merge_round_metrics(first_round, second_round)   # counts and times add up
"""

from __future__ import annotations

#: Metrics that are per-round amounts (they add up over the rounds of one step); every other
#: rollout metric describes the state after the round (the last round's value is kept).
ADDITIVE_METRICS: frozenset[str] = frozenset({
    "time/rollout_s", "rollout/tokens", "rollout/finished", "rollout/truncated", "rollout/admitted",
    "rollout/dropped", "rollout/released_groups", "rollout/batch_rows", "rollout/carried_rows",
})


def merge_round_metrics(so_far: dict[str, float], latest: dict[str, float]) -> dict[str, float]:
    """Metrics of rounds 1..k+1 from those of rounds 1..k and of round k+1 (pure).

    Additive metrics are summed, ``rollout/tokens_per_s`` is recomputed from the sums, everything
    else takes the latest round's value. ``rollout/fill_rounds`` counts the rounds merged.
    """
    out = dict(so_far)
    out.update({k: v for k, v in latest.items() if k not in ADDITIVE_METRICS})
    for key in ADDITIVE_METRICS:
        if key in so_far or key in latest:
            out[key] = so_far.get(key, 0.0) + latest.get(key, 0.0)
    if out.get("time/rollout_s", 0.0) > 0:
        out["rollout/tokens_per_s"] = out.get("rollout/tokens", 0.0) / out["time/rollout_s"]
    out["rollout/fill_rounds"] = so_far.get("rollout/fill_rounds", 1.0) + 1.0
    return out
