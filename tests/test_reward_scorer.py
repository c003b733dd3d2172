"""Time-bounded scorer: process pool, fast path, timeouts, crashes, threads (real math-verify)."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from ulorl.reward import RewardScorer, ScorerError

# An exponent tower: math-verify parses it, then sympy runs for ever comparing it with 5.
TOWER = (r"\boxed{10^{10^{10}}}", "5", False)
TIMEOUT_S = 2.0
# Generous bound on one batch with one timeout: the timeout itself plus worker start-up on a
# loaded 2-core machine. The point is that it returns at all.
BOUND_S = TIMEOUT_S + 30.0

CASES = [
    ((r"so \boxed{27}", "27", False), 1.0),
    ((r"\boxed{\frac{1}{2}}", "1/2", False), 1.0),
    ((r"\boxed{33124147}", "33124147", False), 1.0),
    ((r"\boxed{\frac{a}{b}}", r"\frac{a}{b}", False), 1.0),
    (("no box, 27", "27", False), 0.0),
    ((r"\boxed{27}", "27", True), 0.0),
    ((r"\boxed{28}", "27", False), 0.0),
    ((r"\boxed{0.75}", r"\frac{3}{4}", False), 1.0),
]


@pytest.fixture(scope="module")
def scorer():
    with RewardScorer(timeout_s=TIMEOUT_S, num_workers=1) as s:
        yield s


def test_cases_and_counters():
    with RewardScorer(timeout_s=10.0, num_workers=2) as s:
        assert s.score([c for c, _ in CASES]) == [r for _, r in CASES]
        st = s.stats
    assert st["items"] == 8 and st["truncated"] == 1 and st["no_answer"] == 1
    assert st["fast_path"] == 4  # 27/27, 33124147, 28 vs 27, identical \\frac{a}{b}
    assert st["worker_calls"] == 2 and st["timeouts"] == 0 and st["crashes"] == 0


def test_integer_batch_needs_no_worker():
    with RewardScorer(timeout_s=1.0) as s:
        assert s.score([(r"\boxed{070}", "70", False), (r"\boxed{-3}", "3", False)]) == [1.0, 0.0]
        assert s.stats["worker_starts"] == 0


def test_pathological_item_times_out_and_pool_recovers(scorer):
    before = scorer.stats
    t0 = time.monotonic()
    out = scorer.score([CASES[1][0], TOWER, CASES[3][0]])
    elapsed = time.monotonic() - t0
    assert out == [1.0, 0.0, 1.0]
    assert elapsed < BOUND_S
    after = scorer.stats
    assert after["timeouts"] - before["timeouts"] == 1
    assert after["worker_starts"] > before["worker_starts"]  # the hung worker was replaced
    assert scorer.score([CASES[1][0]]) == [1.0]


def test_from_thread_and_thread_pool(scorer):
    out: list[float] = []
    t = threading.Thread(target=lambda: out.extend(scorer.score([TOWER, CASES[7][0]])))
    t.start()
    t.join(timeout=BOUND_S)
    assert not t.is_alive() and out == [0.0, 1.0]
    batches = [[CASES[1][0], CASES[6][0]], [TOWER], [CASES[3][0]]]
    with ThreadPoolExecutor(max_workers=3) as ex:
        assert list(ex.map(scorer.score, batches)) == [[1.0, 0.0], [0.0], [1.0]]


def test_killed_worker_counts_as_crash():
    """A worker that dies mid-item (OOM killer, segfault) scores that item 0, counted."""
    with RewardScorer(timeout_s=60.0) as slow:  # long bound: the kill, not the timeout, ends it
        slow.warmup()

        def kill_busy_worker() -> None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                busy = slow.worker_pids("busy")
                if busy:
                    os.kill(busy[0], signal.SIGKILL)
                    return
                time.sleep(0.01)

        killer = threading.Thread(target=kill_busy_worker)
        killer.start()
        assert slow.score([TOWER]) == [0.0]
        killer.join()
        assert slow.stats["crashes"] == 1 and slow.stats["timeouts"] == 0
        assert slow.score([CASES[1][0]]) == [1.0]


def test_verify_many_and_closed_scorer():
    s = RewardScorer(timeout_s=TIMEOUT_S)
    assert s.verify_many([("1/2", "0.5"), ("7", "8"), (TOWER[0], "5")]) == [True, False, None]
    assert s.stats["timeouts"] == 1
    s.close()
    with pytest.raises(ScorerError):
        s.score([CASES[0][0]])


def test_spawn_start_method_and_bad_arguments():
    with RewardScorer(timeout_s=TIMEOUT_S, start_method="spawn") as s:
        assert s.score([CASES[1][0], TOWER]) == [1.0, 0.0]
        assert s.stats["timeouts"] == 1
    with pytest.raises(ValueError, match="fork"):
        RewardScorer(start_method="fork")
    with pytest.raises(ValueError, match="timeout_s"):
        RewardScorer(timeout_s=0)


def _running(pid: int) -> bool:
    """Alive and not a zombie (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


CALLER = """
import sys
from ulorl.reward import RewardScorer
if __name__ == "__main__":
    s = RewardScorer(timeout_s=600)
    s.warmup()
    print(" ".join(str(pid) for pid in s.worker_pids()), flush=True)
    s.score([(r"\\boxed{10^{10^{10}}}", "5", False)])
"""


def test_hung_worker_dies_with_a_killed_caller(tmp_path):
    """kill -9 of the caller must not leave a worker spinning in sympy (forkserver + PDEATHSIG)."""
    import subprocess
    import sys

    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids
        time.sleep(0.5)  # the worker is now busy on the tower
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [p for p in pids if _running(p)]
            time.sleep(0.2)
        assert not alive, f"worker(s) {alive} outlived their caller"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_bench_smoke():
    from ulorl.bench.reward_cost import run

    res = run(n_int=6, n_sym=3, workers=[1], timeout_s=TIMEOUT_S)
    assert res["w1_stats"]["timeouts"] == 1 and res["w1_stats"]["fast_path"] == 18
    assert res["main_int_us"] > 0 and res["w1_scorer_sym_us"] > 0
