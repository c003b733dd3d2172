"""Per-item reward cost: main-thread ``compute_reward`` vs ``RewardScorer`` (fast path / workers).

    ulorl-bench verifier --synthetic             # one JSON object on stdout, progress on stderr
    python -m ulorl.bench.reward_cost --n-int 500 --n-sym 300 --workers 1,2   # the same, with its own flags

(``ulorl-bench verifier LABELLED.jsonl`` measures agreement with labels: ``ulorl.bench.verifier``.)

Integer items (the embedded task, AIME, BeyondAIME) take the scorer's fast path; symbolic items
(fractions, radicals, decimals vs fractions) need sympy in a worker. Also measured: worker start-up
and the restart after a timed-out item (an exponent tower).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable

from ulorl.reward.compare import parse_answer
from ulorl.reward.scorer import RewardScorer
from ulorl.reward.verify import compute_reward

Item = tuple[str, str, bool]
TOWER: Item = (r"\boxed{10^{10^{10}}}", "5", False)


def integer_items(n: int, rng: random.Random) -> list[Item]:
    """Half right, half wrong, answers up to 1e8, inside some reasoning text."""
    out = []
    for _ in range(n):
        ref = rng.randint(0, 10**8)
        pred = ref if rng.random() < 0.5 else ref + rng.randint(1, 99)
        out.append((f"... reasoning ... so the answer is \\boxed{{{pred}}}.", str(ref), False))
    return out


def symbolic_items(n: int, rng: random.Random) -> list[Item]:
    """Fractions, radicals and decimal-vs-fraction pairs, half right."""
    out = []
    for i in range(n):
        a, b = rng.randint(1, 50), rng.randint(2, 50)
        ok = i % 2 == 1
        kind = i % 3
        if kind == 0:
            out.append((rf"\boxed{{\frac{{{a}}}{{{b}}}}}", f"{a if ok else a + 1}/{b}", False))
        elif kind == 1:
            out.append((rf"\boxed{{\sqrt{{{a}}}+{b}}}", rf"{b if ok else b + 1}+\sqrt{{{a}}}", False))
        else:
            out.append((rf"\boxed{{{a}.5}}", rf"\frac{{{2 * a + (1 if ok else 3)}}}{{2}}", False))
    return out


def _us_per_item(fn: Callable[[list[Item]], object], items: list[Item], reps: int = 1) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn(items)
    return (time.perf_counter() - t0) / (reps * len(items)) * 1e6


def run(n_int: int, n_sym: int, workers: list[int], seed: int = 0, timeout_s: float = 5.0) -> dict[str, object]:
    from math_verify import verify

    rng = random.Random(seed)
    ints, syms = integer_items(n_int, rng), symbolic_items(n_sym, rng)
    res: dict[str, object] = {"n_int": n_int, "n_sym": n_sym, "timeout_s": timeout_s}
    compute_reward(*syms[0])  # import sympy / math-verify once, outside the clock

    def mv_no_fast_path(items: list[Item]) -> None:
        for text, ref, _ in items:
            pred = text.split("boxed{")[1].split("}")[0]
            verify(parse_answer(ref), parse_answer(pred), timeout_seconds=None)

    print("main thread ...", file=sys.stderr, flush=True)
    res["main_int_us"] = _us_per_item(lambda it: [compute_reward(*x) for x in it], ints, 3)
    res["main_int_math_verify_us"] = _us_per_item(mv_no_fast_path, ints[: max(1, n_int // 2)])
    res["main_sym_us"] = _us_per_item(lambda it: [compute_reward(*x) for x in it], syms)
    for nw in workers:
        print(f"scorer, {nw} worker(s) ...", file=sys.stderr, flush=True)
        with RewardScorer(timeout_s=timeout_s, num_workers=nw) as s:
            t0 = time.perf_counter()
            s.warmup()
            res[f"w{nw}_start_s"] = time.perf_counter() - t0
            res[f"w{nw}_scorer_int_us"] = _us_per_item(s.score, ints, 3)
            res[f"w{nw}_scorer_sym_us"] = _us_per_item(s.score, syms)
            t0 = time.perf_counter()
            s.score([TOWER])
            res[f"w{nw}_tower_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            s.warmup()
            res[f"w{nw}_restart_s"] = time.perf_counter() - t0
            res[f"w{nw}_stats"] = s.stats
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ulorl.bench.reward_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--n-int", type=int, default=500)
    p.add_argument("--n-sym", type=int, default=300)
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=5.0)
    args = p.parse_args(argv)
    workers = [int(x) for x in args.workers.split(",") if x.strip()]
    print(json.dumps(run(args.n_int, args.n_sym, workers, args.seed, args.timeout_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
