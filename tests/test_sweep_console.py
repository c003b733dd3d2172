"""ulorl-sweep's console (ulorl.sweep.console) on a scripted sweep with a fake clock: a plain line per
trial state change off a terminal, a live table on one; and the capture of fds 1 / 2 into the log."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from ulorl.sweep.capture import OutputCapture
from ulorl.sweep.console import SweepView, fmt_duration


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _headline_script(view: SweepView, clock: Clock) -> None:
    """8 trials of 20 steps, 2 at a time, like the headline sweep; one trial fails once and retries."""
    pairs = [[("a", "search", "tau=0.9 sigma=0.0931"), ("b", "search", "tau=0.99 sigma=0.12")],
             [("c", "search", "tau=0.95 sigma=0.05"), ("d", "search", "tau=0.9 sigma=0.14")],
             [("e", "baseline", "masking_off"), ("f", "baseline", "masking_off seed+1")],
             [("g", "rerun", "tau=0.9 sigma=0.0931 seed+1"), ("h", "reference", "non_segmented")]]
    for pair in pairs:
        for key, role, values in pair:
            view.started(key, role, values)
        for step in range(1, 21):
            clock.t += 5.0
            for key, _, _ in pair:
                view.result(key, step, 0.5 + 0.001 * step if step % 10 == 0 else None)
            if pair[0][0] == "c" and step == 7:
                view.retrying("c", "RuntimeError: injected")
                view.started("c", "search", "tau=0.95 sigma=0.05")
        for key, _, _ in pair:
            view.finished(key)


def test_plain_view_prints_a_line_per_state_change_only():
    out, clock = io.StringIO(), Clock()
    view = SweepView("mpt_threshold", planned=8, steps_per_trial=20, metric="eval/heldout/avg_at_k", out=out,
                     live=False, clock=clock)
    view.start()
    _headline_script(view, clock)
    view.close()
    lines = out.getvalue().splitlines()
    # header + 8 starts + 8 finishes + 1 failure + 1 resume + the closing progress line; no line per result
    assert len(lines) == 1 + 8 + 8 + 2 + 1, lines
    assert lines[0] == "sweep mpt_threshold: 8 trials of 20 steps"
    assert lines[1] == "[    0s] search tau=0.9 sigma=0.0931: started (0/8 done)"
    assert any("search tau=0.95 sigma=0.05: failed at step 7, retry 1 from its checkpoint (RuntimeError: injected)"
               in x for x in lines)
    assert any("search tau=0.95 sigma=0.05: resumed from its checkpoint" in x for x in lines)
    assert any(x.endswith("reference non_segmented: finished, held-out 0.520 (8/8 done)") for x in lines)
    assert lines[-1] == "sweep mpt_threshold: 8/8 trials done, 160/160 steps, 6m40s elapsed, done"
    assert view.unfinished() == [] and view.not_created() == 0


def test_progress_estimates_time_left_from_steps_done():
    clock = Clock()
    view = SweepView("s", planned=4, steps_per_trial=10, metric="eval/heldout/avg_at_k", out=io.StringIO(),
                     live=False, clock=clock)
    assert view.progress_text().endswith("time left: after the first steps")
    clock.t += 30.0                      # set-up (Ray, the tracking server) before the first trial starts
    view.started("a", "search", "x=1")
    view.started("b", "search", "x=2")
    clock.t += 60.0
    view.result("a", 5, None)
    view.result("b", 5, None)
    # 10 of 40 steps in the 60 s since the first start -> 30 steps left at 6 s each = 3 min
    assert view.progress_text() == "sweep s: 0/4 trials done, 10/40 steps, 1m30s elapsed, about 3m00s left"
    assert [t.key for t in view.unfinished()] == ["a", "b"] and view.not_created() == 2


def test_live_view_draws_one_table_with_a_line_per_trial():
    out, clock = io.StringIO(), Clock()
    view = SweepView("mpt_threshold", planned=3, steps_per_trial=20, metric="eval/heldout/avg_at_k", out=out,
                     live=True, clock=clock)
    view.start()
    view.started("a", "search", "tau=0.9 sigma=0.0931")
    view.result("a", 10, 0.547)
    view.started("h", "reference", "non_segmented")
    view.close()
    text = out.getvalue()
    last = text[text.rfind("sweep mpt_threshold:"):]
    assert "search tau=0.9 sigma=0.0931" in last and "10/20" in last and "0.547" in last and "running" in last
    assert "reference non_segmented" in last and "(1 more not started)" in last


def test_durations():
    assert [fmt_duration(x) for x in (9, 75, 3700)] == ["9s", "1m15s", "1h01m"]


CHILD = r"""
import os, sys, subprocess
from pathlib import Path
from ulorl.sweep.capture import OutputCapture
log = Path(sys.argv[1])
with OutputCapture(log, echo=sys.argv[2] == "echo", console_fd=2 if sys.argv[2] == "stderr" else 1) as cap:
    print("python stdout")
    print("python stderr", file=sys.stderr)
    os.write(2, b"fd 2 write\n")
    subprocess.run([sys.executable, "-c", "print('child process')"], check=True)
    cap.console.write("view line\n")
print("after")
"""


def _run_child(tmp_path: Path, mode: str) -> tuple[str, str, str]:
    log = tmp_path / f"{mode}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run([sys.executable, "-c", CHILD, str(log), mode], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout, p.stderr, log.read_text()


def test_capture_sends_everything_to_the_log_and_keeps_the_console(tmp_path):
    out, err, log = _run_child(tmp_path, "quiet")
    assert out == "view line\nafter\n" and err == ""
    for line in ("python stdout", "python stderr", "fd 2 write", "child process"):
        assert line in log
    assert "view line" not in log and "after" not in log


def test_capture_with_echo_also_copies_to_the_terminal(tmp_path):
    out, err, log = _run_child(tmp_path, "echo")
    assert "python stdout" in out and "child process" in out and "view line" in out
    assert "python stderr" in err and "fd 2 write" in err
    for line in ("python stdout", "python stderr", "fd 2 write", "child process"):
        assert line in log


def test_capture_can_keep_the_view_on_stderr_for_json_on_stdout(tmp_path):
    out, err, log = _run_child(tmp_path, "stderr")
    assert out == "after\n" and err == "view line\n"
    assert "python stdout" in log and "view line" not in log


def test_capture_restores_the_file_descriptors(tmp_path, capfd):
    with OutputCapture(tmp_path / "x.log"):
        os.write(1, b"hidden\n")
    os.write(1, b"shown\n")
    assert capfd.readouterr().out == "shown\n"
    assert (tmp_path / "x.log").read_text() == "hidden\n"
