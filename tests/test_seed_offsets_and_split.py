"""Seed offsets in chunks (``seed_offsets`` / ``ulorl-sweep --seeds``) and the held-out split into
selection and confirmation problems (``eval.select_problems``): parsing, the trials a sweep expands
to, the checks that fail fast, and the split of one evaluation's results (hand-made matrices)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ulorl.config import ConfigError, load_experiment
from ulorl.data.types import PromptItem
from ulorl.eval.runner import split_result, summarize
from ulorl.sweep import plan
from ulorl.sweep.launch import SweepRunner, describe_trials
from ulorl.sweep.parent_run import parent_params
from ulorl.sweep.spec import (
    SweepError,
    check_resume_offsets,
    grid_trials,
    load_sweep,
    parse_seed_offsets,
    with_seed_offsets,
)

ROOT = Path(__file__).resolve().parents[1]
CHOICE = ROOT / "sweeps" / "choice"
BASE = (ROOT / "experiments" / "quickstart_choice.yaml").as_posix()


def _spec(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(f"name: t\nbase: {BASE}\n" + body)
    return p


@pytest.mark.parametrize("text, want", [("3-7", [3, 4, 5, 6, 7]), ("0,2", [0, 2]), ("1-2, 6", [1, 2, 6]),
                                        (4, [4]), ([5, 3, 3], [3, 5]), ("0", [0])])
def test_seed_offsets_parse(text: object, want: list[int]) -> None:
    assert parse_seed_offsets(text) == want


@pytest.mark.parametrize("bad", ["7-3", "-1", "a-b", "", [], [1.5], True])
def test_bad_seed_offsets_name_the_value(bad: object) -> None:
    with pytest.raises(ValueError, match="seed offsets"):
        parse_seed_offsets(bad)


def test_grid_runs_the_given_offsets_seed_major(tmp_path: Path) -> None:
    p = _spec(tmp_path, "search: {algorithm: grid}\nseed_offsets: '3-4'\nvariants:\n"
                        "  - {name: a, overrides: {algo.mpt.mode: 'off'}}\n"
                        "  - {name: b, overrides: {algo.mpt.mode: static}}\n")
    spec, base_path, base = load_sweep(p)
    assert [(t["repeat"], t["variant"]) for t in grid_trials(spec)] == [(3, "a"), (3, "b"), (4, "a"), (4, "b")]
    seeds = [t["seeds"] for t in describe_trials(spec, base, base_path)]
    assert seeds[0] == {"data.seed": 3, "rollout.seed": 3, "train.seed": 3}   # the choice base has seeds 0
    # the --seeds override replaces the spec's offsets (and the default 0..repeats-1)
    assert [t["repeat"] for t in grid_trials(with_seed_offsets(spec, "7"))] == [7, 7]
    with pytest.raises(SweepError, match="--seeds"):
        with_seed_offsets(spec, "x")


def test_repeats_and_offsets_that_disagree_fail(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match="repeats.*seed_offsets"):
        load_sweep(_spec(tmp_path, "search: {algorithm: grid}\nrepeats: 3\nseed_offsets: '3-7'\n"))
    spec, _, _ = load_sweep(_spec(tmp_path, "search: {algorithm: grid}\nrepeats: 5\nseed_offsets: '3-7'\n"))
    assert spec.offsets == [3, 4, 5, 6, 7]


def _fake_result(config: dict, objective: float, trial_id: str) -> SimpleNamespace:
    """What ``plan.best_searched`` reads of a Tune result: error, metrics, config."""
    return SimpleNamespace(error=None, metrics={"eval/heldout_select/avg_at_k": objective, "trial_id": trial_id},
                           config=config)


@pytest.mark.parametrize("seeds, baseline, reruns", [(None, [1, 2, 3, 0], [1, 2, 3]), ("4-5", [4, 5], [4, 5]),
                                                     ("0,6", [6, 0], [6])])
def test_baseline_and_best_reruns_follow_the_offsets(seeds: str | None, baseline: list[int],
                                                     reruns: list[int]) -> None:
    runner = SweepRunner(CHOICE / "mpt_threshold.yaml", seed_offsets=seeds)
    results = [_fake_result({"algo.mpt.tau": 0.9, "algo.mpt.sigma": 0.2}, 0.6, "a"),
               _fake_result({"algo.mpt.tau": 0.99, "algo.mpt.sigma": 0.17}, 0.7, "b")]
    entries = plan.extra_entries(runner.spec, plan.best_searched(runner.spec, results, set()))
    assert [e["repeat"] for e in entries if e["role"] == "baseline"] == baseline
    best = [e for e in entries if e["role"] == "rerun"]
    assert [e["repeat"] for e in best] == reruns
    assert all(e["trial_overrides"] == {"algo.mpt.tau": 0.99, "algo.mpt.sigma": 0.17} for e in best)
    # seed-major: each re-run right after the baseline of its seed, offset 0 (the selected one) last
    assert [(e["role"], e["repeat"]) for e in entries][:2] == [("baseline", baseline[0]), ("rerun", reruns[0])]


def test_the_parent_run_records_the_offsets_it_runs_and_the_server() -> None:
    runner = SweepRunner(CHOICE / "mpt_threshold.yaml", seed_offsets="4-5")
    params = parent_params(runner.spec)
    assert params["sweep.seed_offsets"] == "4,5" and "sweep.tracking_server" not in params
    assert set(params) >= {f"space.{k}" for k in runner.spec.space}
    server = SimpleNamespace(uri="http://127.0.0.1:5001", auth=False)
    assert {k: v for k, v in parent_params(runner.spec, server).items() if k.startswith("sweep.tracking")} == {
        "sweep.tracking_server": "http://127.0.0.1:5001", "sweep.tracking_auth": "none"}


def test_dry_run_with_seeds_prints_the_offsets(capsys: pytest.CaptureFixture[str]) -> None:
    from ulorl.cli.sweep import main

    assert main([str(CHOICE / "mpt_threshold.yaml"), "--dry-run", "--seeds", "4-5"]) == 0
    assert "on seed offset(s) 4,5 and the best trial re-run on 4,5" in capsys.readouterr().out
    assert main([str(CHOICE / "is_mode.yaml"), "--dry-run", "--seeds", "8-9"]) == 0
    out = capsys.readouterr().out
    assert "6 trial(s)" in out and '"seeds": {"data.seed": 9, "rollout.seed": 9, "train.seed": 9}' in out
    assert main([str(CHOICE / "is_mode.yaml"), "--dry-run", "--seeds", "9-8"]) == 2


def test_resume_needs_the_offsets_it_started_with() -> None:
    spec, _, _ = load_sweep(CHOICE / "is_mode.yaml")
    check_resume_offsets(None, spec)
    check_resume_offsets([3, 4], with_seed_offsets(spec, "3-4"))
    with pytest.raises(SweepError, match="--seeds 3,4"):
        check_resume_offsets([3, 4], spec)
    with pytest.raises(SweepError, match="without"):
        check_resume_offsets(None, with_seed_offsets(spec, "5"))


# ----------------------------------------------------------------------------- the held-out split


def test_headline_sweep_selects_and_confirms_on_separate_problems() -> None:
    spec, _, base = load_sweep(CHOICE / "mpt_threshold.yaml")
    assert spec.metrics == ["eval/heldout_select/avg_at_k"]
    assert spec.overrides["eval.num_problems"] == 256 and spec.overrides["eval.select_problems"] == 128
    assert len([o for o in spec.baseline_offsets if o != 0]) >= 3       # >= 3 re-run seeds for the verdict


def test_a_split_metric_needs_the_split(tmp_path: Path) -> None:
    body = "space:\n  algo.mpt.tau: {choice: [0.9]}\nmetric: eval/heldout_select/avg_at_k\n"
    with pytest.raises(SweepError, match="eval.select_problems"):
        load_sweep(_spec(tmp_path, body))
    load_sweep(_spec(tmp_path, body + "overrides: {eval.select_problems: 32}\n"))


def test_select_problems_must_leave_confirmation_problems() -> None:
    with pytest.raises(ConfigError, match="eval.select_problems"):
        load_experiment(BASE, ["eval.num_problems=64", "eval.select_problems=64"])
    assert load_experiment(BASE, ["eval.select_problems=32"]).eval.select_problems == 32


def test_split_result_parts_are_the_evaluations_own_rows() -> None:
    items = [PromptItem(id=f"p{i}", problem=f"q{i}", answer=str(i)) for i in range(5)]
    correct = np.array([[1, 1], [0, 1], [0, 0], [1, 0], [1, 1]])
    lens = np.array([[4, 6], [8, 8], [10, 2], [3, 3], [5, 5]])
    trunc = np.array([[0, 0], [0, 0], [1, 0], [0, 0], [0, 0]])
    whole = summarize("heldout", items, correct, lens, trunc)
    whole.wall_s = 10.0
    sel, conf = split_result(whole, 2)
    assert (sel.bench, conf.bench) == ("heldout_select", "heldout_confirm")
    assert sel.problem_ids == ["p0", "p1"] and conf.problem_ids == ["p2", "p3", "p4"]
    assert sel.avg_at_k == pytest.approx(3 / 4) and conf.avg_at_k == pytest.approx(3 / 6)
    assert whole.avg_at_k == pytest.approx((2 * sel.avg_at_k + 3 * conf.avg_at_k) / 5)
    assert conf.truncation_rate == pytest.approx(1 / 6) and sel.response_len_mean == pytest.approx(6.5)
    assert [r["num_correct"] for r in conf.rows] == [0, 1, 2] and conf.pass_at[2] == pytest.approx(2 / 3)
    assert (sel.wall_s, conf.wall_s) == (pytest.approx(4.0), pytest.approx(6.0))
    assert sel.metrics()["eval/heldout_select/avg_at_k"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="select_problems"):
        split_result(whole, 5)
