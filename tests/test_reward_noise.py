"""The verifier's errors as reward noise (``ulorl.reward.noise``) and ``ulorl-bench reward-noise``:
hand-derived rates, seeded draws, group signal counts; the bench's scorer wrapper against a scripted
scorer; a tiny real paired run (slow)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ulorl.bench.reward_noise import NoisyScorer, load_rates
from ulorl.bench.reward_noise import main as noise_main
from ulorl.reward.noise import ErrorRates, add_signal, answer_form, group_signal, inject, rates_from_rows
from ulorl.rollout.types import Sample, SampleStatus


@pytest.mark.parametrize("ref, form", [
    ("42", "integer"), ("-7", "integer"), ("1{,}000", "integer"), ("0.25", "decimal"), ("3/4", "fraction"),
    (r"\frac{3}{4}", "fraction"), ("B", "letter"), ("(C)", "letter"), ("1, 2, 3", "list"), ("(1, 2)", "expression"),
    (r"2\sqrt{3}", "expression"), (r"\text{Yes}", "text"), ("$5$", "integer"),
])
def test_answer_form(ref, form):
    assert answer_form(ref) == form


def test_rates_from_rows_by_hand():
    rows = ([{"answer": "5", "label": True, "score": 1.0}] * 3 + [{"answer": "5", "label": True, "score": 0.0}]
            + [{"answer": "x+1", "label": True, "score": 0.0}] * 2
            + [{"answer": "3", "label": False, "score": 1.0}] + [{"answer": "3", "label": False, "score": 0.0}] * 3)
    r = rates_from_rows(rows)
    assert r.fn == {"integer": 0.25, "expression": 1.0, "all": 0.5}  # 1/4, 2/2, 3/6
    assert r.fp == 0.25 and r.counts["fp"] == {"accepted": 1, "wrong": 4}
    assert r.fn_rate("integer") == 0.25 and r.fn_rate("letter") == 0.5  # an unseen form: the pooled rate
    assert rates_from_rows(rows, min_rows=3).fn == {"integer": 0.25, "all": 0.5}


def test_inject_is_seeded_and_flips_at_the_rates():
    rates = ErrorRates({"all": 0.1}, 0.05)
    clean = [1.0] * 20000 + [0.0] * 20000
    forms = ["integer"] * 40000
    a = inject(clean, forms, rates, random.Random(3))
    assert a == inject(clean, forms, rates, random.Random(3))
    fn = sum(1 for c, n in zip(clean, a) if c == 1.0 and n == 0.0) / 20000
    fp = sum(1 for c, n in zip(clean, a) if c == 0.0 and n == 1.0) / 20000
    assert abs(fn - 0.1) < 0.01 and abs(fp - 0.05) < 0.01  # binomial sd ~0.002


def test_inject_by_form_and_eligibility():
    rates = ErrorRates({"integer": 0.0, "expression": 1.0}, 1.0)
    out = inject([1.0, 1.0, 0.0, 0.0], ["integer", "expression", "integer", "integer"], rates, random.Random(0),
                 eligible=[True, True, True, False])
    assert out == [1.0, 0.0, 1.0, 0.0]  # FN 0 / 1 by form; FP 1 except on the ineligible (truncated) one
    with pytest.raises(ValueError):
        inject([1.0], ["integer", "integer"], rates, random.Random(0))


def test_group_signal_by_hand():
    # group 0: clean mixed (1, 0), noisy all 0 -> lost; group 1: clean all 0, noisy mixed -> spurious;
    # group 2: mixed both; group 3: all 1 both
    clean = [1, 0, 0, 0, 1, 0, 1, 1]
    noisy = [0, 0, 1, 0, 1, 0, 1, 1]
    gids = [0, 0, 1, 1, 2, 2, 3, 3]
    s = group_signal(clean, noisy, gids)
    assert s == {"groups": 4, "mixed_clean": 2, "mixed_noisy": 2, "lost": 1, "spurious": 1, "flipped_fn": 1,
                 "flipped_fp": 1}
    assert add_signal(s, s)["lost"] == 2 and add_signal({}, s) == s


def test_scaled_rates_cap_at_one():
    r = ErrorRates({"all": 0.3, "integer": 0.1}, 0.4).scaled(3.0)
    assert r.fn["all"] == pytest.approx(0.9) and r.fn["integer"] == pytest.approx(0.3) and r.fp == 1.0


class ScriptedScorer:
    """Fake scorer: every sample right; records calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.stats = {"items": 0}

    def score_samples(self, samples, tokenizer):
        self.calls += 1
        return [1.0] * len(samples)

    def score(self, items):
        return [1.0] * len(items)


def test_noisy_scorer_noises_training_only():
    inner = ScriptedScorer()
    noisy = NoisyScorer(inner, ErrorRates({"all": 1.0}, 0.0), seed=0)
    samples = [Sample(sample_id=i, group_id=0, prompt_ids=[1], answer="5", status=SampleStatus.FINISHED)
               for i in range(3)]
    samples[2].status = SampleStatus.TRUNCATED
    assert noisy.score_samples(samples, None) == [0.0, 0.0, 1.0]  # the truncated one is not the verifier's
    assert noisy.clean == {0: 1.0, 1: 1.0, 2: 1.0}
    assert noisy.score([("x", "5", False)]) == [1.0]  # evaluation: the real scorer, untouched
    assert noisy.stats == {"items": 0}


def test_load_rates_reads_verifier_rows(tmp_path: Path):
    rows = [{"extraction": "boxed", "answer": "5", "label": True, "score": 0.0, "has_box": False},
            {"extraction": "boxed", "answer": "5", "label": True, "score": 1.0, "has_box": True},
            {"extraction": "boxed_or_final", "answer": "5", "label": True, "score": 1.0, "has_box": False}]
    f = tmp_path / "rows.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert load_rates([str(f)], "boxed").fn["all"] == 0.5
    assert load_rates([str(f)], "boxed", with_box=True).fn["all"] == 0.0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"answer": "5"}\n')
    with pytest.raises(ValueError, match="needs answer, label and score"):
        load_rates([str(bad)], None)


def test_cli_refuses_without_rates(capsys):
    assert noise_main(["--seeds", "0"]) == 2
    assert "give --rates" in capsys.readouterr().err
    assert noise_main(["--fn", "1.5"]) == 2


@pytest.mark.slow
def test_tiny_paired_run(tmp_path: Path, capsys):
    """Two steps per arm on the embedded task: every released group is counted; with FN = 1 every
    right answer scores 0 in the noisy arm, so each group with a clean signal loses it."""
    code = noise_main(["--fn", "1.0", "--fp", "0.0", "--seeds", "0", "--workdir", str(tmp_path), "--json",
                       "experiments/quickstart.yaml", "train.max_steps=2", "eval.every=2", "eval.num_problems=4",
                       "eval.k=1", "rollout.prompts_per_step=2", "train.checkpoint_every=2", "train.threads=1"])
    assert code == 0
    res = json.loads(capsys.readouterr().out)
    (pair,) = res["pairs"]
    sig = pair["noisy"]["signal"]
    assert sig["groups"] >= 2 and sig["lost"] == sig["mixed_clean"] and sig["mixed_noisy"] == 0
    assert pair["clean"]["signal"].get("lost", 0) == 0
