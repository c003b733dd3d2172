"""``ulorl-bench``: benchmarks.

    ulorl-bench rollout                       # segment counts 1,2,4,8 x static/compact (5-8 min, 2 cores)
    ulorl-bench rollout --json > bench.json   # one JSON object on stdout (then: ulorl-sim validate bench.json)
    ulorl-bench rollout --seconds 20 --segments 1,4 --regimes static
    ulorl-bench weight-sync --engine vllm --size-mb 1024   # trainer -> engine sync: bucketed vs monolithic

Subcommands:
  rollout  segment rollout (PAPER.md section 1) on the embedded task with the embedded model, no
           training: per segment count S and batching regime (static: a row keeps its slot until
           the batch ends; compact: finished rows leave the batch) the median step time, finished
           samples/s, useful tokens/s, decode utilization, prefill share, decode iterations per
           finished sample, mean batch rows and unfinished pool, ratio to S=1; then the cost of
           one decode iteration vs rows and context. Settings run side by side in one process,
           round robin, after warm-up steps. Progress goes to stderr.
  verifier reward verifier vs a labelled JSONL (response, answer, label): agreement, false
           positives / negatives, items/s, per source (``ulorl-bench verifier --help``).
  weight-sync  seconds per GB and peak extra memory (per process, from /proc) of one weight sync,
           bucketed vs monolithic (ulorl.rollout.weight_sync_bench).
  memory   peak memory and time of one training micro-step (forward, log-probs, entropy, loss,
           backward) on one long row, chunked vs full-logits path, each length and path in a
           fresh subprocess (ulorl.train.memory_bench):
           ulorl-bench memory --seq-lens 8192,32768 --vocab 151936 --hidden 128 --layers 4 --json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Optional

from ulorl.jsonout import emit_json, json_command
from ulorl.reward.verifier_bench import add_parser as add_verifier_parser
from ulorl.reward.verifier_bench import run_cli as run_verifier_cli
from ulorl.rollout.weight_sync_bench import add_weight_sync_parser, run_weight_sync_cli
from ulorl.train.memory_bench import add_memory_parser, memory_main
from ulorl.train.zero3_bench import add_zero3_parser, run_zero3_cli


class BenchCliError(ValueError):
    """A user-facing error (bad flag value)."""


def _log(msg: str) -> None:
    print(f"[ulorl-bench] {msg}", file=sys.stderr, flush=True)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise BenchCliError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not vals:
        raise BenchCliError(f"{flag}: empty list")
    return vals


def build_parser() -> argparse.ArgumentParser:
    from ulorl.rollout.bench import BenchConfig

    d = BenchConfig()
    p = argparse.ArgumentParser(prog="ulorl-bench", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="{rollout,memory,verifier,weight-sync,zero3-memory}")
    add_weight_sync_parser(sub)
    add_zero3_parser(sub)
    r = sub.add_parser("rollout", help="segment rollout: S in {1,2,4,8} x static/compact, no training",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of tables")
    r.add_argument("--seconds", type=float, default=d.seconds,
                   help="target measured seconds per setting (sets --steps from the warm-up step times)")
    r.add_argument("--steps", type=int, default=None,
                   help="measured steps per setting (every setting decodes the same prompts); default from --seconds")
    r.add_argument("--rounds", type=int, default=d.rounds, help="round-robin rounds over the settings")
    r.add_argument("--device", default=d.device, help="cpu | cuda (| cuda:N)")
    r.add_argument("--prompts", type=int, default=d.prompts, help="new prompts per step")
    r.add_argument("--group", type=int, default=d.group, help="responses per prompt (G)")
    r.add_argument("--max-len", type=int, default=d.max_len, help="global max response length")
    r.add_argument("--segments", default=",".join(map(str, d.segments)), help="segment counts S")
    r.add_argument("--regimes", default=",".join(d.regimes), help="batching regimes")
    r.add_argument("--warmup", type=int, default=None,
                   help="warm-up steps per setting (unset: S, which fills the unfinished pool)")
    r.add_argument("--threads", type=int, default=d.threads,
                   help="torch threads (0 = torch's default; 1 is robust on a shared 2-core machine)")
    r.add_argument("--model", default=d.model, help="'embedded' or a local model folder")
    r.add_argument("--seed", type=int, default=d.seed, help="prompt order and sampling seed")
    r.add_argument("--temperature", type=float, default=d.temperature)
    r.add_argument("--cost-rows", default=",".join(map(str, d.cost_rows)), help="rows of the cost curve")
    r.add_argument("--cost-contexts", default=None, help="contexts of the cost curve (unset: 64,L/2,L+64)")
    r.add_argument("--out", default=None, help="also write the JSON object to this file")
    r.add_argument("--engine", default=None,
                   help="engines side by side instead of the S x regime grid, e.g. hf,vllm (vllm: run from the vLLM "
                        "side venv): same prompts and seeds, first --segments value, --steps (default 4) measured "
                        "steps each; prints tokens/s and completed/s per engine")
    add_verifier_parser(sub)
    add_memory_parser(sub)
    return p


@json_command
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "verifier":
        return run_verifier_cli(args)
    if args.command == "weight-sync":
        return run_weight_sync_cli(args)
    if args.command == "zero3-memory":
        return run_zero3_cli(args)
    if args.command == "memory":
        return memory_main(args)
    if args.command != "rollout":
        parser.print_help(sys.stderr)
        return 2
    from ulorl.rollout.bench import BenchConfig, format_report, run_rollout_bench

    try:
        regimes = tuple(x.strip() for x in args.regimes.split(",") if x.strip())
        cfg = BenchConfig(
            prompts=args.prompts, group=args.group, max_len=args.max_len,
            segments=_ints(args.segments, "--segments"), regimes=regimes, seconds=args.seconds, steps=args.steps,
            rounds=args.rounds, warmup=args.warmup, device=args.device, model=args.model,
            threads=args.threads or None, temperature=args.temperature, seed=args.seed,
            cost_rows=_ints(args.cost_rows, "--cost-rows"),
            cost_contexts=_ints(args.cost_contexts, "--cost-contexts") if args.cost_contexts else None,
        )
        cfg.validate()
    except (BenchCliError, ValueError) as exc:
        print(f"ulorl-bench rollout: error: {exc}", file=sys.stderr)
        return 2
    if args.engine:
        from ulorl.rollout.bench import format_engine_comparison, run_engine_comparison

        names = [x.strip() for x in args.engine.split(",") if x.strip()]
        out = run_engine_comparison(cfg, names, progress=_log)
        if args.json:
            emit_json(out)
        else:
            print(format_engine_comparison(out))
        return 0
    n = len(cfg.segments) * len(cfg.regimes)
    _log(f"{n} settings x {cfg.seconds:.0f}s measured (+ warm-up, cost curve); "
         f"{cfg.prompts} prompts x {cfg.group}, max {cfg.max_len} tokens")
    try:
        out = run_rollout_bench(cfg, progress=_log)
    except Exception as exc:  # noqa: BLE001 - one clear line for missing models / devices
        from ulorl.models.loading import ModelLoadError

        if isinstance(exc, (ModelLoadError, RuntimeError, FileNotFoundError)):
            print(f"ulorl-bench rollout: error: {exc}", file=sys.stderr)
            return 1
        raise
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh)
        _log(f"wrote {args.out}")
    if args.json:
        emit_json(out)
    else:
        print(format_report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
