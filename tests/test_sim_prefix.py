"""The simulator's prefix-forest prefill model (bench ``group_prefix`` -> ``EmpiricalLengths``)."""

from __future__ import annotations

import json
import random

import pytest

from ulorl.sim.simulator import CostModel, EmpiricalLengths, RolloutSetup, parse_lengths, simulate
from ulorl.sim.studies import run_validate, synthetic_bench
from ulorl.rollout.prefix import adjacent_lcps

# Two prompts sharing the template [1, 2]; group 0 (prompt A, 3 tokens): responses of 6 and 7
# tokens with a common prefix of 5; group 1 (prompt B, 4 tokens): 2 and 8 tokens sharing 1.
TWO = EmpiricalLengths(lengths=(6, 7, 2, 8), groups=((6, 7), (2, 8)), prompts=((1, 2, 3), (1, 2, 4, 5)),
                       group_prompt=(0, 1), group_lcps=((5,), (1,)))


def test_prefill_tokens_of_a_hand_worked_two_group_cycle():
    # max 8, S = 2 (segments of 4), 1 prompt x 2 per step; prompts alternate A, B, A, ...
    # A step: new A (2 identical contexts [1,2,3]) + B's 8-token member carried at d=4:
    #   distinct [1,2,3] and [1,2,4,5,r0..r3]; forest: [1,2] (2 users) + [3] + 6 -> 9 tokens,
    #   or 3 + 8 = 11 when the share must save >= 64 tokens.
    # B step: new B [1,2,4,5] + A's two members at d=4, identical (their LCP 5 >= 4) -> one
    #   context [1,2,3,a,b,c,d]; forest: [1,2] + [4,5] + 5 -> 9, or 4 + 7 = 11.
    kw = dict(max_len=8, segments=2, prompts_per_step=1, group_size=2, regime="static", context="row")
    tr0 = simulate(RolloutSetup(**kw, share_min_tokens=0), TWO, steps=4)
    assert tr0.features[:, 3].tolist() == [9, 9, 9, 9]
    assert tr0.completed.tolist() == [1, 3, 1, 3]             # A step ends B's long member; B step 3
    tr64 = simulate(RolloutSetup(**kw, share_min_tokens=64), TWO, steps=4)
    assert tr64.features[:, 3].tolist() == [11, 11, 11, 11]
    # without the forest: carried contexts in full + the new prompt G times (real prompt lengths)
    plain = simulate(RolloutSetup(**kw), TWO, steps=4)
    assert plain.features[:, 3].tolist() == [8 + 2 * 3, 2 * 7 + 2 * 4] * 2
    # decode contexts use each group's real prompt length: A step rows 3, 3 (new) and 4 + 4 (carried)
    assert tr0.features[0, 2] == plain.features[0, 2]


def _records(n_groups: int, G: int, n_prompts: int, seed: int = 0) -> EmpiricalLengths:
    """Group records of random responses with common openings, as the bench writes them."""
    rng = random.Random(seed)
    prompts = [[9, 8, 7] + [rng.randint(10, 60) for _ in range(rng.randint(6, 30))] for _ in range(n_prompts)]
    recs = []
    for k in range(n_groups):
        opening = [rng.randint(1, 5) for _ in range(rng.randint(0, 80))]
        resp = []
        for _ in range(G):
            n = max(1, int(rng.lognormvariate(3.5, 0.8)))
            r = (opening[: rng.randint(0, len(opening))] + [rng.randint(1, 5) for _ in range(n)])[:256]
            resp.append(r or [1])
        order, lcps = adjacent_lcps(resp)
        recs.append({"prompt": k % n_prompts, "lengths": [len(resp[i]) for i in order], "lcp": lcps})
    return parse_lengths({"prefix_prompts": prompts, "group_prefix": recs}, "records")


def test_parse_lengths_reads_group_prefix_and_names_bad_records():
    d = _records(40, 4, 20)
    assert d.has_prefix_structure and d.group_size == 4 and len(d.groups) == 40
    assert d.describe()["prefix_structure"]["prompts"] == 20
    with pytest.raises(ValueError, match=r"group_prefix\[0\] LCPs"):
        parse_lengths({"prefix_prompts": [[1]], "group_prefix": [{"prompt": 0, "lengths": [2, 3], "lcp": [3]}]})
    with pytest.raises(ValueError, match="names prompt 5"):
        parse_lengths({"prefix_prompts": [[1]], "group_prefix": [{"prompt": 5, "lengths": [2, 3], "lcp": [1]}]})
    with pytest.raises(ValueError, match="bad 'group_prefix' record"):
        parse_lengths({"prefix_prompts": [[1]], "group_prefix": [{"lengths": [2, 3]}]})


