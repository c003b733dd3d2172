"""ulorl side by side with TRL's ``GRPOTrainer``: ``ulorl-bench peer``.

    ulorl-bench peer                                   # TRL + ulorl S = 1, 4 x static / compact (~15 min, 2 cores)
    ulorl-bench peer --steps 12 --repeats 2 --out peer.json
    ulorl-bench peer --no-trl --segments 1,4 --regimes compact      # ulorl alone

Both train the embedded model on the embedded task at the settings ``ulorl.bench.peer_settings``
makes equal (printed as a table: prompts per step, G, max response length, temperature, lr and
optimizer, clip-higher bounds, token-level loss, no KL, one update per rollout, advantages by
the unbiased std + 1e-4, the same steps and prompt sequence) and the ones that cannot be (also
printed, with what each does to the comparison).

One run, interleaved: each repeat starts every system fresh in its own process (seed + repeat),
then steps them round robin, one step each, the first system of a round rotating, so machine
load hits all of them alike. Per system, over steps ``warmup + 1 .. steps`` of every repeat:
median time per step, CPU seconds per step (process CPU time: less sensitive to other load),
rollout (generation + reward) and update seconds per step, trained samples per step, trained
samples/s and response tokens/s, seconds per trained sample and its ratio to TRL and to
ulorl S = 1 of the same batching; peak RSS of the process; and the held-out avg@k after the
steps (the same evaluator and sampling for every system; one score before training too).
Progress goes to stderr, each worker's own output to ``WORKDIR/logs``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform as _platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from ulorl.bench.peer_settings import TRL_VERSION, PeerConfig, System, settings_rows, systems_of
from ulorl.bench.peer_workers import worker_main
from ulorl.jsonout import emit_json, json_command

Progress = Optional[Callable[[str], None]]
#: seconds a worker may take to start (imports, model, trainer) or to answer one command
START_TIMEOUT_S = 900.0
COMMAND_TIMEOUT_S = 3600.0


class WorkerError(RuntimeError):
    """A worker process failed or died; the message names the system and its log."""


class _Worker:
    """One system's process and the pipe to it."""

    def __init__(self, ctx: Any, system: System, payload: dict[str, Any]) -> None:
        self.system = system
        self.log = payload["log"]
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, payload), name=f"peer-{system.slug}")
        self.proc.start()
        child.close()
        self.info: dict[str, Any] = {}

    def wait(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self.conn.poll(1.0):
            if not self.proc.is_alive():
                raise WorkerError(f"{self.system.name}: the worker exited (code {self.proc.exitcode}); see {self.log}")
            if time.monotonic() > deadline:
                raise WorkerError(f"{self.system.name}: no answer in {timeout:.0f} s; see {self.log}")
        kind, data = self.conn.recv()
        if kind == "error":
            raise WorkerError(f"{self.system.name} failed (log: {self.log}):\n{data}")
        return dict(data)

    def call(self, cmd: str, timeout: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
        self.conn.send(cmd)
        return self.wait(timeout)

    def close(self) -> Optional[dict[str, Any]]:
        """Stop the process; its last memory reading when it answered."""
        out = None
        if self.proc.is_alive():
            try:
                out = self.call("stop", timeout=120.0)
            except (WorkerError, OSError, EOFError):
                pass
        self.proc.join(timeout=30.0)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=10.0)
        self.conn.close()
        return out


def _say(progress: Progress, msg: str) -> None:
    if progress is not None:
        progress(msg)


def _loadavg() -> Optional[list[float]]:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def run_peer_bench(cfg: PeerConfig, *, workdir: Path, progress: Progress = None,
                   on_repeat: Optional[Callable[[dict[str, Any]], None]] = None) -> dict[str, Any]:
    """The whole ``ulorl-bench peer`` run; returns the JSON object (module docstring). ``on_repeat``
    gets the partial result after each repeat (so a long run loses nothing when cut short)."""
    cfg.validate()
    systems = systems_of(cfg)
    if not systems:
        raise ValueError("no system to run (--no-trl with no segments / regimes)")
    ctx = mp.get_context("spawn")
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"config": asdict(cfg), "settings": settings_rows(cfg), "systems": [s.name for s in systems],
                           "steps": [], "evals": [], "memory": [], "errors": [], "environment": _environment(),
                           "loadavg_start": _loadavg(), "niceness": os.nice(0) if hasattr(os, "nice") else None}
    t_start = time.perf_counter()
    failed: set[str] = set()
    for rep in range(cfg.repeats):
        seed = cfg.seed + rep
        workers: list[_Worker] = []
        try:
            for s in systems:
                if s.name in failed:
                    continue
                payload = {"system": asdict(s), "config": asdict(cfg), "seed": seed,
                           "workdir": str(workdir / f"rep{rep}" / s.slug),
                           "log": str(workdir / "logs" / f"rep{rep}-{s.slug}.log")}
                workers.append(_Worker(ctx, s, payload))
            live = []
            for w in workers:
                try:
                    w.info = w.wait(START_TIMEOUT_S)
                    live.append(w)
                    _say(progress, f"repeat {rep + 1}/{cfg.repeats}: {w.system.name} ready "
                                   f"({_mb(w.info.get('rss_mb'))} MB)")
                except WorkerError as exc:
                    _fail(out, failed, w.system, rep, exc, progress)
            if rep == 0 and live:
                try:   # every system starts from the same weights: one score before training
                    out["initial_eval"] = live[-1].call("eval")
                    _say(progress, f"held-out before training: {out['initial_eval']['avg_at_k']:.3f}")
                except WorkerError as exc:
                    _fail(out, failed, live[-1].system, rep, exc, progress)
            for step in range(cfg.steps):
                k = step % max(1, len(live))
                for w in live[k:] + live[:k]:
                    if w.system.name in failed:
                        continue
                    try:
                        rec = w.call("step")
                    except WorkerError as exc:
                        _fail(out, failed, w.system, rep, exc, progress)
                        continue
                    out["steps"].append({"system": w.system.name, "repeat": rep, "step": step + 1, **rec})
                _say(progress, f"repeat {rep + 1}/{cfg.repeats} step {step + 1}/{cfg.steps}: " + ", ".join(
                    f"{r['system']} {r['wall_s']:.1f}s" for r in out["steps"]
                    if r["repeat"] == rep and r["step"] == step + 1))
            for w in live:
                if w.system.name in failed:
                    continue
                try:
                    ev = w.call("eval")
                    out["evals"].append({"system": w.system.name, "repeat": rep, **ev})
                    _say(progress, f"repeat {rep + 1}: {w.system.name} held-out avg@{ev['k']} {ev['avg_at_k']:.3f}")
                except WorkerError as exc:
                    _fail(out, failed, w.system, rep, exc, progress)
        finally:
            for w in workers:
                mem = w.close()
                if mem is not None:
                    out["memory"].append({"system": w.system.name, "repeat": rep, "setup_rss_mb": w.info.get("rss_mb"),
                                          **mem})
        out["loadavg_end"] = _loadavg()
        out["wall_s"] = time.perf_counter() - t_start
        out["summary"] = summarize(out, cfg, systems)
        if on_repeat is not None:
            on_repeat(out)
    return out


