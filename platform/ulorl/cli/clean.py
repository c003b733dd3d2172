"""``ulorl-clean``: the data-cleaning filters of PAPER.md section 4 on a problem/answer JSONL file.

    ulorl-clean data/raw.jsonl --out data/clean.jsonl                      # rule filters only
    ulorl-clean raw.jsonl --out clean.jsonl --report report.json --dropped dropped.jsonl
    ulorl-clean raw.jsonl --out clean.jsonl --judge-model /models/Qwen3-8B --too-easy-k 8 \
                --consensus-models /models/A,/models/B --max-new-tokens 16384 --device cuda

Rule filters always run (multi-part, true/false, proof, multiple choice -> short answer or drop,
long answers, answer normalisation). ``--judge-model`` enables the "too easy" filter (that model
answers right in all ``--too-easy-k`` samples) and acts as the generative verifier;
``--consensus-models`` enables "reference disagrees with the models' consensus". The report
(counts per filter and every dropped row with its reason) goes to ``--report`` (default
``<out stem>.report.json``); the table is printed (to stderr with ``--json``, which prints
exactly one JSON object on stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from ulorl.jsonout import emit_json, json_command


class CleanCliError(Exception):
    """A user-facing error (bad flag, missing file, model that does not load)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ulorl-clean", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="input JSONL (one object per line with problem and answer)")
    p.add_argument("--out", required=True, help="output JSONL of kept rows")
    p.add_argument("--report", default=None, help="report JSON (default: <out stem>.report.json)")
    p.add_argument("--dropped", default=None, help="also write every dropped row (with _drop_reason) to this JSONL")
    p.add_argument("--max-answer-chars", type=int, default=50, help="drop reference answers longer than this")
    p.add_argument("--judge-model", default=None,
                   help="strong model for the too-easy filter and generative verifier (path, 'embedded' or HF id)")
    p.add_argument("--too-easy-k", type=int, default=8, help="samples per problem for the too-easy filter (0 = off)")
    p.add_argument("--consensus-models", default=None, help="comma-separated models for the consensus filter")
    p.add_argument("--max-new-tokens", type=int, default=4096, help="response budget of the model filters")
    p.add_argument("--temperature", type=float, default=0.85, help="sampling temperature of the too-easy filter")
    p.add_argument("--batch-prompts", type=int, default=8, help="problems per engine call")
    p.add_argument("--judge-max-new-tokens", type=int, default=64)
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--timeout-s", type=float, default=5.0, help="time bound per answer check")
    p.add_argument("--num-workers", type=int, default=1, help="answer-check worker processes")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object (the summary) on stdout")
    return p


def _log(msg: str) -> None:
    print(f"[ulorl-clean] {msg}", file=sys.stderr, flush=True)


def _load_model(name: str, args: argparse.Namespace) -> Any:
    """(engine, tokenizer) for ``name`` through the platform's model loader and engine factory."""
    from ulorl.config import RolloutConfig
    from ulorl.data.clean import ModelHandle

    try:
        from ulorl.models.loading import ModelLoadError, load_policy
        from ulorl.rollout.engines import make_engine
    except ImportError as exc:
        raise CleanCliError(f"model-based filters need the model loader and rollout engines ({exc})") from None
    t0 = time.perf_counter()
    try:
        model, tok = load_policy(name, dtype=args.dtype, device=args.device)
    except ModelLoadError as exc:
        raise CleanCliError(f"model {name!r}: {exc}") from None
    cfg = RolloutConfig(engine=args.engine, device=args.device, segments=1, max_response_len=args.max_new_tokens,
                        temperature=args.temperature)
    engine = make_engine(cfg, model, tok)
    _log(f"loaded {name} in {time.perf_counter() - t0:.1f}s")
    return ModelHandle(name=name, engine=engine, tokenizer=tok)


