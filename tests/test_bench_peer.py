"""``ulorl-bench peer``: the equalised settings, the summary arithmetic, the report, and one tiny real run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ulorl.bench.peer import add_ratios, build_parser, config_from_args, format_report, main, summarize
from ulorl.bench.peer_settings import PeerConfig, System, settings_rows, systems_of, ulorl_experiment
from ulorl.config import config_from_dict


def test_ulorl_side_runs_the_equalised_algorithm(tmp_path):
    cfg = PeerConfig(prompts=4, group=4, max_len=64, eps_high=0.3)
    exp = config_from_dict(ulorl_experiment(cfg, System("ulorl", 4, "static"), seed=3, workdir=tmp_path))
    a, r, t = exp.algo, exp.rollout, exp.train
    assert (a.adv_std, a.adv_eps, a.dynamic_sampling, a.loss_agg, a.mpt.mode) == ("unbiased", 1e-4, False,
                                                                                  "token_mean", "off")
    assert (a.eps_low, a.eps_high, a.is_mode, a.entropy_control.mode) == (0.2, 0.3, "pois", "off")
    assert (r.segments, r.batching, r.prompts_per_step, r.group_size, r.max_response_len) == (4, "static", 4, 4, 64)
    assert (r.top_p, r.top_k, r.seed, exp.data.seed) == (1.0, -1, 3, 3)
    assert (t.updates_per_step, t.lr, t.weight_decay, t.bf16, t.threads, t.max_steps) == (1, 1e-4, 0.0, False, 1, 12)
    assert exp.eval.every == 0 and str(tmp_path) in exp.tracking.uri


def test_settings_table_says_what_is_equal_and_what_is_not():
    rows = settings_rows(PeerConfig())
    equal = {r["setting"] for r in rows if r["equal"] == "yes"}
    assert {"prompts per step, G", "max response length", "sampling", "optimizer", "clip bounds", "loss aggregation",
            "KL", "updates per rollout", "advantages", "dynamic sampling", "steps, threads"} <= equal
    differ = {r["setting"]: r["equal"] for r in rows if r["equal"] != "yes"}
    assert {"sampling draws", "rollout", "pre-update pass", "training batches", "samples per step"} == set(differ)
    assert all(text.startswith("no: ") for text in differ.values())


def test_systems_and_cli_validation():
    assert [s.name for s in systems_of(PeerConfig(segments=(1, 4), regimes=("compact",)))] == [
        "TRL GRPOTrainer", "ulorl S=1 compact", "ulorl S=4 compact"]
    assert [s.slug for s in systems_of(PeerConfig(trl=False, segments=(2,)))] == ["ulorl-s2-static",
                                                                                   "ulorl-s2-compact"]
    cfg = config_from_args(build_parser().parse_args(["--no-trl", "--segments", "1,2", "--max-len", "64"]))
    assert cfg.segments == (1, 2) and not cfg.trl and cfg.max_len == 64
    for bad in (["--segments", "3"], ["--warmup", "12"], ["--group", "1"], ["--model", "/some/path"],
                ["--regimes", "paged"]):
        with pytest.raises(ValueError):
            config_from_args(build_parser().parse_args(bad))
    assert main(["--segments", "3", "--no-trl"]) == 2


def _rec(system, step, wall, cpu, samples, tokens, rollout=1.0, rep=0):
    return {"system": system, "repeat": rep, "step": step, "wall_s": wall, "cpu_s": cpu, "rollout_s": rollout,
            "rollout_cpu_s": rollout / 2, "update_s": wall - rollout, "update_cpu_s": cpu - rollout / 2,
            "samples": samples, "tokens": tokens}


def test_summary_counts_only_the_measured_steps_and_ratios_are_per_trained_sample():
    cfg = PeerConfig(steps=3, warmup=1, segments=(1, 4), regimes=("static",))
    systems = systems_of(cfg)
    out = {"steps": [
        _rec("TRL GRPOTrainer", 1, 99.0, 99.0, 64, 999),          # warm-up: left out
        _rec("TRL GRPOTrainer", 2, 4.0, 2.0, 64, 1000),
        _rec("TRL GRPOTrainer", 3, 4.0, 2.0, 64, 1000),
        _rec("ulorl S=1 static", 2, 2.0, 1.0, 64, 900),
        _rec("ulorl S=1 static", 3, 2.0, 1.0, 64, 900),
        _rec("ulorl S=4 static", 2, 1.0, 1.0, 32, 400),
        _rec("ulorl S=4 static", 3, 3.0, 1.0, 96, 1400)],
        "evals": [{"system": "ulorl S=4 static", "repeat": 0, "avg_at_k": 0.5}],
        "memory": [{"system": "TRL GRPOTrainer", "repeat": 0, "peak_rss_mb": 900.0, "setup_rss_mb": 500.0}]}
    rows = {r["system"]: r for r in summarize(out, cfg, systems)}
    trl, s1, s4 = rows["TRL GRPOTrainer"], rows["ulorl S=1 static"], rows["ulorl S=4 static"]
    assert trl["measured_steps"] == 2 and trl["step_s_median"] == 4.0 and trl["samples_per_s"] == 16.0
    assert trl["tokens_per_s"] == 250.0 and trl["cpu_s_per_step"] == 2.0 and trl["rollout_cpu_s_per_step"] == 0.5
    assert trl["peak_rss_mb"] == 900.0 and trl["heldout"] == []
    # per trained sample: TRL 8 s / 128, S=1 4 s / 128 (2x), S=4 4 s / 128 (2x TRL, 1x S=1)
    assert s1["vs_trl"] == pytest.approx(2.0) and s1["vs_trl_cpu"] == pytest.approx(2.0) and s1["vs_s1"] == 1.0
    assert s4["vs_trl"] == pytest.approx(2.0) and s4["vs_s1"] == pytest.approx(1.0)
    assert s4["vs_trl_cpu"] == pytest.approx(2.0) and s4["samples_per_step"] == 64.0
    assert s4["heldout_mean"] == 0.5
    text = format_report({"config": vars(cfg) | {"segments": [1, 4], "regimes": ["static"]},
                          "settings": settings_rows(cfg), "summary": list(rows.values()), "errors": [],
                          "environment": {"trl": "1.16.0"}, "wall_s": 60.0})
    assert "settings made equal:" in text and "ulorl S=4 static" in text and "2.00" in text


def test_ratios_are_absent_without_their_reference():
    rows = [{"kind": "ulorl", "batching": "compact", "segments": 4, "s_per_sample": 0.1, "cpu_s_per_sample": 0.1,
             "vs_trl": None, "vs_trl_cpu": None, "vs_s1": None}]
    add_ratios(rows)
    assert rows[0]["vs_trl"] is None and rows[0]["vs_s1"] is None


@pytest.mark.slow
def test_a_tiny_side_by_side_run_steps_both_trainers_and_reports_them(tmp_path):
    """``ulorl-bench peer`` as a command (its own process: pytest's sys.path holds tests/vllm, which
    TRL's import would take for vLLM): two steps of TRL and ulorl S = 1 on 2 prompts x 2, each in a
    worker process, interleaved; both train their 4 samples every step and are scored once."""
    out_file = tmp_path / "peer.json"
    cmd = [sys.executable, "-m", "ulorl.cli.bench", "peer", "--steps", "2", "--warmup", "1", "--repeats", "1",
           "--prompts", "2", "--group", "2", "--max-len", "32", "--segments", "1", "--regimes", "compact",
           "--eval-problems", "2", "--eval-k", "1", "--workdir", str(tmp_path / "work"), "--out", str(out_file)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(out_file.read_text())
    assert out["errors"] == []
    rows = {r["system"]: r for r in out["summary"]}
    assert set(rows) == {"TRL GRPOTrainer", "ulorl S=1 compact"}
    for r in rows.values():
        assert r["measured_steps"] == 1 and r["samples_per_step"] == 4 and len(r["heldout"]) == 1
        assert r["peak_rss_mb"] >= r["setup_rss_mb"] > 0
        assert r["update_cpu_s_per_step"] > 0 and r["rollout_cpu_s_per_step"] > 0
    assert sorted((r["system"], r["step"]) for r in out["steps"]) == [
        ("TRL GRPOTrainer", 1), ("TRL GRPOTrainer", 2), ("ulorl S=1 compact", 1), ("ulorl S=1 compact", 2)]
    assert "TRL GRPOTrainer" in proc.stdout and (tmp_path / "work" / "logs" / "rep0-trl.log").is_file()
