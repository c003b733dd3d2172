"""``ulorl-bench verifier``: agreement of the reward verifier with labelled responses, and its speed.

    ulorl-bench verifier LABELLED.jsonl                              # table on stdout
    ulorl-bench verifier LABELLED.jsonl --extraction boxed_or_final --json --out rows.jsonl
    ulorl-bench verifier tests/data/verifier_hard.jsonl --split test --extraction all
    ulorl-bench verifier LABELLED.jsonl --extraction boxed_or_final --judge-model PATH
    ulorl-bench verifier --synthetic                                 # per-item cost, no labels

Each row of LABELLED.jsonl: ``response`` (str), ``answer`` (str, the reference), ``label`` (bool:
is the response right), optional ``problem`` (option texts, ordered answer vs set, the asked
quantity of a closing sentence), ``source`` and ``split`` (``--split`` keeps one part). Every row
is scored by ``RewardScorer.score`` -- the trainer's code path (``--extraction boxed``, the
training default) or ulorl-eval's (``boxed_or_final``; ``all`` = both, one after the other) -- in
its time-bounded worker processes. Reported per extraction mode, overall and per source:
agreement with the labels, false positives (scored 1, labelled wrong), false negatives, and
items/s (scoring only, after the workers are warm); also the agreement on the rows whose response
contains a box. ``--out`` writes one JSON line per row and mode (extracted answer, score, label,
agree) for reading the disagreements.

``--judge-model`` adds the generative judge (``ulorl.reward.judge``) where the rules abstain (an
extracted answer the rule check rejects with prose or a number with units on a side; never a proven
integer / letter mismatch, a timeout or a row without an answer), with the row's problem in its
prompt and each engine call bounded by ``--judge-timeout-s``; the summary then holds the judge's
calls, flips, seconds and seconds per call.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Optional

from ulorl.data.jsonl import DataError, read_json_objects
from ulorl.jsonout import emit_json
from ulorl.reward.extract import EXTRACTION_MODES, extract_answer

REQUIRED = ("response", "answer", "label")
SPLITS = ("dev", "test")


class LabelledDataError(ValueError):
    """A malformed labelled file (the message names the file and line)."""


def load_labelled(path: str) -> list[dict[str, Any]]:
    """Rows of a labelled JSONL file, checked: ``response``/``answer`` strings, ``label`` bool."""
    rows = []
    try:
        objects = read_json_objects(path)
    except DataError as exc:
        raise LabelledDataError(str(exc)) from None
    for n, row in objects:
        for key in REQUIRED:
            if key not in row:
                raise LabelledDataError(f"{path}:{n}: missing key {key!r}")
        if not isinstance(row["response"], str) or not isinstance(row["answer"], (str, int, float)):
            raise LabelledDataError(f"{path}:{n}: 'response' must be a string and 'answer' a string or number")
        if not isinstance(row["label"], bool):
            raise LabelledDataError(f"{path}:{n}: 'label' must be true or false, got {row['label']!r}")
        row["answer"] = str(row["answer"])
        rows.append(row)
    if not rows:
        raise LabelledDataError(f"{path}: no rows")
    return rows


def _counts(pairs: list[tuple[bool, bool]]) -> dict[str, Any]:
    """{n, agreement, false_positives, false_negatives} of (scored, label) pairs."""
    n = len(pairs)
    fp = sum(1 for s, lab in pairs if s and not lab)
    fn = sum(1 for s, lab in pairs if lab and not s)
    return {"n": n, "agreement": (n - fp - fn) / n if n else None, "false_positives": fp, "false_negatives": fn}


def select_split(rows: list[dict[str, Any]], split: Optional[str], path: str = "labelled file") -> list[dict[str, Any]]:
    """The rows of one ``split`` (``dev`` / ``test``); all rows when ``split`` is None."""
    if split is None:
        return rows
    if not any("split" in r for r in rows):
        raise LabelledDataError(f"{path}: --split {split} given, but no row has a 'split' field")
    kept = [r for r in rows if r.get("split") == split]
    if not kept:
        raise LabelledDataError(f"{path}: no row with split {split!r}")
    return kept


class TimedJudge:
    """A judge wrapper that counts the pairs it is asked about and the seconds its answers take."""

    def __init__(self, judge: Any) -> None:
        self.judge = judge
        self.pairs = 0
        self.seconds = 0.0

    def judge_many(self, pairs: Sequence[tuple[str, ...]]) -> list[bool]:
        t0 = time.perf_counter()
        try:
            return self.judge.judge_many(pairs)
        finally:
            self.seconds += time.perf_counter() - t0
            self.pairs += len(pairs)


def score_labelled(
    rows: list[dict[str, Any]], extraction: str = "boxed", num_workers: int = 1, timeout_s: float = 5.0,
    judge: Any = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(summary, per-row results) of scoring ``rows`` with a ``RewardScorer`` (and ``judge``, a
    ``judge_many`` second opinion on the rule path's misses, when given)."""
    from ulorl.reward.scorer import RewardScorer

    items = [(r["response"], r["answer"], False, r.get("problem")) for r in rows]
    timed = TimedJudge(judge) if judge is not None else None
    with RewardScorer(timeout_s=timeout_s, num_workers=num_workers, extraction=extraction, judge=timed) as scorer:
        scorer.warmup()
        t0 = time.perf_counter()
        scores = scorer.score(items)
        elapsed = time.perf_counter() - t0
        stats = scorer.stats
    per_row, by_src = [], defaultdict(list)
    for r, s in zip(rows, scores):
        scored = s >= 1.0
        src = str(r.get("source") or "unknown")
        by_src[src].append((scored, r["label"]))
        per_row.append({
            "source": src, "origin": r.get("origin"), "answer": r["answer"],
            "extracted": extract_answer(r["response"], extraction, r.get("problem")), "score": s, "label": r["label"],
            "agree": scored == r["label"], "has_box": "\\boxed" in r["response"] or "\\fbox" in r["response"],
        })
    summary = _counts([(p["score"] >= 1.0, p["label"]) for p in per_row])
    boxed = [(p["score"] >= 1.0, p["label"]) for p in per_row if p["has_box"]]
    summary.update({
        "extraction": extraction, "items_per_s": len(rows) / elapsed if elapsed > 0 else None,
        "seconds": elapsed, "num_workers": num_workers, "timeout_s": timeout_s,
        "by_source": {k: _counts(v) for k, v in sorted(by_src.items())},
        "with_box": _counts(boxed), "scorer_stats": stats,
    })
    if timed is not None:
        calls = stats.get("judge_calls", 0)
        summary["judge"] = {
            "calls": calls, "flips": stats.get("judge_flips", 0), "seconds": timed.seconds,
            "seconds_per_call": timed.seconds / calls if calls else None,
            "calls_per_item": calls / len(rows) if rows else None,
            "judge_stats": dict(getattr(judge, "stats", {}) or {}),
        }
    return summary, per_row