def _same_file(a: Path, b: Path) -> bool:
    """True when ``a`` and ``b`` name one file (the same path, a symlink or a hard link to it)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:   # one of them does not exist yet: not the same file
        return False


def check_paths(inp: Path, outputs: list[tuple[str, Optional[Path]]]) -> None:
    """Refuse, before any work, an input that is not a file and an output (``(flag, path)``; None = not
    asked for) that is a folder, the input itself, or the same file as another output."""
    if inp.is_dir():
        raise CleanCliError(f"input {inp} is a folder; give the JSONL file to clean")
    if not inp.is_file():
        raise CleanCliError(f"input file not found: {inp}")
    seen: list[tuple[str, Path]] = []
    for flag, path in outputs:
        if path is None:
            continue
        if path.is_dir():
            raise CleanCliError(f"{flag} {path} is a folder; give a file path, e.g. {path / 'clean.jsonl'}"
                                if flag == "--out" else f"{flag} {path} is a folder; give a file path")
        if _same_file(path, inp):
            raise CleanCliError(f"{flag} {path} would overwrite the input {inp}; give another path (ulorl-clean never "
                                "changes its input)")
        for other_flag, other in seen:
            if _same_file(path, other):
                raise CleanCliError(f"{flag} {path} is also {other_flag}: one would overwrite the other; give each "
                                    "its own path")
        if path.parent.exists() and not path.parent.is_dir():
            raise CleanCliError(f"{flag} {path}: {path.parent} is a file, not a folder")
        seen.append((flag, path))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ulorl.data.clean import clean_file, read_rows, write_jsonl, write_text_atomic
    from ulorl.data.jsonl import DataError

    inp = Path(args.input)
    out = Path(args.out)
    check_paths(inp, [("--out", out)])   # a folder first: the default report's name comes from the file's
    report_path = Path(args.report) if args.report else out.with_name(out.stem + ".report.json")
    report_flag = "--report" if args.report else "--report (default <out stem>.report.json)"
    check_paths(inp, [("--out", out), (report_flag, report_path),
                      ("--dropped", Path(args.dropped) if args.dropped else None)])
    if args.max_answer_chars < 1:
        raise CleanCliError(f"--max-answer-chars must be >= 1, got {args.max_answer_chars}")
    if args.too_easy_k < 0:
        raise CleanCliError(f"--too-easy-k must be >= 0, got {args.too_easy_k}")
    consensus_names = [m.strip() for m in (args.consensus_models or "").split(",") if m.strip()]

    strong = judge = scorer = None
    consensus: list[Any] = []
    try:
        if args.judge_model or consensus_names:
            from ulorl.reward.judge import GenerativeJudge
            from ulorl.reward.scorer import RewardScorer

            loaded: dict[str, Any] = {}  # a model named twice is loaded once

            def load(name: str) -> Any:
                if name not in loaded:
                    loaded[name] = _load_model(name, args)
                return loaded[name]

            if args.judge_model:
                strong = load(args.judge_model)
                judge = GenerativeJudge(strong.engine, strong.tokenizer, max_new_tokens=args.judge_max_new_tokens)
            consensus = [load(n) for n in consensus_names]
            scorer = RewardScorer(timeout_s=args.timeout_s, num_workers=args.num_workers, judge=judge)
        try:
            kept, report = clean_file(
                inp, max_answer_chars=args.max_answer_chars, strong_model=strong, too_easy_k=args.too_easy_k,
                consensus_models=consensus or None, scorer=scorer, judge=judge,
                max_new_tokens=args.max_new_tokens, batch_prompts=args.batch_prompts,
                temperature=args.temperature,
            )
        except DataError as exc:
            raise CleanCliError(str(exc)) from None
    finally:
        if scorer is not None:
            scorer.close()

    rep = report.to_dict()
    rep["settings"]["output"] = str(out)
    dropped_rows: list[dict[str, Any]] = []
    if args.dropped:
        by_line = {r.line: r.data for r in read_rows(inp)}
        dropped_rows = [{**by_line[d["line"]], "_drop_reason": d["reason"], "_drop_detail": d["detail"]}
                        for d in rep["dropped_rows"]]
    writes: list[tuple[Path, Callable[[], None]]] = [
        (out, lambda: write_jsonl(kept, out)),
        (report_path, lambda: write_text_atomic(report_path, json.dumps(rep, indent=2, ensure_ascii=False) + "\n")),
    ]
    if args.dropped:
        writes.append((Path(args.dropped), lambda: write_jsonl(dropped_rows, args.dropped)))
    for path, write in writes:   # each file whole or not at all (written beside it, then renamed)
        try:
            write()
        except OSError as exc:
            raise CleanCliError(f"cannot write {path}: {exc.strerror or exc}") from None
    summary = {k: v for k, v in rep.items() if k != "dropped_rows"}
    summary.update({"output": str(out), "report": str(report_path), "dropped_file": args.dropped})
    table = report.table()
    print(table, file=sys.stderr if args.json else sys.stdout, flush=True)
    _log(f"wrote {len(kept)} rows to {out}; report {report_path}")
    return summary


@json_command
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = run(args)
    except CleanCliError as exc:
        print(f"ulorl-clean: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        emit_json(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
