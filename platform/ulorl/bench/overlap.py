"""The synchronous and the overlapped schedule side by side, at S = 1 and S = 4, in one process.

    ulorl-bench overlap [experiments/quickstart.yaml] [--steps 12] [--segments 1,4] [--out overlap.json]
        [key.path=value ...]

Each cell of {sync, overlap} x S is a real training run of the experiment (the embedded model and
task by default, the hf engine, evaluation off) driven step by step; the cells run interleaved in
rounds of one step each (sync S=1, overlap S=1, sync S=4, overlap S=4, then again), so load changes on
a shared machine hit every cell alike. Per cell, over the steps after its first S + 1 (the pools' warm-up
and the overlap's pipeline fill): median wall seconds per step, median CPU seconds per step of this
process (all threads of both schedules), trained samples per wall second (``train/samples`` summed /
wall seconds summed), the seconds engine and trainer ran at once (``overlap/both_s``) and the trainer's
idle seconds. Prints the table, overlap / sync and S = 4 / S = 1 ratios from this one run, and the load
average before and after.

The overlapped schedule runs the engine in a second thread of this process (``rollout.schedule``): the
two run at once only as far as torch's kernels release the interpreter lock and the machine has cores
for both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from ulorl.config import load_experiment
from ulorl.tracking import schema
from ulorl.train.trainer import Trainer

SCHEDULES = ("sync", "overlap")
DEFAULT_EXPERIMENT = "experiments/quickstart.yaml"


def _load() -> Optional[list[float]]:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def cell_summary(steps: list[dict[str, float]], warmup: int) -> dict[str, float]:
    """One cell's figures over ``steps[warmup:]`` (each a step's metrics): median wall / CPU s per step,
    trained samples per wall second, mean concurrent and trainer-idle seconds per step."""
    w = steps[warmup:] or steps
    wall = [m["time/step_s"] for m in w]
    trained = sum(m.get("train/samples", 0.0) for m in w)
    return {"steps": float(len(w)), "step_s": statistics.median(wall),
            "cpu_s": statistics.median(m.get(schema.STEP_CPU_METRIC, float("nan")) for m in w),
            "trained_per_s": trained / sum(wall) if sum(wall) > 0 else float("nan"),
            "both_s": statistics.fmean(m.get("overlap/both_s", 0.0) for m in w),
            "trainer_idle_s": statistics.fmean(m.get("overlap/trainer_idle_s", m.get("time/rollout_s", 0.0))
                                               for m in w)}


def run_bench(experiment: str, overrides: list[str], steps: int, segments: tuple[int, ...],
              workdir: Path) -> dict[str, Any]:
    """Run every cell step by step, interleaved; returns per-cell figures and the load before / after."""
    uri = f"sqlite:///{workdir}/mlflow.db"
    trainers: dict[tuple[str, int], Trainer] = {}
    for s in segments:
        for sched in SCHEDULES:
            cfg = load_experiment(experiment, [
                "eval.every=0", "eval.final.k=0", f"train.max_steps={steps}", f"train.checkpoint_every={steps + 1}",
                *overrides, f"rollout.segments={s}", f"rollout.schedule={sched}", f"tracking.uri={uri}",
                f"train.output_dir={workdir}/runs", f"name=overlap-{sched}-s{s}"])
            t = Trainer(cfg, progress=False)
            t.setup()
            trainers[(sched, s)] = t
    load_start, t0 = _load(), time.perf_counter()
    logs: dict[tuple[str, int], list[dict[str, float]]] = {k: [] for k in trainers}
    for _ in range(steps):
        for key, t in trainers.items():
            logs[key].append(t.train_step().metrics)
    for t in trainers.values():
        t.close()
    cells = [{"schedule": sched, "segments": s, **cell_summary(logs[(sched, s)], s + 1)} for sched, s in trainers]
    return {"experiment": experiment, "overrides": overrides, "steps": steps, "cells": cells,
            "loadavg_start": load_start, "loadavg_end": _load(), "wall_s": time.perf_counter() - t0,
            "cpus": os.cpu_count()}


def _x(num: float, den: float) -> str:
    return f"{num / den:.2f}x" if den > 0 and num == num and den == den else "-"


def format_report(res: dict[str, Any]) -> str:
    """The side-by-side table and the ratios of one run."""
    lines = [f"{'schedule':<9}{'S':>3}{'s/step':>9}{'CPU s/step':>12}{'trained/s':>11}{'both s':>9}"
             f"{'trainer idle s':>16}"]
    by = {(c["schedule"], c["segments"]): c for c in res["cells"]}
    for c in res["cells"]:
        lines.append(f"{c['schedule']:<9}{c['segments']:>3}{c['step_s']:>9.3f}{c['cpu_s']:>12.3f}"
                     f"{c['trained_per_s']:>11.2f}{c['both_s']:>9.3f}{c['trainer_idle_s']:>16.3f}")
    segs = sorted({c["segments"] for c in res["cells"]})
    for s in segs:
        a, b = by[("sync", s)], by[("overlap", s)]
        lines.append(f"S={s}: overlap vs sync: time/step {_x(a['step_s'], b['step_s'])}, trained samples/s "
                     f"{_x(b['trained_per_s'], a['trained_per_s'])}, CPU s/step {_x(a['cpu_s'], b['cpu_s'])}")
    if len(segs) > 1:
        lo, hi = segs[0], segs[-1]
        for sched in SCHEDULES:
            a, b = by[(sched, lo)], by[(sched, hi)]
            lines.append(f"{sched}: S={hi} vs S={lo}: time/step {_x(a['step_s'], b['step_s'])}, trained samples/s "
                         f"{_x(b['trained_per_s'], a['trained_per_s'])}, CPU s/step {_x(a['cpu_s'], b['cpu_s'])}")
    lines.append(f"{res['steps']} steps per cell, interleaved; window: the steps after each cell's first S + 1; "
                 f"{res['cpus']} CPUs; load average (1, 5, 15 min) start {res['loadavg_start']} end "
                 f"{res['loadavg_end']}; {res['wall_s']:.0f} s")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="ulorl-bench overlap", description=__doc__.split("\n")[0])
    p.add_argument("args", nargs="*", metavar="[EXPERIMENT.yaml] [key.path=value ...]",
                   help=f"the experiment (default {DEFAULT_EXPERIMENT}) and overrides for every cell")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--segments", default="1,4", help="comma-separated segment counts (default 1,4)")
    p.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    a = p.parse_args(argv)
    segs = tuple(int(x) for x in a.segments.split(",") if x.strip())
    has_exp = bool(a.args) and "=" not in a.args[0]
    experiment, overrides = (a.args[0], a.args[1:]) if has_exp else (DEFAULT_EXPERIMENT, a.args)
    with tempfile.TemporaryDirectory(prefix="ulorl-overlap-") as d:
        res = run_bench(experiment, overrides, a.steps, segs, Path(d))
    print(format_report(res))
    if a.out:
        a.out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
