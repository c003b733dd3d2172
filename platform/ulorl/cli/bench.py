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
           bucketed vs monolithic (ulorl.bench.weight_sync).
  memory   peak memory and time of one training micro-step (forward, log-probs, entropy, loss,
           backward) on one long row, chunked vs full-logits path, each length and path in a
           fresh subprocess (ulorl.bench.memory):
           ulorl-bench memory --seq-lens 8192,32768 --vocab 151936 --hidden 128 --layers 4 --json
  zero3-memory  per-rank parameter memory of a ZeRO-3 trainer, partitioned vs full load (ulorl.bench.zero3).

Tools with their own flags (everything after the name goes to the tool; ``ulorl-bench NAME --help``):
  gpu-check       GPU validation run, time-bounded stages (ulorl.bench.gpu_check):
                  ulorl-bench gpu-check --out OUT.json --allow-missing vllm,vllm_moe,ray
  gpu-wheels      fetch the wheels gpu-check needs on a machine without network (ulorl.bench.gpu_wheels)
  reward-cost     per-item reward cost, main thread vs scorer workers (ulorl.bench.reward_cost)
  entropy-effect  first-order entropy change per token class of one update (ulorl.bench.entropy_effect)
  entropy-map     the entropy map: a grid sweep's runs with the exact probe, MPT share by tau (ulorl.bench.entropy_map)
  fill-effect     algo.dynamic_sampling_fill off vs on: time per step, learning signal (ulorl.bench.fill_effect)
  learning-signal does the default run learn? cohort reward rise and held-out avg@k over six seeds, real
                  runs read back from MLflow (ulorl.bench.learning_signal): ulorl-bench learning-signal
  reward-noise    the verifier's measured errors drawn into the training rewards of paired runs: held-out
                  effect and groups that lose their signal (ulorl.bench.reward_noise)
  warmstart-rebuild  the shipped warm-start recipe from scratch (the shipped build: 46 min), a held-out check,
                  side by side with the shipped build (ulorl.bench.warmstart_rebuild)
  peer            ulorl side by side with TRL's GRPOTrainer at equal settings, interleaved; needs the 'peer'
                  extra for TRL (ulorl.bench.peer): ulorl-bench peer --steps 12 --repeats 2 --out peer.json
  native-sync     ZeRO-3 gathers, copies and broadcast bytes of one native NCCL weight update to N engines
                  (vLLM side venv; ulorl.bench.native_sync): ulorl-bench native-sync --engines 1,4
  sp-memory       per-rank activation memory, SP = 1 vs N, under torch.distributed.run (ulorl.bench.sp):
                  ulorl-bench sp-memory --nproc 2 --seq-len 8192
  traffic         control-traffic bytes per update of a 2-rank DeepSpeed run, under torch.distributed.run,
                  the script run by path (ulorl.bench.traffic): ulorl-bench traffic --nproc 2 --out T.json
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from ulorl.bench.memory import add_memory_parser, memory_main
from ulorl.bench.verifier import add_parser as add_verifier_parser
from ulorl.bench.verifier import run_cli as run_verifier_cli
from ulorl.bench.weight_sync import add_weight_sync_parser, run_weight_sync_cli
from ulorl.bench.zero3 import add_zero3_parser, run_zero3_cli
from ulorl.jsonout import emit_json, json_command

