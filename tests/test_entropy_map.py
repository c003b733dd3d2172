"""The entropy map's summary of one run (``ulorl.bench.entropy_map.summarize_trial``) on hand-made probe records."""

from __future__ import annotations

import pytest
import torch

from ulorl.bench.entropy_map import summarize_trial, summary_table
from ulorl.train.entropy_probe import ProbeRecord


def _record(step: int, terms: list[float]) -> ProbeRecord:
    # four tokens: positive p 0.995 and 0.87, negative p 0.3 and 0.96
    p = torch.tensor([0.995, 0.87, 0.3, 0.96], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    t = torch.tensor(terms, dtype=torch.float64)
    return ProbeRecord(step=step, p=p, advantage=adv, masked=torch.zeros(4, dtype=torch.bool),
                       terms={"sgd": t, "adam": 2 * t}, summary={"entropy/exact/realized": -0.1})


def test_share_by_tau_is_the_ratio_of_sums_over_probed_steps():
    records = [_record(2, [-0.01, -0.04, -0.05, 0.0]), _record(4, [-0.03, 0.0, -0.01, 0.04])]
    history = [{"train/entropy": 0.5 - 0.01 * i} for i in range(4)]
    row = summarize_trial(history, records, tau=0.99)
    # sums: MPT at tau 0.99 = -0.04; at tau 0.85 (0.995 and 0.87 positives) = -0.08; all = -0.10
    assert row["share"]["sgd"]["0.99"] == pytest.approx(0.4)
    assert row["share"]["sgd"]["0.85"] == pytest.approx(0.8)
    assert row["share"]["adam"]["0.85"] == pytest.approx(0.8)          # scale-free
    # per-step shares at 0.99: 0.01 / 0.10 and 0.03 / 0.0 (NaN: total 0, skipped) -> median 0.1
    assert row["share_median_step"]["sgd"]["0.99"] == pytest.approx(0.1)
    # gross at 0.99: |MPT| 0.01 + 0.03 over sum |class terms| (0.01+0.04+0.05) + (0.03+0.01+0.04)
    assert row["share_gross"]["sgd"]["0.99"] == pytest.approx(0.04 / 0.18)
    assert row["token_share"]["0.85"] == 0.5 and row["token_share"]["0.99"] == 0.25
    assert row["entropy"]["start"] == pytest.approx(0.485) and row["probed_steps"] == [2, 4]
    assert sum(row["bins"]["sgd"]["pos"].values()) + sum(row["bins"]["sgd"]["neg"].values()) == pytest.approx(-0.1)
    assert "| configuration |" in summary_table([{"label": "x", **row}])