def score_modes(
    rows: list[dict[str, Any]], modes: list[str], num_workers: int = 1, timeout_s: float = 5.0, judge: Any = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``score_labelled`` once per extraction mode: the first mode's summary, with ``by_extraction``
    holding every mode's (the same fields, without per-row results); per-row results of all modes."""
    summaries, all_rows = {}, []
    for mode in modes:
        summary, per_row = score_labelled(rows, mode, num_workers, timeout_s, judge)
        summaries[mode] = summary
        all_rows += [{"extraction": mode, **p} for p in per_row]
    out = dict(summaries[modes[0]])
    out["by_extraction"] = summaries
    return out, all_rows


def format_summary(summary: dict[str, Any]) -> str:
    """Plain-text table of a ``score_labelled`` summary."""
    def line(name: str, c: dict[str, Any]) -> str:
        agr = f"{100 * c['agreement']:.2f}%" if c["agreement"] is not None else "-"
        return f"{name:<34} {c['n']:>6} {agr:>9} {c['false_positives']:>5} {c['false_negatives']:>5}"

    out = []
    for s in (summary.get("by_extraction") or {summary["extraction"]: summary}).values():
        out += [f"verifier agreement (extraction={s['extraction']}, {s['num_workers']} worker(s), "
                f"{s['items_per_s']:.1f} items/s)",
                f"{'source':<34} {'n':>6} {'agree':>9} {'FP':>5} {'FN':>5}"]
        for src, c in s["by_source"].items():
            out.append(line(src, c))
        out.append(line("responses with a box", s["with_box"]))
        out.append(line("all", s))
        if s.get("judge"):
            j = s["judge"]
            per = f"{j['seconds_per_call']:.3f} s/call" if j["seconds_per_call"] is not None else "no calls"
            out.append(f"judge: {j['calls']} calls ({j['calls_per_item']:.3f} per item), {j['flips']} flips, "
                       f"{j['seconds']:.1f} s, {per}")
    return "\n".join(out)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register the ``verifier`` subcommand on an ``argparse`` subparsers object."""
    v = sub.add_parser("verifier", help="reward verifier vs labelled responses: agreement, FP/FN, items/s",
                       description=__doc__.split("\n\n")[0], epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("labelled", nargs="?", default=None,
                   help="JSONL with response, answer, label (bool), optional problem and source")
    v.add_argument("--extraction", choices=(*EXTRACTION_MODES, "all"), default="boxed",
                   help="answer extraction: boxed (training default) | boxed_or_final (ulorl-eval default) | "
                        "all (each mode in turn; the JSON's top level is the first, by_extraction has every mode)")
    v.add_argument("--split", choices=SPLITS, default=None,
                   help="score only the rows whose 'split' field is this (tune on dev, report on test)")
    v.add_argument("--judge-model", default=None,
                   help="generative judge (local path / HF id / 'embedded') asked about the rule path's misses")
    v.add_argument("--judge-max-new-tokens", type=int, default=64, help="token budget of one judge answer")
    v.add_argument("--judge-device", default="cpu", help="device of the judge model")
    v.add_argument("--judge-timeout-s", type=float, default=None,
                   help="time bound of one judge engine call (over it: not equivalent, judge off)")
    v.add_argument("--workers", type=int, default=1, help="scorer worker processes")
    v.add_argument("--timeout-s", type=float, default=5.0, help="time bound of one rule check")
    v.add_argument("--json", action="store_true",
                   help="print one JSON object (n, agreement, false_positives, false_negatives, items_per_s, "
                        "by_source, ...)")
    v.add_argument("--out", default=None, help="write per-row results (JSON lines) to this file")
    v.add_argument("--synthetic", action="store_true",
                   help="instead: per-item cost of the verifier on synthetic integer / symbolic items (no labels)")
    v.add_argument("--n-int", type=int, default=500, help="--synthetic: integer items")
    v.add_argument("--n-sym", type=int, default=300, help="--synthetic: symbolic items")
    v.add_argument("--synthetic-workers", default="1,2", help="--synthetic: comma-separated worker counts")
    return v


def run_cli(args: argparse.Namespace) -> int:
    """Run ``ulorl-bench verifier`` with parsed ``args``; returns the exit code."""
    if args.synthetic:
        from ulorl.bench.reward_cost import run as run_synthetic

        workers = [int(x) for x in args.synthetic_workers.split(",") if x.strip()]
        print(json.dumps(run_synthetic(args.n_int, args.n_sym, workers, 0, args.timeout_s)))
        return 0
    if not args.labelled:
        print("ulorl-bench verifier: error: give LABELLED.jsonl (or --synthetic)", file=sys.stderr)
        return 2
    if args.workers < 1 or args.timeout_s <= 0:
        print("ulorl-bench verifier: error: --workers must be >= 1 and --timeout-s > 0", file=sys.stderr)
        return 2
    try:
        rows = select_split(load_labelled(args.labelled), args.split, args.labelled)
    except LabelledDataError as exc:
        print(f"ulorl-bench verifier: error: {exc}", file=sys.stderr)
        return 2
    judge = None
    if args.judge_model:
        try:
            judge = load_judge(args.judge_model, args.judge_device, args.judge_max_new_tokens, args.judge_timeout_s)
        except (ImportError, RuntimeError, OSError, ValueError) as exc:
            print(f"ulorl-bench verifier: error: --judge-model {args.judge_model!r}: {exc}", file=sys.stderr)
            return 2
    modes = list(EXTRACTION_MODES) if args.extraction == "all" else [args.extraction]
    summary, per_row = score_modes(rows, modes, args.workers, args.timeout_s, judge)
    summary["labelled"] = args.labelled
    summary["split"] = args.split
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            for p in per_row:
                fh.write(json.dumps(p, ensure_ascii=False) + "\n")
    if args.json:
        emit_json(summary)
    else:
        print(format_summary(summary))
    return 0


def load_judge(name: str, device: str = "cpu", max_new_tokens: int = 64, timeout_s: Optional[float] = None) -> Any:
    """A ``GenerativeJudge`` on model ``name`` (the platform's loader, an HF engine on ``device``)."""
    from ulorl.config import RolloutConfig
    from ulorl.models.loading import load_policy
    from ulorl.reward.judge import GenerativeJudge
    from ulorl.rollout.engines import make_engine

    model, tok = load_policy(name, device=device)
    engine = make_engine(RolloutConfig(engine="hf", device=device, segments=1, max_response_len=max_new_tokens),
                         model, tok)
    return GenerativeJudge(engine, tok, max_new_tokens=max_new_tokens, timeout_s=timeout_s)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ulorl.bench.verifier")
    add_parser(p.add_subparsers(dest="command", required=True))
    return run_cli(p.parse_args(["verifier", *(argv if argv is not None else sys.argv[1:])]))


if __name__ == "__main__":
    sys.exit(main())
