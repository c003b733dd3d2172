"""``ulorl-tables --mismatch`` (ulorl.report.mismatch): the folding over updates by hand, and the report from a
store written with the real MLflow client and from the results files exported from it (same numbers)."""

from __future__ import annotations

import csv
import io
import json

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from ulorl.cli.tables import main as tables_main
from ulorl.report.mismatch import arm_rows, fold, split_rows, summarize
from ulorl.tracking import schema

M = schema.mismatch_metric
C = schema.CORRECTION_PREFIX


def test_fold_by_meaning():
    assert fold("mismatch/tokens", [3, 5]) == 8
    assert fold("mismatch/abs_max", [0.1, 0.3, 0.2]) == 0.3
    assert fold("mismatch/seq_logratio_min", [-0.1, -0.5]) == -0.5
    assert fold("correction/weight_min", [0.9, 0.7]) == 0.7
    assert fold("mismatch/seg2/abs_mean", [0.1, 0.4], tokens=[3, 1]) == pytest.approx((0.3 + 0.4) / 4)
    assert fold("mismatch/abs_mean", [0.1, 0.4]) == pytest.approx(0.25)          # no token counts: plain mean
    assert fold("mismatch/coverage", [1.0, 0.5], tokens=[9, 1]) == pytest.approx(0.75)   # not token-weighted


def test_summarize_pairs_each_split_with_its_own_tokens():
    hist = {M("tokens"): ([1, 2], [10.0, 30.0]), M("k3_kl"): ([1, 2], [1e-3, 2e-3]),
            M("tokens", segment=1): ([2], [5.0]), M("abs_mean", segment=1): ([2], [0.2]),
            "train/entropy": ([1, 2], [0.3, 0.2])}
    s = summarize(lambda k: hist.get(k, ([], [])), hist)
    assert s["steps"] == 2 and "train/entropy" not in s
    assert s[M("k3_kl")] == pytest.approx((10 * 1e-3 + 30 * 2e-3) / 40)
    assert s[M("abs_mean", segment=1)] == pytest.approx(0.2)
    rows = split_rows(s, max_response_len=131072)
    assert [r["label"] for r in rows] == ["segment 1"]
    rows = split_rows({M("tokens", bucket=7): 4.0, M("tokens", bucket=0): 1.0}, max_response_len=131072)
    assert [r["label"] for r in rows] == ["tokens 0-16384", "tokens 114688-131072"]


def _write_store(uri: str) -> dict[str, str]:
    """Two runs of sweep ``mm`` (arms off and icepop, seed 0), 2 updates each, and a run of another sweep."""
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("ulorl")
    t0 = 1_700_000_000_000
    ids = {}
    for name, mode, sweep, vals in (
        ("off", "off", "mm", {M("tokens"): [10, 30], M("abs_mean"): [0.01, 0.03], M("abs_max"): [0.2, 0.1],
                              M("k3_kl"): [1e-4, 1e-4], M("coverage"): [1.0, 0.5],
                              M("tokens", segment=0): [10, 20], M("abs_mean", segment=0): [0.01, 0.04],
                              M("tokens", segment=1): [10], M("abs_mean", segment=1): [0.01],
                              M("tokens", bucket=3): [4, 6], M("abs_max", bucket=3): [0.2, 0.1]}),
        ("icepop", "icepop", "mm", {M("tokens"): [20, 20], M("abs_mean"): [0.02, 0.04], M("abs_max"): [0.3, 0.5],
                                    C + "rejected_frac": [0.1, 0.3], C + "weight_mean": [1.0, 0.8]}),
        ("other", "off", "elsewhere", {M("tokens"): [1, 1], M("abs_mean"): [0.5, 0.5]}),
    ):
        tags = {schema.KIND_TAG: "train", schema.SWEEP_TAG: sweep, schema.VARIANT_TAG: name, schema.SEED_TAG: "0"}
        rid = client.create_run(exp, run_name=name, start_time=t0 + len(ids), tags=tags).info.run_id
        metrics = [Metric(k, float(v), t0 + i, i + 1) for k, vs in vals.items() for i, v in enumerate(vs)]
        metrics.append(Metric(schema.eval_metric("heldout", "avg_at_k"), 0.5 if mode == "off" else 0.75, t0, 2))
        client.log_batch(rid, metrics=metrics, params=[Param("algo.rollout_correction.mode", mode),
                                                       Param("algo.is_mode", "pois"), Param("rollout.segments", "4"),
                                                       Param("rollout.max_response_len", "16"),
                                                       Param("rollout.engine_dtype", "bfloat16")])
        client.set_terminated(rid)
        ids[name] = rid
    return ids


def _csv_rows(path) -> dict[str, dict[str, str]]:
    return {r["run"]: r for r in csv.DictReader(io.StringIO(path.read_text()))}


