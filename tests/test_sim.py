"""Rollout cost simulator (ulorl.sim.simulator) and the ulorl-sim CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ulorl.cli import sim as cli
from ulorl.report import paper
from ulorl.sim.simulator import (
    CostModel,
    EmpiricalLengths,
    LogNormalLengths,
    MixtureLengths,
    RolloutSetup,
    evaluate,
    fit_cost_curve,
    load_lengths,
    simulate,
)
from ulorl.sim.studies import run_paper, run_plan, run_validate, synthetic_bench

TRUTH = CostModel(a=8.0, b=0.05, c=2e-4, p=0.01, o=40.0)


def test_features_of_a_hand_worked_steady_state():
    # One prompt x 2 per step with lengths (3, 7), max 8, S=2 (segment 4), prompt 2 tokens.
    # Steady step: carried row (L=7, d=4) decodes 3 and ends; new rows decode 3 (EOS) and 4.
    dist = EmpiricalLengths(lengths=(3, 7), groups=((3, 7),))
    st = simulate(RolloutSetup(8, 2, 1, 2, "static", prompt_len=2), dist, steps=5)
    # iterations 4; row-slots 3*4; padded context 6: 3*4*6 + 3*(0+1+2+3); prefill 3 rows x 6;
    # the group (3, 7) is released when its long member ends: (3+2) + (7+2) tokens trained.
    assert st.features.tolist() == [[4, 12, 90, 18, 14, 1, 0]] * 5
    assert st.completed.tolist() == [2] * 5 and st.batch_rows.tolist() == [3] * 5
    cp = simulate(RolloutSetup(8, 2, 1, 2, "compact", prompt_len=2), dist, steps=2)
    assert cp.features[0].tolist() == [4, 10, 6 * 10 + (3 + 3 + 6), 18, 14, 1, 0]
    row = simulate(RolloutSetup(8, 2, 1, 2, "compact", prompt_len=2, context="row"), dist, steps=2)
    assert row.features[0].tolist() == [4, 10, (3 * 6 + 3 * 2 + 4 * 2) + 12, 6 + 2 + 2, 14, 1, 0]
    # bucketed contexts: the carried row (context 6) and the new rows (2) get separate buckets when
    # the planner finds it cheaper; a static batch computes every bucket at every iteration
    bk = simulate(RolloutSetup(8, 2, 1, 2, "static", prompt_len=2, context="bucket", bucket_overhead=0.0),
                  dist, steps=2)
    assert bk.features[0].tolist() == [4, 12, 4 * (6 + 2 + 2) + 3 * 6, 6 + 2 + 2, 14, 1, 4]
    res = evaluate(st, CostModel(a=1000.0))               # 1 s per iteration, nothing else
    assert res.step_time_s == 4.0 and res.finished_per_s == 0.5
    assert res.decode_utilization == pytest.approx(10 / 12) and res.iters_per_finished == 2.0
    assert res.multi_segment_frac == 0.5 and res.staleness_mean == 0.5


def test_truncation_and_segment_clipping():
    dist = EmpiricalLengths(lengths=(50,))                # always longer than the max
    tr = simulate(RolloutSetup(10, 3, 1, 1, "static"), dist, steps=4)   # segments 4, 4, 2
    assert sorted(set(tr.features[:, 0].tolist())) == [4.0]             # longest row per step: 4
    assert tr.truncated.sum() == tr.completed.sum() == 4
    assert tr.useful_tokens.tolist() == [10] * 4                         # 4 + 4 + 2 per step


def test_cost_curve_fit_recovers_coefficients():
    pts = [{"rows": r, "context": c, "ms_per_iter": TRUTH.iter_ms(r, c)} for r in (1, 16, 64) for c in (10, 500)]
    model, q = fit_cost_curve(pts)
    assert (model.a, model.b, model.c) == pytest.approx((8.0, 0.05, 2e-4), rel=1e-9)
    assert q["max_rel_err"] < 1e-9
    flat, _ = fit_cost_curve([{"rows": r, "context": 9, "ms_per_iter": 5.0} for r in (1, 8, 64)])
    assert (flat.a, flat.b, flat.c) == pytest.approx((5.0, 0.0, 0.0), abs=1e-9)
    with pytest.raises(ValueError, match="ms_per_iter"):
        fit_cost_curve([{"rows": 1, "context": 2}])


@pytest.mark.parametrize("traits", [dict(context="padded"),
                                    dict(context="bucket", share_prompt_prefill=True, compact_min_frac=0.125)])
def test_validate_recovers_parameters_of_its_own_synthetic_bench(traits):
    rng = np.random.default_rng(5)
    groups = MixtureLengths(((0.8, 4.0, 0.5), (0.2, 5.5, 0.4)), rho=0.7).sample(rng, 300, 8)
    truth_dist = EmpiricalLengths(lengths=tuple(groups.reshape(-1).tolist()),
                                  groups=tuple(tuple(g) for g in np.minimum(groups, 512).tolist()))
    bench = synthetic_bench(TRUTH, truth_dist, max_len=512, prompts_per_step=16, group_size=8, prompt_len=40,
                            steps=120, seed=3, **traits)
    out = run_validate(json.loads(json.dumps(bench)), steps=120, seed=3, free=("scale", "overhead"))
    f = out["cost_curve_fit"]
    assert (f["a_ms"], f["b_ms"], f["c_ms"]) == pytest.approx((8.0, 0.05, 2e-4), rel=1e-9)
    assert out["s1_fit"]["prefill_ms_per_token"] == pytest.approx(0.01, rel=1e-9)
    assert out["s1_fit"]["decode_scale"] == pytest.approx(1.0, rel=1e-9)
    assert out["s1_fit"]["overhead_ms"] == pytest.approx(40.0, rel=1e-6)
    assert out["passed"] and out["max_abs_rel_err"] < 1e-9
    assert {(r["segments"], r["regime"]) for r in out["rows"]} == {(s, g) for s in (1, 2, 4, 8)
                                                                   for g in ("static", "compact")}


def test_validate_predicts_within_tolerance_from_sampled_lengths():
    dist = MixtureLengths(((0.8, 4.0, 0.5), (0.2, 5.5, 0.4)), rho=0.7)
    bench = synthetic_bench(TRUTH, dist, max_len=512, prompts_per_step=16, group_size=8, prompt_len=40,
                            steps=300, seed=1, n_lengths=16000)
    out = run_validate(bench, steps=300, seed=0)
    assert out["passed"] and out["max_abs_rel_err"] < 0.06


def test_paper_fit_is_exact_on_s1_s2_and_predicts_s4():
    out = run_paper(paper.table1_by_segments(), steps=20)
    rows = {r["segments"]: r for r in out["rows"]}
    for s, t in ((1, 1240.0), (2, 774.0)):
        assert rows[s]["predicted_step_s"] == pytest.approx(t, rel=1e-9)
        assert rows[s]["predicted_step_s_prefill_fit"] == pytest.approx(t, rel=1e-9)
    assert rows[4]["paper_step_s"] == 601.0 and rows[4]["paper_speedup"] == 2.06
    assert rows[4]["predicted_step_s"] < rows[2]["predicted_step_s"]
    assert 0.75 <= out["lengths"]["frac_within_half"] <= 0.85
    # flat cost, >=1 response longer than 32k in every 1024: S=2 always decodes a full 32k segment
    assert rows[2]["decode_iters_per_step"] == 32768 and rows[4]["decode_iters_per_step"] == 16384
    imp = out["implied_three_point"]
    assert imp is not None and imp["a_ms"] > 0


def test_plan_picks_the_best_predicted_throughput():
    dist = LogNormalLengths(5.0, 0.8, rho=0.3)
    kw = dict(max_len=1024, prompts_per_step=32, group_size=4, segments=[1, 2, 4, 8], steps=60)
    out = run_plan(dist, CostModel(a=10.0), **kw)      # flat GPU-like cost: the tail is pure waste
    by = {(r["regime"], r["segments"]): r["finished_per_s"] for r in out["results"]}
    best = max(by, key=by.get)
    assert (out["recommendation"]["regime"], out["recommendation"]["segments"]) == best
    for reg in ("static", "compact"):
        assert out["best"][reg]["segments"] == max((s for g, s in by if g == reg), key=lambda s: by[(reg, s)])
    assert out["best"]["static"]["segments"] == 8
    # costly re-prefill and per-row cost, compact batching: segments do not pay
    out2 = run_plan(dist, CostModel(a=1.0, b=1.0, p=5.0), regimes=["compact"], **kw)
    assert out2["recommendation"]["segments"] == 1


def test_load_lengths_formats(tmp_path):
    (tmp_path / "a.json").write_text("[3, 5, 9]")
    (tmp_path / "b.json").write_text("[[3, 5], [9, 9]]")
    (tmp_path / "c.jsonl").write_text('{"response_len": 4}\n{"length": 6}\n\n7\n')
    (tmp_path / "d.json").write_text(json.dumps({"lengths": [1, 2], "results": []}))
    assert load_lengths(tmp_path / "a.json").lengths == (3, 5, 9)
    b = load_lengths(tmp_path / "b.json")
    assert b.groups == ((3, 5), (9, 9)) and b.lengths == (3, 5, 9, 9)
    assert load_lengths(tmp_path / "c.jsonl").lengths == (4, 6, 7)
    assert load_lengths(tmp_path / "d.json").lengths == (1, 2)
    (tmp_path / "e.jsonl").write_text('{"foo": 1}\n{"foo": 2}\n')
    with pytest.raises(ValueError, match="e.jsonl:1"):
        load_lengths(tmp_path / "e.jsonl")
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_lengths(tmp_path / "nope.json")


def test_lognormal_quantile_and_group_correlation():
    d = LogNormalLengths.with_quantile(1000, 0.8, 0.5, rho=0.9)
    assert d.frac_within(1000) == pytest.approx(0.8, abs=0.01)
    x = np.log(d.sample(np.random.default_rng(0), 4000, 2))
    assert np.corrcoef(x[:, 0], x[:, 1])[0, 1] == pytest.approx(0.9, abs=0.03)


# ----------------------------------------------------------------------------- CLI


def _json_out(capsys) -> dict:
    out = capsys.readouterr().out
    assert out.count("\n") == 1                     # exactly one JSON object on stdout
    return json.loads(out)


def test_cli_paper_json_and_text(capsys):
    assert cli.main(["paper", "--json", "--steps", "10"]) == 0
    out = _json_out(capsys)
    assert out["command"] == "paper" and len(out["rows"]) == 4
    assert cli.main(["paper", "--steps", "10"]) == 0
    text = capsys.readouterr().out
    assert "1240" in text and "601" in text and "2.06x" in text


def test_cli_validate_and_plan(tmp_path, capsys):
    rng = np.random.default_rng(2)
    groups = LogNormalLengths(4.0, 0.7, 0.5).sample(rng, 100, 4)
    dist = EmpiricalLengths(tuple(groups.reshape(-1).tolist()), tuple(tuple(g) for g in groups.tolist()))
    bench = synthetic_bench(TRUTH, dist, max_len=256, prompts_per_step=8, group_size=4, steps=40, seed=0)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    assert cli.main(["validate", str(path), "--json", "--steps", "40", "--strict"]) == 0
    assert _json_out(capsys)["passed"] is True
    assert cli.main(["validate", str(path), "--steps", "40"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert cli.main(["plan", "--lengths", str(path), "--max-len", "256", "--cost-curve", str(path),
                     "--prompts", "8", "--group", "4", "--steps", "30", "--json"]) == 0
    out = _json_out(capsys)
    assert out["recommendation"]["segments"] in (1, 2, 4, 8, 16)
    assert cli.main(["plan", "--lognormal", "4,0.7", "--max-len", "256", "--cost", "5,0.1,0",
                     "--regime", "static", "--steps", "20", "--segments", "1,4"]) == 0
    assert "recommendation: S=" in capsys.readouterr().out


def test_cli_errors_name_the_problem(tmp_path, capsys):
    assert cli.main(["validate", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"results": [], "cost_curve": []}))
    assert cli.main(["validate", str(bad)]) == 2
    assert "'config'" in capsys.readouterr().err
    assert cli.main(["plan", "--lognormal", "4", "--max-len", "64", "--cost", "1,0,0"]) == 2
    assert "--lognormal" in capsys.readouterr().err
    assert cli.main(["plan", "--lognormal", "4,1", "--max-len", "64"]) == 2
    assert "--cost" in capsys.readouterr().err


def test_decode_features_partial_compaction_hand_worked():
    from ulorl.sim.simulator import decode_features

    n, e = np.array([5, 3, 1, 1]), np.array([10, 10, 10, 10])
    # static: 4 rows x 5 iterations; contexts 10..14
    assert decode_features(n, e, "static") == (5, 20, 240.0)
    # ideal compaction: row i is in the batch for its n_i iterations
    assert decode_features(n, e, "compact") == (5, 10, 113.0)
    # compaction once >= 75 % of the rows are done: 4 rows for j=0..2, then 1 row for j=3,4
    assert decode_features(n, e, "compact", 0.75) == (5, 14, 159.0)
    # >= 50 %: 4 rows at j=0, 2 rows for j=1,2, 1 row for j=3,4
    assert decode_features(n, e, "compact", 0.5) == (5, 10, 113.0)


def test_engine_and_simulator_share_one_torch_free_plan_buckets():
    import subprocess
    import sys

    from ulorl.rollout import buckets
    from ulorl.rollout.engines import hf
    from ulorl.sim import simulator

    assert simulator.plan_buckets is buckets.plan_buckets is hf.plan_buckets
    assert buckets.plan_buckets([10] * 5 + [300] * 5, 32) == [(0, 5), (5, 10)]
    code = "import sys, ulorl.rollout.buckets, ulorl.sim.simulator; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_validate_fits_the_per_bucket_cost_of_a_bucketed_engine():
    rng = np.random.default_rng(7)
    groups = LogNormalLengths(4.0, 0.8, rho=0.5).sample(rng, 300, 8)
    dist = EmpiricalLengths(tuple(groups.reshape(-1).tolist()),
                            tuple(tuple(g) for g in np.minimum(groups, 256).tolist()))
    truth = CostModel(a=2.0, b=0.04, c=4e-4, p=0.2, bk=1.5)
    bench = synthetic_bench(truth, dist, max_len=256, prompts_per_step=16, group_size=8, prompt_len=18,
                            context="bucket", share_prompt_prefill=True, compact_min_frac=0.125,
                            prompt_lens=[9, 12, 18, 18, 25, 60], steps=80, seed=2)
    out = run_validate(bench, steps=80, seed=2, free=("scale", "bucket"))
    fit = out["s1_fit"]
    assert fit["free"] == ["scale", "bucket"]
    assert fit["prefill_ms_per_token"] == pytest.approx(0.2, rel=1e-9)
    assert fit["decode_scale"] == pytest.approx(1.0, rel=1e-6)
    assert fit["bucket_iter_ms"] == pytest.approx(1.5, rel=1e-6)
    assert out["passed"] and out["max_abs_rel_err"] < 1e-6