# subcommand -> (module whose main(argv) takes the remaining arguments, help line)
TOOLS: dict[str, tuple[str, str]] = {
    "gpu-check": ("ulorl.bench.gpu_check", "GPU validation run: time-bounded stages on random-weight models"),
    "gpu-wheels": ("ulorl.bench.gpu_wheels", "fetch the wheels gpu-check needs on a machine without network"),
    "reward-cost": ("ulorl.bench.reward_cost", "per-item reward cost: main thread vs RewardScorer workers"),
    "entropy-effect": ("ulorl.bench.entropy_effect", "first-order entropy change per token class of one update"),
    "entropy-map": ("ulorl.bench.entropy_map", "MPT share of the entropy change over a grid sweep's runs"),
    "fill-effect": ("ulorl.bench.fill_effect", "algo.dynamic_sampling_fill off vs on: time per step, signal"),
    "overlap": ("ulorl.bench.overlap", "sync vs overlapped schedule x S in {1, 4}: time/step, trained samples/s"),
    "learning-signal": ("ulorl.bench.learning_signal", "cohort reward rise and held-out avg@k over seeds (real runs)"),
    "reward-noise": ("ulorl.bench.reward_noise", "the verifier's measured errors injected into paired runs' rewards"),
    "warmstart-rebuild": ("ulorl.bench.warmstart_rebuild", "rebuild the embedded warm start from scratch, check it"),
    "peer": ("ulorl.bench.peer", "ulorl vs TRL's GRPOTrainer at equal settings: time, samples/s, memory, score"),
    "native-sync": ("ulorl.bench.native_sync", "ZeRO-3 gathers / copies / broadcasts of one native NCCL weight update"),
}
# subcommand -> (module run under torch.distributed.run, run by file path?, help line)
DISTRIBUTED_TOOLS: dict[str, tuple[str, bool, str]] = {
    "sp-memory": ("ulorl.bench.sp", False, "per-rank activation memory, SP = 1 vs N (--nproc N ranks)"),
    "traffic": ("ulorl.bench.traffic", True, "control-traffic bytes per update of a DeepSpeed run (--nproc ranks)"),
}


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
    from ulorl.bench.rollout import BenchConfig

    d = BenchConfig()
    p = argparse.ArgumentParser(prog="ulorl-bench", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    names = ["rollout", "memory", "verifier", "weight-sync", "zero3-memory", *TOOLS, *DISTRIBUTED_TOOLS]
    sub = p.add_subparsers(dest="command", metavar="{" + ",".join(names) + "}")
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
    for name, (_, help_line) in TOOLS.items():
        sub.add_parser(name, help=help_line, add_help=False)
    for name, (_, _, help_line) in DISTRIBUTED_TOOLS.items():
        sub.add_parser(name, help=help_line, add_help=False)
    return p


def run_tool(name: str, argv: list[str]) -> int:
    """Run the tool behind subcommand ``name`` (``TOOLS``) with ``argv``; returns its exit code."""
    tool: Callable[[list[str]], Optional[int]] = importlib.import_module(TOOLS[name][0]).main
    return tool(argv) or 0


def distributed_command(name: str, argv: list[str]) -> list[str]:
    """The ``torch.distributed.run`` command line of subcommand ``name`` (``DISTRIBUTED_TOOLS``):
    ``--nproc N`` (default 2) sets the ranks, the other arguments go to the tool."""
    module, by_path, _ = DISTRIBUTED_TOOLS[name]
    ap = argparse.ArgumentParser(prog=f"ulorl-bench {name}", add_help=False)
    ap.add_argument("--nproc", type=int, default=2)
    known, rest = ap.parse_known_args(argv)
    if known.nproc < 1:
        raise BenchCliError(f"--nproc: expected >= 1, got {known.nproc}")
    spec = importlib.util.find_spec(module)
    target = [str(Path(spec.origin))] if by_path and spec and spec.origin else ["-m", module]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={known.nproc}",
            *target, *rest]


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in TOOLS:
        return run_tool(args[0], args[1:])
    if args and args[0] in DISTRIBUTED_TOOLS:
        try:
            cmd = distributed_command(args[0], args[1:])
        except BenchCliError as exc:
            print(f"ulorl-bench {args[0]}: error: {exc}", file=sys.stderr)
            return 2
        return subprocess.run(cmd, check=False).returncode
    return _main(args)


@json_command
def _main(argv: Optional[Sequence[str]] = None) -> int:
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
    from ulorl.bench.rollout import BenchConfig, format_report, run_rollout_bench

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
        from ulorl.out_path import out_file_problem

        problem = out_file_problem(Path(args.out), "--out", "rollout.json") if args.out else None
        if problem:   # before the benchmark (minutes): its JSON must have a place to go
            raise BenchCliError(problem)
    except (BenchCliError, ValueError) as exc:
        print(f"ulorl-bench rollout: error: {exc}", file=sys.stderr)
        return 2
    if args.engine:
        from ulorl.bench.rollout import format_engine_comparison, run_engine_comparison

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
