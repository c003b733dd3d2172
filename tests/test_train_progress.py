"""ulorl-train's progress: one unwrapped plain line per step off a terminal, '-' for what a step did not log."""

from __future__ import annotations

import io

from ulorl.train.progress import TrainProgress, step_text


def test_step_text_shows_reward_entropy_and_time_per_step():
    m = {"rollout/reward_mean": 0.4125, "train/entropy": 0.0812, "train/masked_frac": 0.12,
         "pool/unfinished": 12.0, "pool/experience": 3.0, "time/step_s": 0.84, "eval/heldout/avg_at_k": 0.53}
    assert step_text(m) == "reward 0.412  H 0.081  masked 0.120  pool 12/3  0.8s/step  heldout 0.530"


def test_a_step_without_update_shows_dashes_not_nan():
    text = step_text({"rollout/reward_mean": 0.0, "time/step_s": 23.7, "train/skipped": 1.0})
    assert "H -" in text and "masked -" in text and "nan" not in text and text.endswith("no update")


def test_off_a_terminal_one_line_per_step_and_nothing_else():
    out = io.StringIO()
    bar = TrainProgress(total=30, start=0, enabled=True, file=out)
    long_metrics = {"rollout/reward_mean": 0.5, "train/entropy": 0.1, "time/step_s": 1.0,
                    "eval/heldout/avg_at_k": 0.375, "pool/unfinished": 123456789.0}
    for step in (1, 2, 3):
        bar.update(step, long_metrics)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3                                     # no wrapped tails, no final bar render
    assert lines[0].startswith("step 1/30  reward 0.500  H 0.100") and lines[2].endswith("heldout 0.375")


def test_disabled_prints_nothing():
    out = io.StringIO()
    bar = TrainProgress(total=3, start=0, enabled=False, file=out)
    bar.update(1, {"time/step_s": 1.0})
    bar.close()
    assert out.getvalue() == ""