def test_validate_on_a_synthetic_bench_with_prefix_structure():
    dist = _records(160, 4, 80, seed=1)
    truth = CostModel(a=2.0, b=0.04, c=4e-4, p=0.2, o=30.0)
    bench = synthetic_bench(truth, dist, max_len=256, prompts_per_step=8, group_size=4, context="bucket",
                            compact_min_frac=0.125, share_min_tokens=64, steps=40, seed=2)
    assert "group_prefix" in bench and "prefix_prompts" in bench
    out = run_validate(json.loads(json.dumps(bench)), steps=40, seed=2)
    assert out["prefill_count"].startswith("prefix forest") and out["engine_traits"]["share_min_tokens"] == 64
    fit = out["s1_fit"]
    assert fit["free"] == ["scale", "overhead"] and fit["prefill_from"] == "prefill_curve"
    assert fit["prefill_ms_per_token"] == pytest.approx(0.2, rel=1e-9)
    assert fit["decode_scale"] == pytest.approx(1.0, rel=1e-6) and fit["overhead_ms"] == pytest.approx(30.0, rel=1e-6)
    assert out["passed"] and out["max_abs_rel_err"] < 1e-6
    for r in out["rows"]:
        assert r["prefill_tokens_per_finished"]["rel_err"] == pytest.approx(0.0, abs=1e-12)
    # the forest saves prefill at S = 8 against counting carried contexts in full
    no_forest = synthetic_bench(truth, dist, max_len=256, prompts_per_step=8, group_size=4, context="bucket",
                                compact_min_frac=0.125, share_prompt_prefill=True, steps=40, seed=2)
    pf = {(r["segments"], r["regime"]): r["prefill_tokens_per_finished"] for r in bench["results"]}
    pf0 = {(r["segments"], r["regime"]): r["prefill_tokens_per_finished"] for r in no_forest["results"]}
    assert pf[(8, "static")] < pf0[(8, "static")]


def test_validate_without_prefix_data_falls_back_and_options_work():
    bench = synthetic_bench(CostModel(a=2.0, b=0.04, c=4e-4, p=0.2, o=30.0), _records(160, 4, 80, seed=1),
                            max_len=256, prompts_per_step=8, group_size=4, prompt_len=20, context="bucket",
                            steps=30, seed=2)
    old = {k: v for k, v in bench.items() if k not in ("group_prefix", "prefix_prompts")}
    old["config"] = {k: v for k, v in old["config"].items() if k != "share_min_tokens"}
    out = run_validate(old, steps=30, seed=2)
    assert out["prefill_count"] == "contexts (no prefix data)" and out["lengths"].get("prefix_structure") is None
    out_s1 = run_validate(old, steps=30, seed=2, prefill_from="s1", free=("scale", "bucket"))
    assert out_s1["s1_fit"]["prefill_from"] == "s1_prefill_frac" and out_s1["s1_fit"]["free"] == ["scale", "bucket"]
    with pytest.raises(ValueError, match="prefill_from"):
        run_validate(old, steps=5, prefill_from="nope")  # type: ignore[arg-type]


def test_cli_validate_prefill_and_free_options(tmp_path, capsys):
    from ulorl.cli import sim as cli

    bench = synthetic_bench(CostModel(a=2.0, b=0.04, c=4e-4, p=0.2, o=30.0), _records(80, 4, 40, seed=4),
                            max_len=256, prompts_per_step=8, group_size=4, context="bucket",
                            share_min_tokens=64, steps=20, seed=0)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    assert cli.main(["validate", str(path), "--steps", "20", "--json", "--prefill-from", "s1",
                     "--free", "scale,bucket"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["s1_fit"]["prefill_from"] == "s1_prefill_frac" and out["s1_fit"]["free"] == ["scale", "bucket"]
    assert cli.main(["validate", str(path), "--steps", "20"]) == 0
    text = capsys.readouterr().out
    assert "scale+overhead" in text and "from the prefill curve" in text and "prefix forest" in text