def _fail(out: dict[str, Any], failed: set[str], system: System, rep: int, exc: Exception, progress: Progress) -> None:
    failed.add(system.name)
    out["errors"].append({"system": system.name, "repeat": rep, "error": str(exc)})
    _say(progress, f"{system.name}: FAILED, left out from here on: {str(exc).splitlines()[0]}")


def _environment() -> dict[str, Any]:
    import importlib.metadata as md

    def version(name: str) -> Optional[str]:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    return {"python": _platform.python_version(), "torch": version("torch"), "transformers": version("transformers"),
            "trl": version("trl"), "cpu_count": os.cpu_count(), "machine": _platform.machine()}


def _mb(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0f}"


# ----------------------------------------------------------------------------- summary


def summarize(out: dict[str, Any], cfg: PeerConfig, systems: Sequence[System]) -> list[dict[str, Any]]:
    """One row per system over the measured steps (``warmup + 1 .. steps``) of every repeat."""
    rows = []
    for s in systems:
        recs = [r for r in out["steps"] if r["system"] == s.name and r["step"] > cfg.warmup]
        wall = sum(r["wall_s"] for r in recs)
        cpu = sum(r["cpu_s"] for r in recs)
        samples = sum(r["samples"] for r in recs)
        tokens = sum(r["tokens"] for r in recs)
        n = len(recs)
        per_rep = []
        for rep in sorted({r["repeat"] for r in recs}):
            rr = [r for r in recs if r["repeat"] == rep]
            t = sum(r["wall_s"] for r in rr)
            per_rep.append(sum(r["samples"] for r in rr) / t if t > 0 else 0.0)
        evals = [e for e in out["evals"] if e["system"] == s.name]
        mem = [m for m in out["memory"] if m["system"] == s.name]
        peaks = [m["peak_rss_mb"] for m in mem if m.get("peak_rss_mb") is not None]
        setup = [m["setup_rss_mb"] for m in mem if m.get("setup_rss_mb") is not None]
        rows.append({
            "system": s.name, "kind": s.kind, "segments": s.segments if s.kind == "ulorl" else None,
            "batching": s.batching if s.kind == "ulorl" else None,
            "measured_steps": n,
            "step_s_median": statistics.median(r["wall_s"] for r in recs) if recs else None,
            "step_s_mean": wall / n if n else None,
            "cpu_s_per_step": cpu / n if n else None,
            "rollout_s_per_step": sum(r["rollout_s"] for r in recs) / n if n else None,
            "update_s_per_step": sum(r["update_s"] for r in recs) / n if n else None,
            "rollout_cpu_s_per_step": sum(r["rollout_cpu_s"] for r in recs) / n if n else None,
            "update_cpu_s_per_step": sum(r["update_cpu_s"] for r in recs) / n if n else None,
            "samples_per_step": samples / n if n else None,
            "samples_per_s": samples / wall if wall > 0 else None,
            "samples_per_s_repeats": per_rep,
            "tokens_per_s": tokens / wall if wall > 0 else None,
            "s_per_sample": wall / samples if samples else None,
            "cpu_s_per_sample": cpu / samples if samples else None,
            "padded_per_real_token": _ratio(recs, "train_padded_tokens", "train_real_tokens"),
            "first_fit_padded_per_real_token": _ratio(recs, "first_fit_padded_tokens", "train_real_tokens"),
            "peak_rss_mb": max(peaks) if peaks else None,
            "setup_rss_mb": max(setup) if setup else None,
            "heldout": [e["avg_at_k"] for e in evals],
            "heldout_mean": statistics.fmean(e["avg_at_k"] for e in evals) if evals else None,
            "vs_trl": None, "vs_trl_cpu": None, "vs_s1": None,
        })
    add_ratios(rows)
    return rows


