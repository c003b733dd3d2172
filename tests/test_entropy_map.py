"""The entropy map's summary of one run (``ulorl.bench.entropy_map.summarize_trial``) on hand-made probe records."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ulorl.bench.entropy_map import summarize_trial, summary_table
from ulorl.train.entropy_probe import ProbeRecord

ROOT = Path(__file__).resolve().parents[1]


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


def test_model_shape_reads_the_folder_and_its_manifest(tmp_path):
    from ulorl.bench.entropy_map import model_shape

    shipped = model_shape("embedded:choice")
    assert (shipped["hidden_size"], shipped["num_hidden_layers"], shipped["intermediate_size"]) == (128, 4, 512)
    assert shipped["parameters"] > 10**6
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"hidden_size": 64, "num_hidden_layers": 2, "rope_theta": 1}')
    assert model_shape(str(tmp_path / "m")) == {"hidden_size": 64, "num_hidden_layers": 2}
    assert model_shape("Qwen/Qwen3-4B") == {}  # a hub id: nothing local to read


def test_a_missing_model_folder_stops_the_map_with_its_path(tmp_path, capsys):
    from ulorl.bench.entropy_map import main

    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: s\nbase: {ROOT / 'experiments' / 'quickstart_choice.yaml'}\n"
                    f"variants:\n  - {{name: gone, overrides: {{model.name_or_path: {tmp_path / 'nope'}}}}}\n"
                    "search: {algorithm: grid}\nmetric: train/entropy\nmode: min\nstop: {steps: 1}\n")
    assert main([str(spec), "--out", str(tmp_path / "o.jsonl"), "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "gone seed+0" in err and str(tmp_path / "nope") in err
    assert not (tmp_path / "o.jsonl").exists() or not (tmp_path / "o.jsonl").read_text()


def test_variant_table_pools_each_variants_seeds_as_a_ratio_of_sums():
    from ulorl.bench.entropy_map import variant_table

    def row(variant, mpt_low, mpt_top, neg, share, cpu):
        return {"variant": variant, "entropy": {"start": 0.2, "end": 0.1}, "cost": {"cpu_s": cpu},
                "shape": {"hidden_size": 64, "num_hidden_layers": 2, "parameters": 290_000},
                "bins": {"adam": {"pos": {"0-0.5": 0.0, "0.8-0.9": mpt_low, "0.99-1": mpt_top},
                                  "neg": {"0-0.5": neg}}},
                "classes": {"adam": {"pos_high": mpt_low + mpt_top, "neg_low": neg}},
                "share": {"adam": {"0.8": share}}}

    rows = [row("narrow", -0.2, -0.1, -0.7, 0.3, 10), row("narrow", -0.1, 0.0, -0.9, 0.1, 20)]
    table = variant_table(rows).splitlines()
    assert len(table) == 3
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    # totals -1.0 and -1.0; MPT at 0.8: -0.3 and -0.1 -> 20 %; at 0.9 and 0.99 only the 0.99-1 bin: -0.1 -> 5 %
    assert cells[:4] == ["narrow", "2", "0.29 M", "64 x 2"]
    assert cells[5:] == ["-1", "20.0%", "5.0%", "5.0%", "10.0% - 30.0%", "20.0%", "15"]


def test_pool_by_variant_sums_bins_and_recomputes_the_share():
    from ulorl.bench.entropy_map import pool_by_variant

    def row(variant, mpt, neg):
        return {"variant": variant, "bins": {"adam": {"pos": {"0-0.5": 0.0, "0.8-0.85": mpt}, "neg": {"0-0.5": neg}}}}

    pooled = pool_by_variant([row("a", -0.3, -0.7), row("b", -0.5, -0.5), row("a", -0.1, -0.9)])
    assert [p["label"] for p in pooled] == ["a (2 runs)", "b (1 runs)"]
    assert pooled[0]["bins"]["adam"]["pos"]["0-0.5"] == 0.0
    assert pooled[0]["bins"]["adam"]["pos"]["0.8-0.85"] == pytest.approx(-0.4)
    assert pooled[0]["share"]["adam"]["0.8"] == pytest.approx(0.2)    # -0.4 / -2.0
    assert pooled[0]["share"]["adam"]["0.85"] == pytest.approx(0.0)   # no bin starts at or above 0.85
    assert pooled[1]["share"]["adam"]["0.8"] == pytest.approx(0.5)
