"""``ulorl-bench rollout``: the measurement loop over the real SegmentScheduler, and the CLI's JSON.

The loop test uses the scripted engine of ``tests/fakes.py`` on purpose: its responses have a
long-tailed length mix we choose, and it reports static-regime counters (an iteration per token
of the longest row), so "decode iterations per finished sample drop with S" is a deterministic
expectation. The CLI test runs the real HF engine on a tiny randomly initialised model saved to
a temporary folder (tiny settings, a few seconds).
"""

from __future__ import annotations

import json

import pytest
import torch

from fakes import ScriptedEngine
from ulorl.bench.rollout import BenchConfig, add_ratios, format_report, run_settings
from ulorl.rollout.scheduler import PromptRequest

RESULT_KEYS = {"segments", "regime", "step_time_s", "finished_per_s", "tokens_per_s", "decode_utilization",
               "prefill_frac", "iters_per_finished", "ratio_vs_s1", "mean_rows", "mean_unfinished",
               "prefill_tokens_per_finished"}


def long_tail_length(prompt: tuple[int, ...], first_token: int) -> int:
    """1 prompt in 8 needs 60 tokens, the rest 4-11 (mean/max about 0.2 at max 64)."""
    return 60 if prompt[0] % 8 == 0 else 4 + (prompt[0] + first_token) % 8


def test_iters_per_finished_drop_with_segments_in_static_regime():
    prompts = [PromptRequest(prompt_ids=[i, 7, 9]) for i in range(64)]
    cfg = BenchConfig(prompts=4, group=4, max_len=64, segments=(1, 2, 4), regimes=("static",),
                      seconds=0.02, rounds=2, warmup=None)
    lines: list[str] = []
    results, lengths, groups, prefix = run_settings(
        cfg, lambda regime: ScriptedEngine(max_len=64, length_fn=long_tail_length), prompts,
        progress=lines.append)
    assert [r["segments"] for r in results] == [1, 2, 4]
    for r in results:
        assert RESULT_KEYS <= set(r)
        assert r["finished_per_s"] > 0 and r["steps"] >= 2
        assert 0 < r["decode_utilization"] <= 1
    ipf = [r["iters_per_finished"] for r in results]
    assert ipf[0] > ipf[1] > ipf[2]
    # static S=1: every step decodes until its longest row (60 when a long prompt is in the batch)
    assert results[0]["mean_unfinished"] == 0 and results[2]["mean_unfinished"] > 0
    assert results[0]["ratio_vs_s1"] == 1.0
    assert lengths and max(lengths) == 60 and all(len(g) == 4 for g in groups)
    # prefix records: one per released group, lengths in lexicographic order of the responses
    recs, pp = prefix["group_prefix"], prefix["prefix_prompts"]
    assert len(recs) == len(groups) and [sorted(r["lengths"]) for r in recs] == [sorted(g) for g in groups]
    assert all(len(r["lcp"]) == 3 and all(0 <= x <= min(u, v) for x, u, v in
                                          zip(r["lcp"], r["lengths"], r["lengths"][1:])) for r in recs)
    assert {tuple(p) for p in pp} <= {(i, 7, 9) for i in range(64)}
    assert [p[0] for p in pp] == sorted(p[0] for p in pp)        # numbered in the bench's prompt order
    assert any("warm-up" in m for m in lines) and any("round 2/2" in m for m in lines)


def test_add_ratios_per_regime():
    rows = [{"segments": 1, "regime": "static", "finished_per_s": 2.0},
            {"segments": 4, "regime": "static", "finished_per_s": 3.0},
            {"segments": 4, "regime": "compact", "finished_per_s": 3.0}]
    add_ratios(rows)
    assert [r["ratio_vs_s1"] for r in rows] == [1.0, 1.5, None]


def test_config_validation_names_the_flag():
    with pytest.raises(ValueError, match="divisible"):
        BenchConfig(max_len=100, segments=(1, 3)).validate()
    with pytest.raises(ValueError, match="--regimes"):
        BenchConfig(regimes=("dynamic",)).validate()


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from ulorl.models.tiny import build_tiny_model, TinySpec
    from ulorl.models.tokenizer import build_tokenizer

    d = tmp_path_factory.mktemp("tiny_policy")
    tok = build_tokenizer()
    spec = TinySpec(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                    intermediate_size=64, max_position_embeddings=256)
    model = build_tiny_model(tok, spec, seed=0)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_cli_json_is_one_object_with_the_schema(tiny_model_dir, capsys):
    from ulorl.cli.bench import main

    old = torch.get_num_threads()
    try:
        rc = main(["rollout", "--json", "--model", str(tiny_model_dir), "--prompts", "2", "--group", "2",
                   "--max-len", "16", "--segments", "1,2", "--seconds", "0.2", "--rounds", "1",
                   "--warmup", "1", "--threads", "1", "--cost-rows", "1,4", "--cost-contexts", "8,24"])
    finally:
        torch.set_num_threads(old)
    cap = capsys.readouterr()
    assert rc == 0
    out = json.loads(cap.out)                      # exactly one JSON object on stdout
    assert {"config", "results", "cost_curve", "prefill_ms_per_token", "lengths"} <= set(out)
    cfg = out["config"]
    assert cfg["max_len"] == 16 and cfg["segments"] == [1, 2] and cfg["regimes"] == ["static", "compact"]
    assert cfg["max_response_len"] == 16 and cfg["prompts_per_step"] == 2 and cfg["group_size"] == 2
    assert cfg["engine_backend"] == "fast" and cfg["training"] is False
    assert len(out["results"]) == 4
    for r in out["results"]:
        assert RESULT_KEYS <= set(r)
        assert r["finished_per_s"] > 0
    assert {r["ratio_vs_s1"] for r in out["results"] if r["segments"] == 1} == {1.0}
    assert [(p["rows"], p["context"]) for p in out["cost_curve"]] == [(1, 8), (4, 8), (1, 24), (4, 24)]
    assert all(p["ms_per_iter"] > 0 for p in out["cost_curve"])
    assert out["prefill_ms_per_token"] > 0
    assert out["lengths"] and all(1 <= x <= 16 for x in out["lengths"])
    assert cfg["share_min_tokens"] == 64 and cfg["max_batch_rows"] is None
    recs = out["group_prefix"]
    assert len(recs) == len(out["group_lengths"]) and recs
    for r, g in zip(recs, out["group_lengths"]):
        assert sorted(r["lengths"]) == sorted(g) and len(r["lcp"]) == len(g) - 1
        assert all(0 <= x <= min(a, b) for x, a, b in zip(r["lcp"], r["lengths"], r["lengths"][1:]))
        assert 0 <= r["prompt"] < len(out["prefix_prompts"])
    from ulorl.sim.simulator import parse_lengths
    assert parse_lengths(out, "bench").has_prefix_structure       # the simulator reads it back
    assert "warm-up" in cap.err and "cost curve" in cap.err   # progress on stderr
    text = format_report(out)
    assert "regime static:" in text and "decode forward cost" in text and "prefix records" in text


def test_cli_bad_flag_is_a_clear_error(capsys):
    from ulorl.cli.bench import main

    assert main(["rollout", "--segments", "1,x"]) == 2
    assert "--segments" in capsys.readouterr().err
    assert main(["rollout", "--max-len", "100", "--segments", "1,3"]) == 2
    assert "divisible" in capsys.readouterr().err
