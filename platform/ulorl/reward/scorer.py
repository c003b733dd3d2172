"""Time-bounded batch scoring: math-verify in worker processes that are killed when they hang.

``RewardScorer.score(items)`` never hangs its caller: each rule check that needs sympy runs in a
worker process (``forkserver`` context on Linux, else ``spawn`` -- never ``fork``, because the
caller has torch threads); an item that takes longer than ``timeout_s`` scores 0, is counted in
``stats["timeouts"]``, and its worker is killed and replaced. A worker that dies mid-item scores
that item 0 (``stats["crashes"]``). Works from the main thread, any other thread, a thread pool
and inside Ray tasks / actors.

Extraction (``extraction``, the config's ``reward.extraction``): ``boxed`` (training default) or
``boxed_or_final`` (``ulorl.reward.extract``). Items are ``(response, reference, truncated)`` or
``(response, reference, truncated, problem)``; the problem text (optional) lets the comparison
map option letters to option texts and tell an ordered answer from a set.

Fast path (no worker round trip): truncated responses, responses without an answer and pairs
that string code decides exactly (``ulorl.reward.compare.fast_verdict``: two plain integers after
normalisation, identical normalised answers, two option letters).

Optional generative judge, only where the rules abstain: when the rule check says 0 for an
extracted answer (not a proven integer / letter mismatch, a timeout or a crash) and one side is
prose or a number with units (``ulorl.reward.forms.beyond_rules``), ``judge.judge_many`` gets
``(pred, reference, problem)``; a YES turns the reward into 1 (``stats["judge_flips"]``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, Optional, Protocol, cast

from ulorl.reward.compare import fast_verdict
from ulorl.reward.extract import EXTRACTION_MODES, extract_answer
from ulorl.reward.forms import beyond_rules

if TYPE_CHECKING:
    from multiprocessing.context import ForkContext, ForkServerContext, SpawnContext

_PR_SET_PDEATHSIG = 1


class Judge(Protocol):
    """What the scorer needs from a generative verifier (``ulorl.reward.judge.GenerativeJudge``)."""

    def judge_many(self, pairs: Sequence[tuple[str, ...]]) -> list[bool]: ...


class ScorerError(RuntimeError):
    """The worker pool cannot be (re)started; the message says why."""


def _worker_main(conn: Connection, die_with_parent: bool) -> None:
    """Worker loop: receive ``(tag, pred, ref, problem)``, answer ``("ok", tag, bool)``; ``None`` = exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    if die_with_parent and sys.platform.startswith("linux"):
        # Forkserver child. The fork server exits when every holder of its "alive" pipe is gone;
        # we hold one end too (inherited), so drop it: then the server exits with the caller, and
        # PDEATHSIG kills us with it, even while sympy is stuck in C code.
        try:
            from multiprocessing import forkserver

            # a private CPython attribute, absent from typeshed's multiprocessing.forkserver stub
            fd = forkserver._forkserver._forkserver_alive_fd  # type: ignore[attr-defined]
            if fd is not None:
                os.close(fd)
                forkserver._forkserver._forkserver_alive_fd = None  # type: ignore[attr-defined]
        except (AttributeError, OSError):
            pass
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass
    from ulorl.reward.verify import verify_answer

    verify_answer("\\frac{1}{2}", "0.5")  # import sympy / math-verify and build parsers before the clock runs
    conn.send(("ready", None, None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        tag, pred, ref, problem = msg
        try:
            conn.send(("ok", tag, bool(verify_answer(pred, ref, problem))))
        except Exception as exc:  # noqa: BLE001 -- any failure of one item is that item's 0
            conn.send(("err", tag, f"{type(exc).__name__}: {exc}"[:300]))


@dataclass
class _Worker:
    proc: Any
    conn: Connection
    started_at: float
    state: str = "starting"  # starting | idle | busy
    task: Optional[int] = None
    deadline: float = 0.0


@dataclass
class _Stats:
    items: int = 0
    truncated: int = 0
    no_answer: int = 0
    fast_path: int = 0
    worker_calls: int = 0
    timeouts: int = 0
    crashes: int = 0
    errors: int = 0
    worker_starts: int = 0
    judge_calls: int = 0
    judge_flips: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int]:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"}
        d.update(self.extra)
        return d


def _default_start_method() -> str:
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


class RewardScorer:
    """Binary math rewards for batches, each rule check bounded by ``timeout_s`` seconds.

    >>> with RewardScorer(timeout_s=5, num_workers=1) as scorer:
    ...     scorer.score([("... \\\\boxed{27}", "27", False)])
    [1.0]

    Workers start lazily (a batch answered entirely by the fast path starts none). ``score`` and
    ``verify_many`` may be called from several threads; calls are serialised by a lock.
    """

    def __init__(
        self,
        timeout_s: float = 5.0,
        num_workers: int = 1,
        judge: Optional[Judge] = None,
        start_method: Optional[str] = None,
        startup_timeout_s: float = 120.0,
        max_start_failures: int = 3,
        extraction: str = "boxed",
    ) -> None:
        if extraction not in EXTRACTION_MODES:
            raise ValueError(f"extraction must be one of {EXTRACTION_MODES}, got {extraction!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.extraction = extraction
        self.timeout_s = float(timeout_s)
        self.num_workers = int(num_workers)
        self.judge = judge
        self.start_method = start_method or _default_start_method()
        if self.start_method == "fork":
            raise ValueError("start_method 'fork' is unsafe with torch threads; use forkserver or spawn")
        self.startup_timeout_s = float(startup_timeout_s)
        self.max_start_failures = int(max_start_failures)
        # typeshed types get_context(str) as BaseContext (no .Process); the object is a concrete context
        self._ctx = cast("SpawnContext | ForkServerContext | ForkContext", mp.get_context(self.start_method))
        if self.start_method == "forkserver":
            # Each fork then starts with math-verify already imported (set before the server starts;
            # ignored if another library started the global fork server first).
            self._ctx.set_forkserver_preload(["ulorl.reward.verify", "math_verify"])
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._stats = _Stats()
        self._closed = False

    @classmethod
    def from_config(cls, cfg: Any, judge: Optional[Judge] = None) -> RewardScorer:
        """Build from a ``ulorl.config.RewardConfig`` (``timeout_s``, ``num_workers``, ``extraction``)."""
        return cls(timeout_s=cfg.timeout_s, num_workers=cfg.num_workers, judge=judge,
                   extraction=getattr(cfg, "extraction", "boxed"))

    # ---- public API -------------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, int]:
        """Cumulative counters: items, truncated, no_answer, fast_path, worker_calls, timeouts,
        crashes, errors, worker_starts, judge_calls, judge_flips."""
        with self._lock:
            return self._stats.as_dict()

    def get_stats(self) -> dict[str, int]:
        """``stats`` as a method (callable on a Ray actor wrapping this class)."""
        return self.stats

    def worker_pids(self, state: Optional[str] = None) -> list[int]:
        """The process ids of the verifier workers alive now, or of those in ``state`` (``starting``,
        ``idle``, ``busy``): the processes to watch (or kill) beside the caller. Read without the lock, so
        that another thread can look while a batch runs: a snapshot that may be one step behind."""
        return [w.proc.pid for w in list(self._workers) if state is None or w.state == state]

    def score_samples(self, samples: list[Any], tokenizer: Any) -> list[float]:
        """Rewards for rollout ``Sample``s: response decoded from its token ids, scored against
        ``sample.answer`` with the problem text the sample carries (``sample.problem``); a truncated
        sample scores 0."""
        from ulorl.rollout.types import SampleStatus

        return self.score([(tokenizer.decode(s.response_ids, skip_special_tokens=True), s.answer,
                            s.status is SampleStatus.TRUNCATED, s.problem or None) for s in samples])

    def extract(self, text: str, problem: Optional[str] = None) -> Optional[str]:
        """The final answer of ``text`` under this scorer's extraction mode (None = no answer)."""
        return extract_answer(text, self.extraction, problem)

    def score(self, items: list[tuple[Any, ...]]) -> list[float]:
        """Rewards (1.0 / 0.0) for ``(response_text, reference, truncated[, problem])`` items, in order."""
        with self._lock:
            self._check_open()
            st = self._stats
            out = [0.0] * len(items)
            preds: list[Optional[str]] = [None] * len(items)
            slow: list[int] = []
            for i, item in enumerate(items):
                text, ref, truncated = item[0], item[1], item[2]
                st.items += 1
                if truncated:
                    st.truncated += 1
                    continue
                pred = extract_answer(text, self.extraction, _problem(item))
                if not pred:
                    st.no_answer += 1
                    continue
                quick = fast_verdict(pred, ref)
                if quick is not None:
                    st.fast_path += 1
                    out[i] = 1.0 if quick else 0.0
                    continue
                preds[i] = pred
                slow.append(i)
            verdicts = self._run([(preds[i], items[i][1], _problem(items[i])) for i in slow])  # type: ignore[misc]
            ask: list[int] = []
            for i, v in zip(slow, verdicts):
                if v:
                    out[i] = 1.0
                elif v is False and self.judge is not None and beyond_rules(preds[i] or "", items[i][1]):
                    ask.append(i)  # the rules said no where they cannot read: a judge may disagree
            if self.judge is not None and ask:
                st.judge_calls += len(ask)
                yes = self.judge.judge_many([(preds[i] or "", items[i][1], _problem(items[i]) or "") for i in ask])
                for i, y in zip(ask, yes):
                    if y:
                        out[i] = 1.0
                        st.judge_flips += 1
            return out

    def verify_many(self, pairs: list[tuple[Any, ...]]) -> list[Optional[bool]]:
        """Time-bounded ``verify_answer(pred, ref[, problem])`` for short answers (no extraction,
        no judge). None = timed out or crashed (counted)."""
        with self._lock:
            self._check_open()
            out: list[Optional[bool]] = [None] * len(pairs)
            slow: list[int] = []
            for i, pair in enumerate(pairs):
                quick = fast_verdict(pair[0], pair[1]) if pair[0].strip() and pair[1].strip() else False
                if quick is not None:
                    self._stats.fast_path += 1
                    out[i] = quick
                else:
                    slow.append(i)
            for i, v in zip(slow, self._run([(pairs[i][0], pairs[i][1], _problem(pairs[i], 2)) for i in slow])):
                out[i] = v
            return out

    def warmup(self) -> None:
        """Start the workers now and wait until they are ready (else they start on first use)."""
        with self._lock:
            self._check_open()
            self._run([("1", "1/1", None)] * self.num_workers)

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        with self._lock:
            self._closed = True
            for w in self._workers:
                self._stop(w, graceful=w.state == "idle")
            self._workers = []

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; daemonic workers also die at interpreter exit
        try:
            if not self._closed:
                self.close()
        except Exception:  # noqa: BLE001
            pass

    # ---- worker pool ------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ScorerError("RewardScorer is closed")

    def _start_worker(self) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=_worker_main, args=(child, self.start_method == "forkserver"), daemon=True,
            name="ulorl-reward-worker",
        )
        proc.start()
        child.close()
        self._stats.worker_starts += 1
        return _Worker(proc=proc, conn=parent, started_at=time.monotonic())

    @staticmethod
    def _stop(w: _Worker, graceful: bool = False) -> None:
        try:
            if graceful:
                w.conn.send(None)
                w.proc.join(timeout=1.0)
        except (OSError, ValueError, BrokenPipeError):
            pass
        if w.proc.is_alive():
            w.proc.kill()
            w.proc.join(timeout=5.0)
        try:
            w.conn.close()
        except OSError:
            pass

    def _run(self, pairs: list[tuple[str, str, Optional[str]]]) -> list[Optional[bool]]:
        """Verify ``pairs`` on the pool; None where an item timed out or its worker crashed."""
        out: list[Optional[bool]] = [None] * len(pairs)
        if not pairs:
            return out
        st = self._stats
        queue = deque(range(len(pairs)))
        remaining = len(pairs)
        start_failures = 0
        while len(self._workers) < min(self.num_workers, len(pairs)):
            self._workers.append(self._start_worker())

        def replace(w: _Worker) -> None:
            self._stop(w)
            self._workers[self._workers.index(w)] = self._start_worker()

        while remaining:
            now = time.monotonic()
            for w in self._workers:
                if w.state == "idle" and queue:
                    j = queue.popleft()
                    try:
                        w.conn.send((j, pairs[j][0], pairs[j][1], pairs[j][2]))
                    except (OSError, BrokenPipeError):
                        queue.appendleft(j)
                        replace(w)
                        continue
                    st.worker_calls += 1
                    w.state, w.task, w.deadline = "busy", j, now + self.timeout_s
            active = [w for w in self._workers if w.state in ("starting", "busy")]
            if not active:  # every worker idle but queue empty cannot happen while remaining > 0
                raise ScorerError("internal error: no active worker with items remaining")
            limits = [w.deadline if w.state == "busy" else w.started_at + self.startup_timeout_s for w in active]
            ready = set(wait([w.conn for w in active], timeout=max(0.0, min(limits) - time.monotonic())))
            for w in active:
                if w.conn in ready:
                    try:
                        kind, tag, value = w.conn.recv()
                    except (EOFError, OSError):
                        kind, tag, value = "dead", None, None
                    if kind == "ready":
                        w.state = "idle"
                        start_failures = 0
                    elif kind in ("ok", "err") and tag == w.task:
                        out[tag] = bool(value) if kind == "ok" else False
                        if kind == "err":
                            st.errors += 1
                        remaining -= 1
                        w.state, w.task = "idle", None
                    else:  # the worker died (EOF) or spoke out of turn
                        if w.state == "busy":
                            st.crashes += 1
                            remaining -= 1
                        else:
                            start_failures += 1
                        replace(w)
            now = time.monotonic()
            for w in list(self._workers):
                if w.state == "busy" and now >= w.deadline:
                    st.timeouts += 1
                    remaining -= 1
                    replace(w)
                elif w.state == "starting" and now >= w.started_at + self.startup_timeout_s:
                    start_failures += 1
                    replace(w)
            if start_failures >= self.max_start_failures:
                raise ScorerError(
                    f"reward workers failed to start {start_failures} times in a row "
                    f"(start method {self.start_method!r}, startup timeout {self.startup_timeout_s}s); "
                    "check that `python -c 'import math_verify'` works here, and that the calling "
                    "script guards its entry point with `if __name__ == \"__main__\":` (spawn / "
                    "forkserver workers re-import the main module)"
                )
        return out


def _problem(item: tuple[Any, ...], index: int = 3) -> Optional[str]:
    """The optional problem text of a scoring item (``None`` when absent)."""
    return item[index] if len(item) > index and item[index] else None


def score_batch(
    items: list[tuple[Any, ...]], timeout_s: float = 5.0, num_workers: int = 1, extraction: str = "boxed"
) -> tuple[list[float], dict[str, int]]:
    """One-shot ``RewardScorer`` (e.g. as a Ray task): ``(rewards, stats)``."""
    with RewardScorer(timeout_s=timeout_s, num_workers=num_workers, extraction=extraction) as scorer:
        return scorer.score(items), scorer.stats
