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


def test_paired_final_entropy_pairs_by_seed_and_applies_the_criterion():
    from ulorl.bench.entropy_map import paired_final_entropy

    def row(variant, seed, final):
        return {"variant": variant, "seed_offset": seed, "entropy": {"values": [0.9] * 5 + [final] * 10}}

    rows = [row("off", s, 0.20 + 0.01 * s) for s in range(4)] + [row("static", s, 0.30 + 0.012 * s) for s in range(4)]
    rows.append(row("static", 9, 1.0))     # no partner: left out
    out = paired_final_entropy(rows, "static", "off")
    assert out["seeds"] == [0, 1, 2, 3]
    assert out["diffs"] == pytest.approx([0.10, 0.102, 0.104, 0.106])
    assert out["mean"] == pytest.approx(0.103) and out["t95"][0] < 0.103 < out["t95"][1]
    assert out["mde"] < 0.01 and out["beyond_2_mde"] is True
    few = paired_final_entropy(rows[:2] + rows[4:6], "static", "off")
    assert "mean" not in few and "2 seed" in few["why"]


def test_run_table_reports_final_entropy_share_at_own_tau_and_proxy_agreement():
    from ulorl.bench.entropy_map import run_table

    records = [_record(2, [-0.01, -0.04, -0.05, 0.0]), _record(4, [-0.03, 0.0, -0.01, 0.04])]
    history = [{"train/entropy": 0.5 - 0.01 * i} for i in range(20)]
    row = {"label": "static seed+0", "tau": 0.85, **summarize_trial(history, records, tau=0.85)}
    table = run_table([row])
    line = table.splitlines()[2]
    # first 10 steps: mean 0.5 - 0.045 = 0.455; last 10: 0.5 - 0.145 = 0.355, their SE
    # 0.01 * sd(0..9) / sqrt(10) = 0.01 * 3.0277 / 3.1623 = 0.009574
    assert line.startswith("| static seed+0 | 0.455 -> 0.355 +- 0.00957 |")
    # MPT share at the run's tau 0.85: (-0.04 - 0.04 sgd, x2 adam) / (-0.2 adam) = 80 %
    assert "| 80.0% (" in line
    assert "| -0.2 |" in line            # two probed steps' realized -0.1 each, summed
    assert run_table([{"label": "bare"}]).splitlines()[2].startswith("| bare | - -> - +- - | - (-) | - |")
