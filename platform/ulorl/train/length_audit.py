"""Length audit: where every sample goes, and how long the samples of each fate are.

Why. Filters, budgets, staleness limits and checkpoints all act on length: a run that silently loses
or skips its long samples trains on short ones without anyone seeing it. The audit follows every
sample from admission to its final fate and logs, per step, how many met each fate, their response
lengths (p50 / p90 / max) and each fate's share of the run's decoded tokens
(``ulorl.tracking.schema.audit_metric``).

Fates (``schema.AUDIT_*_FATES``):

* final, exactly one per sample: ``trained`` (in an update), ``filtered`` (dynamic sampling: its
  group's rewards were all equal), ``stale`` (dropped with its group by ``rollout.max_staleness``),
  ``refused`` (released, but the update was refused: non-finite loss), ``lost_resume`` (started
  before a checkpoint, neither settled nor in a pool after resuming from it: must stay 0);
* completion, when a sample stops decoding (it then waits for its group and meets a final fate
  later): ``eos``, ``truncated`` (reached ``rollout.max_response_len``, reward 0), ``clipped``
  (cut at the engine's context, finished as truncated);
* pool, a snapshot at the end of the step: ``unfinished`` (still decoding), ``waiting`` (done,
  its group not yet complete).

Ledger, every step: ``started == sum of final-fate totals + unfinished + waiting`` (prompts dropped as
too long at load never start a sample: counted apart, as prompts). ``token_share`` of a final or
completion fate is its cumulative tokens / the run's decoded response tokens; of a pool fate, the
tokens it holds now / the same; the final and pool shares add up to 1 (lost samples' tokens aside).

Pure bookkeeping (no I/O); the trainer checkpoints it with ``state_dict``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from ulorl.rollout.pools import has_mixed_rewards
from ulorl.rollout.types import Sample, SampleStatus
from ulorl.tracking.schema import (
    AUDIT_COMPLETION_FATES,
    AUDIT_FINAL_FATES,
    AUDIT_POOL_FATES,
    AUDIT_PROMPTS_TOO_LONG,
    AUDIT_STARTED,
    audit_metric,
)

__all__ = ["LengthAudit", "length_quantile", "settle_released"]

log = logging.getLogger(__name__)
_COUNTED = AUDIT_FINAL_FATES + AUDIT_COMPLETION_FATES


def length_quantile(sorted_lengths: Sequence[int], q: float) -> float:
    """The ``q`` quantile of ascending ``sorted_lengths`` with linear interpolation (numpy's default):
    ``length_quantile([10, 20, 30, 40], 0.9) == 37.0``."""
    if not sorted_lengths:
        raise ValueError("no lengths")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    pos = q * (len(sorted_lengths) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_lengths) - 1)
    return float(sorted_lengths[lo] + (sorted_lengths[hi] - sorted_lengths[lo]) * (pos - lo))


def settle_released(samples: Sequence[Sample], updated: bool, dynamic_sampling: bool) -> dict[str, list[Sample]]:
    """Final fates of released samples (whole groups): ``filtered`` = groups whose rewards are all
    equal when ``algo.dynamic_sampling`` is on (the update's own rule); the rest ``trained`` if the
    update ran (``updated``), else ``refused``."""
    groups: dict[int, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.group_id, []).append(s)
    out: dict[str, list[Sample]] = {"trained": [], "filtered": [], "refused": []}
    for group in groups.values():
        if dynamic_sampling and not has_mixed_rewards(group):
            out["filtered"] += group
        else:
            out["trained" if updated else "refused"] += group
    return out


class LengthAudit:
    """Cumulative counts and tokens per fate, and this step's lengths per fate (module docstring)."""

    def __init__(self) -> None:
        self.started = 0
        self.totals: dict[str, int] = dict.fromkeys(_COUNTED, 0)
        self.tokens: dict[str, int] = dict.fromkeys(_COUNTED, 0)
        self._step: dict[str, list[int]] = {f: [] for f in _COUNTED}
        self._lost_now = 0   # lost at the last resume, reported at the next step

    # -- events ----------------------------------------------------------------------------------
    def admit(self, n: int) -> None:
        """``n`` new samples started decoding."""
        self.started += int(n)

    def record(self, fate: str, samples: Iterable[Sample]) -> None:
        """``samples`` met ``fate`` (a final or completion fate) this step."""
        if fate not in self.totals:
            raise ValueError(f"unknown fate {fate!r}; final: {AUDIT_FINAL_FATES}, completion: {AUDIT_COMPLETION_FATES}")
        for s in samples:
            self.totals[fate] += 1
            self.tokens[fate] += s.response_len
            self._step[fate].append(s.response_len)

    def rolled_out(self, admitted: int, completed: Sequence[Sample], clipped_ids: Iterable[int],
                   stale: Sequence[Sample]) -> None:
        """One scheduler step: ``admitted`` new samples, ``completed`` (FINISHED -> eos; TRUNCATED ->
        clipped when its id is in ``clipped_ids``, else truncated) and the ``stale`` group drops."""
        clipped = set(clipped_ids)
        self.admit(admitted)
        self.record("eos", [s for s in completed if s.status is SampleStatus.FINISHED])
        self.record("clipped", [s for s in completed if s.status is not SampleStatus.FINISHED
                                and s.sample_id in clipped])
        self.record("truncated", [s for s in completed if s.status is not SampleStatus.FINISHED
                                  and s.sample_id not in clipped])
        self.record("stale", stale)

    def released(self, samples: Sequence[Sample], updated: bool, dynamic_sampling: bool) -> None:
        """Released groups after the update (:func:`settle_released`)."""
        for fate, group in settle_released(samples, updated, dynamic_sampling).items():
            self.record(fate, group)

    def reconcile(self, in_pool: int) -> int:
        """After a resume: samples started but neither settled nor in a pool (``in_pool``) are
        ``lost_resume`` (lengths unknown: counted, no tokens). Returns how many; 0 is the only right answer."""
        lost = self.started - self.final_total - int(in_pool)
        if lost < 0:
            raise ValueError(f"length audit: {in_pool} samples in the pools but only {self.started - self.final_total} "
                             "started and unsettled: the checkpoint's audit and pools disagree")
        if lost:
            log.warning("length audit: %d samples started before the checkpoint are missing after resuming", lost)
            self.totals["lost_resume"] += lost
            self._lost_now += lost
        return lost

    # -- reading ---------------------------------------------------------------------------------
    @property
    def final_total(self) -> int:
        return sum(self.totals[f] for f in AUDIT_FINAL_FATES)

    def step_metrics(self, unfinished: Sequence[Sample], waiting: Sequence[Sample], decoded_tokens: int,
                     prompts_too_long: int) -> dict[str, float]:
        """This step's audit metrics (names: ``schema.audit_metric``); clears the step's lengths.

        ``unfinished`` / ``waiting``: the samples in the unfinished / experience pool now;
        ``decoded_tokens``: response tokens decoded in the run so far (the share denominator);
        ``prompts_too_long``: prompts dropped at load (cumulative)."""
        denom = max(int(decoded_tokens), 1)
        out: dict[str, float] = {AUDIT_STARTED: float(self.started),
                                 AUDIT_PROMPTS_TOO_LONG: float(prompts_too_long)}
        per_step = {**self._step, "unfinished": [s.response_len for s in unfinished],
                    "waiting": [s.response_len for s in waiting]}
        for fate in AUDIT_FINAL_FATES + AUDIT_COMPLETION_FATES + AUDIT_POOL_FATES:
            lengths = sorted(per_step[fate])
            out[audit_metric(fate, "count")] = float(len(lengths) + (self._lost_now if fate == "lost_resume" else 0))
            if fate in self.totals:
                out[audit_metric(fate, "total")] = float(self.totals[fate])
                tokens = self.tokens[fate]
            else:
                tokens = sum(lengths)
            out[audit_metric(fate, "token_share")] = tokens / denom
            if lengths:
                out[audit_metric(fate, "len_p50")] = length_quantile(lengths, 0.5)
                out[audit_metric(fate, "len_p90")] = length_quantile(lengths, 0.9)
                out[audit_metric(fate, "len_max")] = float(lengths[-1])
        self._step = {f: [] for f in _COUNTED}
        self._lost_now = 0
        return out

    # -- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"started": self.started, "totals": dict(self.totals), "tokens": dict(self.tokens)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.started = int(state["started"])
        self.totals = {**dict.fromkeys(_COUNTED, 0), **{k: int(v) for k, v in state["totals"].items()}}
        self.tokens = {**dict.fromkeys(_COUNTED, 0), **{k: int(v) for k, v in state["tokens"].items()}}
        self._step = {f: [] for f in _COUNTED}
