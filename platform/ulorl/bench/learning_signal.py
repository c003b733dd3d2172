"""Learning signal of an experiment over seeds: does the admission-cohort reward rise, and does the
held-out avg@k end above the base model's?

    ulorl-bench learning-signal                       # experiments/quickstart.yaml, seeds 0-5 (~5-10 min, 2 cores)
    ulorl-bench learning-signal --seeds 0,1,2 --json  # one JSON object on stdout
    ulorl-bench learning-signal experiments/quickstart.yaml train.max_steps=20 --workdir runs/learning_signal

Each seed is one real run (embedded model, HF engine, math-verify, SQLite MLflow) with data order,
rollout sampling and the trainer seeded alike, read back from MLflow: the admission-cohort reward
(free of segment rollout's finish-order bias, ``ulorl.train.cohorts``) averaged over the last 20 %
of the cohorts minus the first 20 %, and the held-out avg@k at the last step. The first seed's run
also evaluates the base model at step 0. With 8 prompts per step a single run's reward windows swing
with the prompts drawn (a cohort's reward tracks its prompts' length), so the verdict is over the
seeds together: the mean cohort rise is above 0 and the mean final held-out avg@k is above the base.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from ulorl.jsonout import emit_json, json_command

DEFAULT_EXPERIMENT = "experiments/quickstart.yaml"
DEFAULT_SEEDS = (0, 1, 2, 3, 4, 5)
HELDOUT_METRIC = "eval/heldout/avg_at_k"


def window_means(points: dict[int, float], frac: float = 0.2) -> tuple[float, float]:
    """Mean of the first and of the last ``frac`` of ``points`` (step -> value), at least one point each."""
    steps = sorted(points)
    w = max(1, round(len(steps) * frac))
    return sum(points[s] for s in steps[:w]) / w, sum(points[s] for s in steps[-w:]) / w


def verdict(rises: Sequence[float], finals: Sequence[float], base: float) -> dict[str, Any]:
    """The claim over seeds: mean cohort-reward rise > 0 and mean final held-out avg@k > ``base``."""
    mean_rise, mean_final = statistics.fmean(rises), statistics.fmean(finals)
    return {"mean_cohort_rise": mean_rise, "mean_final_heldout": mean_final, "base_heldout": base,
            "cohort_reward_rises": mean_rise > 0.0, "heldout_above_base": mean_final > base,
            "signal": mean_rise > 0.0 and mean_final > base}


class Interrupted(RuntimeError):
    """A run stopped on a signal (the trainer checkpointed it); the seeds before it are complete."""


def run_seed(experiment: str, overrides: list[str], seed: int, uri: str, run_dir: Path,
             eval_at_start: bool) -> dict[str, Any]:
    """One seeded run of ``experiment``; its cohort-reward rise and held-out numbers from MLflow."""
    from mlflow.tracking import MlflowClient

    from ulorl.config import load_experiment
    from ulorl.tracking import schema
    from ulorl.train.trainer import Trainer

    cfg = load_experiment(experiment, [*overrides, f"tracking.uri={uri}", f"data.seed={seed}",
                                       f"rollout.seed={seed}", f"train.seed={seed}"])
    t0 = time.perf_counter()
    res = Trainer(cfg, run_dir=run_dir, progress=False, eval_at_start=eval_at_start).run()
    wall = time.perf_counter() - t0
    if res.interrupted:
        raise Interrupted(f"seed {seed}'s run stopped at step {res.steps} on a signal (checkpointed in {run_dir})")
    if res.run_id is None:
        raise RuntimeError(f"{run_dir}: the run logged no MLflow run")
    client = MlflowClient(uri)
    cohort = {m.step: m.value for m in client.get_metric_history(res.run_id, schema.COHORT_REWARD_METRIC)}
    held = {m.step: m.value for m in client.get_metric_history(res.run_id, HELDOUT_METRIC)}
    if not cohort or not held:
        raise RuntimeError(f"run {res.run_id}: no {schema.COHORT_REWARD_METRIC} or {HELDOUT_METRIC} logged "
                           "(eval.every must be > 0 and the run must train past S steps)")
    first, last = window_means(cohort)
    return {"seed": seed, "run_id": res.run_id, "steps": res.steps, "seconds": round(wall, 1),
            "cohorts": len(cohort), "cohort_first_20pct": first, "cohort_last_20pct": last,
            "cohort_rise": last - first, "heldout_base": held.get(0), "heldout_final": held[max(held)]}


def measure(experiment: str, overrides: list[str], seeds: Sequence[int], workdir: Path) -> dict[str, Any]:
    uri = f"sqlite:///{workdir.resolve()}/mlflow.db"
    rows = []
    for i, seed in enumerate(seeds):
        print(f"[learning-signal] seed {seed} ({i + 1}/{len(seeds)})", file=sys.stderr, flush=True)
        rows.append(run_seed(experiment, overrides, seed, uri, workdir / f"seed{seed}", eval_at_start=i == 0))
        r = rows[-1]
        print(f"[learning-signal] seed {seed}: cohort reward {r['cohort_first_20pct']:.3f} -> "
              f"{r['cohort_last_20pct']:.3f}, held-out {r['heldout_final']:.3f} ({r['seconds']:.0f} s)",
              file=sys.stderr, flush=True)
    base = rows[0]["heldout_base"]
    assert base is not None  # the first run evaluates at step 0
    return {"experiment": experiment, "overrides": overrides, "tracking_uri": uri, "runs": rows,
            **verdict([r["cohort_rise"] for r in rows], [r["heldout_final"] for r in rows], base)}


def format_report(res: dict[str, Any]) -> str:
    lines = [f"learning signal of {res['experiment']} {' '.join(res['overrides'])}".rstrip(),
             f"{'seed':>4} {'steps':>5} {'cohort first 20%':>16} {'last 20%':>9} {'rise':>7} {'held-out':>9} {'s':>6}"]
    for r in res["runs"]:
        lines.append(f"{r['seed']:>4} {r['steps']:>5} {r['cohort_first_20pct']:>16.3f} {r['cohort_last_20pct']:>9.3f} "
                     f"{r['cohort_rise']:>+7.3f} {r['heldout_final']:>9.3f} {r['seconds']:>6.0f}")
    lines.append(f"mean cohort rise {res['mean_cohort_rise']:+.3f}; held-out avg@k base {res['base_heldout']:.3f} "
                 f"-> mean final {res['mean_final_heldout']:.3f}")
    lines.append("verdict: " + ("learning signal (cohort reward rises and held-out ends above the base)"
                                if res["signal"] else
                                f"NO learning signal (cohort reward rises: {res['cohort_reward_rises']}, held-out "
                                f"above base: {res['heldout_above_base']})"))
    return "\n".join(lines)


def _seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        seeds = ()
    if not seeds:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ulorl-bench learning-signal", description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", nargs="?", default=DEFAULT_EXPERIMENT,
                    help=f"experiment YAML (default: {DEFAULT_EXPERIMENT}, from the repository root)")
    ap.add_argument("overrides", nargs="*", help="dotted overrides for every seed's run (key.path=value)")
    ap.add_argument("--seeds", type=_seeds, default=DEFAULT_SEEDS,
                    help="comma-separated seeds (default: " + ",".join(map(str, DEFAULT_SEEDS)) + ")")
    ap.add_argument("--workdir", type=Path, help="run folders and the MLflow store (default: a new temp folder)")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of the table")
    return ap


@json_command
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if not Path(args.experiment).is_file():
        print(f"ulorl-bench learning-signal: {args.experiment}: no such experiment file (run from the repository "
              "root, or give the YAML's path)", file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ulorl-learning-signal-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        res = measure(args.experiment, list(args.overrides), args.seeds, workdir)
    except Interrupted as exc:
        print(f"ulorl-bench learning-signal: interrupted: {exc}; the finished seeds' runs are in "
              f"sqlite:///{workdir.resolve()}/mlflow.db", file=sys.stderr)
        return 130
    if args.json:
        emit_json(res)
    else:
        print(format_report(res))
        print(f"runs kept in {workdir} (MLflow: {res['tracking_uri']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