def test_tables_mismatch_from_the_store_and_from_results_files(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    _write_store(uri)
    out = tmp_path / "tables"
    assert tables_main(["--mismatch", "--tracking-uri", uri, "--sweep", "mm", "--out", str(out)]) == 0
    rows = _csv_rows(out / "mismatch.csv")
    assert sorted(rows) == ["icepop", "off"]                           # the other sweep's run is left out
    off, ice = rows["off"], rows["icepop"]
    assert float(off["abs_mean"]) == pytest.approx((10 * 0.01 + 30 * 0.03) / 40)   # token-weighted over updates
    assert float(off["abs_max"]) == pytest.approx(0.2) and float(off["tokens"]) == 40
    assert float(off["coverage"]) == pytest.approx(0.75) and off["updates"] == "2"
    assert float(ice["rejected_frac"]) == pytest.approx(0.2) and float(ice["weight_mean"]) == pytest.approx(0.9)
    assert ice["correction"] == "icepop" and ice["engine_dtype"] == "bfloat16"
    assert float(ice["heldout_avg_at_k"]) == 0.75
    md = (out / "mismatch.md").read_text()
    assert "## off" in md and "| segment 1 | 10 | 0.0100 |" in md
    assert "| tokens 6-8 | 10 | — | 0.2000 |" in md          # bucket 3 of 16 tokens; the max of its max
    assert "| icepop | 1 |" in (out / "mismatch_arms.md").read_text()
    printed = capsys.readouterr().out
    assert "Train / inference mismatch per run" in printed

    # the results files keep the folded summary: the report reads the same numbers from them
    results = tmp_path / "results"
    assert tables_main(["--tracking-uri", uri, "--export-results", str(results), "--sweep", "mm"]) == 0
    record = json.loads((results / "mm.jsonl").read_text().splitlines()[0])
    assert record["mismatch"][M("abs_mean")] == pytest.approx(0.025) and record["mismatch"]["steps"] == 2
    out2 = tmp_path / "from_results"
    assert tables_main(["--mismatch", "--results", str(results / "mm.jsonl"), "--out", str(out2)]) == 0
    assert _csv_rows(out2 / "mismatch.csv") == rows
    assert (out2 / "mismatch.md").read_text() == md
    assert tables_main(["--mismatch", "--export-results", str(results)]) == 2


def test_arm_rows_average_over_seeds():
    rows = [{"variant": "a", "correction": "off", "seed": "0", "abs_mean": 0.1, "abs_max": 0.5,
             "seq_logratio_min": -1.0, "heldout_avg_at_k": 0.5},
            {"variant": "a", "correction": "off", "seed": "1", "abs_mean": 0.3, "abs_max": 0.2,
             "seq_logratio_min": -3.0, "heldout_avg_at_k": 0.7},
            {"variant": "b", "correction": "icepop", "seed": "1", "heldout_avg_at_k": 0.9}]
    arm, other = arm_rows(rows, baseline="a")
    assert arm["seeds"] == 2 and arm["abs_mean"] == pytest.approx(0.2) and arm["abs_max"] == 0.5
    assert arm["seq_logratio_min"] == -3.0 and arm["heldout_avg_at_k"] == pytest.approx(0.6)
    assert (arm["heldout_min"], arm["heldout_max"]) == (0.5, 0.7) and arm["heldout_vs_baseline"] == 0.0
    assert other["heldout_vs_baseline"] == pytest.approx(0.2)          # paired with the baseline's seed 1 only


def test_the_correction_sweep_runs_an_arm_per_mode_on_three_seeds_with_a_bf16_engine():
    from pathlib import Path

    from ulorl.algo.rollout_correction import ROLLOUT_CORRECTIONS
    from ulorl.sweep.launch import describe_trials
    from ulorl.sweep.spec import grid_trials, load_sweep

    path = Path(__file__).resolve().parents[1] / "sweeps" / "choice" / "rollout_correction.yaml"
    spec, base_path, base = load_sweep(path)
    assert spec.name == "choice_rollout_correction" and base_path.name == "quickstart_choice.yaml"
    assert spec.overrides["rollout.engine_dtype"] == "bfloat16" and spec.max_concurrent == 1
    trials = grid_trials(spec)
    modes = {t["overrides"]["algo.rollout_correction.mode"] for t in trials}
    # the sweep is what ran (experiments/results/choice_rollout_correction.jsonl): every mode but the geometric-mean
    # ones, which came after it and have not been run on this task
    not_run = {"geo_tis", "geo_mis"}
    assert not_run <= set(ROLLOUT_CORRECTIONS)
    assert modes == set(ROLLOUT_CORRECTIONS) - not_run
    assert sorted(t["repeat"] for t in trials) == sorted(list(range(3)) * len(modes))
    assert describe_trials(spec, base, base_path)