def _ratio(recs: Sequence[dict[str, Any]], num: str, den: str) -> Optional[float]:
    """sum(num) / sum(den) over the records that have both (None when none has)."""
    both = [r for r in recs if r.get(num) is not None and r.get(den)]
    d = sum(r[den] for r in both)
    return sum(r[num] for r in both) / d if d else None


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Per trained sample, how many times faster than TRL (wall and CPU seconds) and than ulorl
    S = 1 of the same batching (``> 1`` = faster)."""
    trl = next((r for r in rows if r["kind"] == "trl"), None)
    s1 = {r["batching"]: r for r in rows if r["kind"] == "ulorl" and r["segments"] == 1}
    for r in rows:
        if trl is not None and trl["s_per_sample"] and r["s_per_sample"]:
            r["vs_trl"] = trl["s_per_sample"] / r["s_per_sample"]
            r["vs_trl_cpu"] = trl["cpu_s_per_sample"] / r["cpu_s_per_sample"]
        base = s1.get(r["batching"]) if r["kind"] == "ulorl" else None
        if base is not None and base["s_per_sample"] and r["s_per_sample"]:
            r["vs_s1"] = base["s_per_sample"] / r["s_per_sample"]


# ----------------------------------------------------------------------------- text report


def _f(x: Optional[float], nd: int) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def format_report(out: dict[str, Any]) -> str:
    """The settings tables and the side-by-side results of a ``run_peer_bench`` result."""
    cfg = out["config"]
    env = out.get("environment", {})
    lines = [f"ulorl-bench peer: ulorl vs TRL {env.get('trl') or '(not installed)'} GRPOTrainer, model {cfg['model']}, "
             f"embedded task, cpu, {cfg['threads']} torch thread(s); torch {env.get('torch')}, transformers "
             f"{env.get('transformers')}",
             f"  {cfg['steps']} steps x {cfg['repeats']} repeat(s), systems interleaved step by step; per-step "
             f"figures over steps {cfg['warmup'] + 1}..{cfg['steps']} of every repeat",
             f"  load average start {out.get('loadavg_start')} end {out.get('loadavg_end')}; niceness "
             f"{out.get('niceness')}; {out.get('wall_s', 0.0) / 60:.1f} min", "",
             "settings made equal:"]
    same = [r for r in out["settings"] if r["equal"] == "yes"]
    differ = [r for r in out["settings"] if r["equal"] != "yes"]
    w = max(len(r["setting"]) for r in out["settings"])
    for r in same:
        lines.append(f"  {r['setting']:<{w}}  ulorl: {r['ulorl']}  |  TRL: {r['trl']}")
    lines += ["", "settings that differ (and what it does to the comparison):"]
    for r in differ:
        lines.append(f"  {r['setting']:<{w}}  ulorl: {r['ulorl']}  |  TRL: {r['trl']}  ->  {r['equal']}")
    lines.append("")
    hdr = (f"{'system':<18} {'s/step':>6} {'rollout':>7} {'update':>6} {'cpu/st':>6} {'cpu ro':>6} {'cpu up':>6} "
           f"{'smp/st':>6} {'smp/s':>6} {'tok/s':>6} {'vs TRL':>6} {'(cpu)':>6} {'vs S=1':>6} {'peak MB':>7} "
           f"{'held-out':>16}")
    lines += [hdr, "-" * len(hdr)]
    for r in out.get("summary", []):
        held = r["heldout"]
        held_txt = "-" if not held else (f"{r['heldout_mean']:.3f}" + (f" ({min(held):.2f}-{max(held):.2f})"
                                                                       if len(held) > 1 else ""))
        lines.append(
            f"{r['system']:<18} {_f(r['step_s_median'], 2):>6} {_f(r['rollout_s_per_step'], 2):>7} "
            f"{_f(r['update_s_per_step'], 2):>6} {_f(r['cpu_s_per_step'], 2):>6} "
            f"{_f(r['rollout_cpu_s_per_step'], 2):>6} {_f(r['update_cpu_s_per_step'], 2):>6} "
            f"{_f(r['samples_per_step'], 1):>6} {_f(r['samples_per_s'], 1):>6} {_f(r['tokens_per_s'], 0):>6} "
            f"{_f(r['vs_trl'], 2):>6} {_f(r['vs_trl_cpu'], 2):>6} {_f(r['vs_s1'], 2):>6} {_f(r['peak_rss_mb'], 0):>7} "
            f"{held_txt:>16}")
    lines.append("")
    lines.append("s/step: median wall seconds per step; rollout, update: mean wall seconds per step (rollout = "
                 "generation + reward); cpu/st, cpu ro, cpu up: the same in process CPU seconds (mean); smp: trained "
                 "samples; tok/s: trained response tokens per wall second; vs TRL, vs S=1: wall seconds per trained "
                 "sample of the reference / of this row (> 1 = faster; (cpu): CPU seconds per trained sample); "
                 "peak MB: peak RSS of the system's process.")
    pads = [r for r in out.get("summary", []) if r.get("padded_per_real_token")]
    if pads:
        lines.append("training forward, padded tokens per real token: " + "; ".join(
            f"{r['system']} {r['padded_per_real_token']:.2f}" + (
                f" (first-fit split: {r['first_fit_padded_per_real_token']:.2f})"
                if r.get("first_fit_padded_per_real_token") else "") for r in pads))
    ini = out.get("initial_eval")
    if ini:
        lines.append(f"held-out avg@{ini['k']} on {ini['problems']} problems before training: {ini['avg_at_k']:.3f} "
                     f"(after: mean over repeats, range in brackets)")
    for e in out.get("errors", []):
        lines.append(f"FAILED {e['system']} (repeat {e['repeat'] + 1}): {e['error'].splitlines()[0]}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- command line


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not vals:
        raise ValueError(f"{flag}: empty list")
    return vals


def build_parser() -> argparse.ArgumentParser:
    d = PeerConfig()
    p = argparse.ArgumentParser(prog="ulorl-bench peer", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=d.steps, help=f"training steps per system and repeat ({d.steps})")
    p.add_argument("--warmup", type=int, default=d.warmup,
                   help=f"first steps left out of the per-step figures ({d.warmup}; >= the largest S)")
    p.add_argument("--repeats", type=int, default=d.repeats, help=f"fresh runs of every system ({d.repeats})")
    p.add_argument("--prompts", type=int, default=d.prompts, help=f"new prompts per step ({d.prompts})")
    p.add_argument("--group", type=int, default=d.group, help=f"responses per prompt, G ({d.group})")
    p.add_argument("--max-len", type=int, default=d.max_len, help=f"global max response length ({d.max_len})")
    p.add_argument("--temperature", type=float, default=d.temperature, help=f"sampling temperature ({d.temperature})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"AdamW learning rate, constant ({d.lr:g})")
    p.add_argument("--eps-low", type=float, default=d.eps_low, help=f"lower clip ({d.eps_low})")
    p.add_argument("--eps-high", type=float, default=d.eps_high, help=f"upper clip ({d.eps_high})")
    p.add_argument("--micro-batch-tokens", type=int, default=d.micro_batch_tokens,
                   help=f"ulorl's training micro-batch token budget ({d.micro_batch_tokens})")
    p.add_argument("--segments", default=",".join(map(str, d.segments)), help="ulorl segment counts S (1,4)")
    p.add_argument("--regimes", default=",".join(d.regimes), help="ulorl batching regimes (static,compact)")
    p.add_argument("--no-trl", action="store_true", help="ulorl systems only (no TRL needed)")
    p.add_argument("--threads", type=int, default=d.threads, help=f"torch threads of every system ({d.threads})")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of repeat 1 (repeat r uses seed + r - 1)")
    p.add_argument("--eval-problems", type=int, default=d.eval_problems, help="held-out problems scored at the end")
    p.add_argument("--eval-k", type=int, default=d.eval_k, help="responses per held-out problem")
    p.add_argument("--model", default=d.model, help="embedded profile: embedded | embedded:<profile>")
    p.add_argument("--workdir", type=Path, default=None, help="run folders, MLflow stores and worker logs "
                   "(default: a new temporary folder)")
    p.add_argument("--out", type=Path, default=None, help="write the JSON object here (after every repeat)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of the tables")
    return p


def config_from_args(args: argparse.Namespace) -> PeerConfig:
    cfg = PeerConfig(
        steps=args.steps, warmup=args.warmup, repeats=args.repeats, prompts=args.prompts, group=args.group,
        max_len=args.max_len, temperature=args.temperature, lr=args.lr, eps_low=args.eps_low, eps_high=args.eps_high,
        micro_batch_tokens=args.micro_batch_tokens, segments=_ints(args.segments, "--segments"),
        regimes=tuple(x.strip() for x in args.regimes.split(",") if x.strip()), trl=not args.no_trl,
        threads=args.threads, seed=args.seed, eval_problems=args.eval_problems, eval_k=args.eval_k, model=args.model)
    cfg.validate()
    return cfg


def _trl_missing() -> Optional[str]:
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        from ulorl.bench.peer_settings import PEER_EXTRA_MESSAGE

        return PEER_EXTRA_MESSAGE
    return None


@json_command
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"ulorl-bench peer: error: {exc}", file=sys.stderr)
        return 2
    from ulorl.out_path import out_file_problem

    problem = out_file_problem(args.out, "--out", "peer.json") if args.out else None
    if problem:   # before the benchmark (minutes): its report must have a place to go
        print(f"ulorl-bench peer: error: {problem}", file=sys.stderr)
        return 2
    missing = _trl_missing() if cfg.trl else None
    if missing:
        print(f"ulorl-bench peer: error: {missing}", file=sys.stderr)
        return 1
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="ulorl-peer-"))).resolve()

    def log(msg: str) -> None:
        print(f"[ulorl-bench peer] {msg}", file=sys.stderr, flush=True)

    def save(partial: dict[str, Any]) -> None:
        if args.out:
            args.out.write_text(json.dumps(partial, indent=1))

    log(f"{len(systems_of(cfg))} systems x {cfg.steps} steps x {cfg.repeats} repeat(s), interleaved; "
        f"TRL {TRL_VERSION if cfg.trl else 'off'}; work folder {workdir}")
    out = run_peer_bench(cfg, workdir=workdir, progress=log, on_repeat=save)
    if args.json:
        emit_json(out)
    else:
        print(format_report(out))
    if args.out:
        log(f"wrote {args.out}")
    return 1 if out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
