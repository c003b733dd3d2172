"""The problem text reaches the reward scorer everywhere a reward or a score is computed (issue 54):
training (``score_samples`` on rollout samples, both extraction modes), periodic and final
evaluation (``evaluate``), and the training run end to end.

A multiple-choice problem whose reference is an option's text and whose response boxes the letter
is right only when the problem (its option list) reaches the comparison; before this round the
training reward and ``evaluate`` scored it 0. The end-to-end run wraps ``RewardScorer.score`` in a
recorder (test-only) and asserts on the items every training step and every evaluation passed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ulorl.data.prompts import build_prompt
from ulorl.data.types import PromptItem
from ulorl.eval.runner import evaluate
from ulorl.models.tokenizer import build_tokenizer
from ulorl.reward.scorer import RewardScorer
from ulorl.rollout.scheduler import PromptRequest, SegmentScheduler
from ulorl.rollout.types import PROBLEM_META_KEY, GenerationResult, SamplingParams
from ulorl.train.prompts import encode_prompt

MC = PromptItem("mc0", "Which number is prime? (A) 21 (B) 23 (C) 25 (D) 27", "23")
RIGHT, WRONG = "The only prime is option B.\n\\boxed{B}", "Option C.\n\\boxed{C}"


class ScriptEngine:
    """Engine fake: every request gets the next scripted text (token ids + EOS)."""

    def __init__(self, tok, texts: list[str]) -> None:
        self.tok, self.texts, self.i = tok, texts, 0
        self.eos_token_id = tok.eos_token_id
        self.policy_version = 0
        self.max_model_len = None
        self.last_stats = None

    def generate(self, requests, sampling):
        out = []
        for r in requests:
            text = self.texts[self.i % len(self.texts)]
            self.i += 1
            ids = list(self.tok(text, add_special_tokens=False)["input_ids"]) + [self.eos_token_id]
            out.append(GenerationResult(r.request_id, ids, [-0.5] * len(ids), "eos"))
        return out


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_encoded_prompt_carries_the_problem(tok) -> None:
    req = encode_prompt(MC, tok)
    assert req.meta[PROBLEM_META_KEY] == MC.problem and req.meta["id"] == "mc0"


@pytest.mark.parametrize("extraction", ["boxed", "boxed_or_final"])
def test_training_reward_reads_the_problem(tok, extraction) -> None:
    """Rollout samples made by the scheduler from an encoded prompt carry the problem to the reward:
    the boxed letter B is the reference's option text 23."""
    sched = SegmentScheduler(ScriptEngine(tok, [RIGHT, WRONG]), segments=1, max_response_len=64, group_size=2,
                             prompts_per_step=1, sampling=SamplingParams(seed=0), seed=0)
    with RewardScorer(timeout_s=30, extraction=extraction) as scorer:
        res = sched.step([encode_prompt(MC, tok)], 0, score_fn=lambda done: scorer.score_samples(done, tok))
    samples = sorted((s for g in res.groups for s in g), key=lambda s: s.sample_id)
    assert [s.problem for s in samples] == [MC.problem, MC.problem]
    assert [s.reward for s in samples] == [1.0, 0.0]


def test_sample_without_a_problem_scores_as_before(tok) -> None:
    """A prompt that carries no problem (an old checkpoint's pending prompt) is scored without one."""
    sched = SegmentScheduler(ScriptEngine(tok, [RIGHT]), segments=1, max_response_len=64, group_size=1,
                             prompts_per_step=1, sampling=SamplingParams(seed=0), seed=0)
    req = PromptRequest(prompt_ids=encode_prompt(MC, tok).prompt_ids, answer="23", meta={"id": "mc0"})
    with RewardScorer(timeout_s=30) as scorer:
        res = sched.step([req], 0, score_fn=lambda done: scorer.score_samples(done, tok))
    (sample,) = [s for g in res.groups for s in g]
    assert sample.problem == "" and sample.reward == 0.0  # a letter against a number, no options to map


@pytest.mark.parametrize("extraction", ["boxed", "boxed_or_final"])
def test_evaluation_reads_the_problem(tok, extraction) -> None:
    engine = ScriptEngine(tok, [RIGHT, WRONG])
    with RewardScorer(timeout_s=30, extraction=extraction) as scorer:
        res = evaluate(engine, tok, [MC], k=2, max_new_tokens=64, scorer=scorer, bench_name="mc", progress=False)
    assert res.correct.tolist() == [[1, 0]]
    assert res.rows[0]["predictions"] == "B|C"


def test_evaluation_closing_sentence_needs_the_problem(tok) -> None:
    """``boxed_or_final`` reads a closing sentence only when it names the quantity the problem asks
    for: the problem has to reach the extraction too."""
    item = PromptItem("sq", "A square has perimeter 20. What is the area of the square?", "25")
    engine = ScriptEngine(tok, ["The side is 20 / 4 = 5.\n\nTherefore, the area of the square is 25."])
    with RewardScorer(timeout_s=30, extraction="boxed_or_final") as scorer:
        res = evaluate(engine, tok, [item], k=1, max_new_tokens=64, scorer=scorer, bench_name="sq", progress=False)
    assert res.correct.tolist() == [[1]] and res.rows[0]["predictions"] == "25"


def test_training_run_passes_the_problem_everywhere(tmp_path: Path, monkeypatch) -> None:
    """``ulorl-train`` on the embedded choice task (shrunk, its shipped warm-started model so that
    responses end): every item the scorer sees -- training rewards, the periodic eval and the final
    eval -- carries its problem text."""
    import sys

    from ulorl.cli.train import main as train_main

    seen: list[tuple[str, tuple]] = []
    original = RewardScorer.score

    def recording(self, items):
        caller = sys._getframe(1).f_code.co_name
        seen.extend((caller, tuple(item)) for item in items)
        return original(self, items)

    monkeypatch.setattr(RewardScorer, "score", recording)
    root = Path(__file__).resolve().parents[1]
    argv = [str(root / "experiments" / "quickstart_choice.yaml"),
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_response_len=96", "rollout.segments=1",
            "train.threads=1", "train.max_steps=1", "train.checkpoint_every=1", "eval.every=1", "eval.num_problems=2",
            "eval.k=1", "eval.final.k=1", "eval.final.num_problems=2", f"tracking.uri=sqlite:///{tmp_path}/m.db",
            "--run-dir", str(tmp_path / "run"), "--no-progress"]
    assert train_main(argv) == 0
    callers = [c for c, _ in seen]
    assert "score_samples" in callers  # the training reward
    assert callers.count("evaluate") == 4  # the periodic eval's 2 problems x k=1, the final eval's 2 x 1
    assert all(len(item) == 4 and str(item[3]).startswith("Compute ") for _, item in seen), seen[:3]


def test_prompt_template_is_unchanged(tok) -> None:
    """Carrying the problem changes no prompt the model sees."""
    assert encode_prompt(MC, tok).prompt_text == build_prompt(MC, tok)
