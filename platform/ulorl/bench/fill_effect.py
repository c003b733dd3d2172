"""What ``algo.dynamic_sampling_fill`` does to time per step and to the learning signal.

    python -m ulorl.bench.fill_effect experiments/quickstart.yaml --seeds 0 1 2 3 --out fill.json

Runs the experiment with fill off and on for each seed, interleaved (off, on, off, on, ...) in one
process so machine load hits both alike, and reads back from MLflow: mean ``time/step_s``, the
fraction of steps without an update, the admission-cohort reward (mean over all cohorts, and last
minus first 20 % of the training steps) and the held-out avg@k at the last step. Prints a table and
writes the per-run numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from ulorl.config import load_experiment
from ulorl.tracking import schema
from ulorl.train.trainer import Trainer


def _history(client: MlflowClient, run_id: str, key: str) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for m in client.get_metric_history(run_id, key):
        out.setdefault(m.step, []).append(m.value)
    return out


def _window_diff(points: dict[int, float], frac: float = 0.2) -> float:
    steps = sorted(points)
    w = max(1, round(len(steps) * frac))
    return sum(points[s] for s in steps[-w:]) / w - sum(points[s] for s in steps[:w]) / w


def run_one(experiment: str, overrides: list[str], uri: str, run_dir: Path) -> dict[str, Any]:
    cfg = load_experiment(experiment, [*overrides, f"tracking.uri={uri}"])
    res = Trainer(cfg, run_dir=run_dir, progress=False).run()
    if res.run_id is None:
        raise RuntimeError(f"{run_dir}: the run logged no MLflow run")
    client = MlflowClient(uri)
    step_s = _history(client, res.run_id, "time/step_s")
    skipped = _history(client, res.run_id, schema.SKIPPED_METRIC)
    rounds = _history(client, res.run_id, "rollout/fill_rounds")
    # several cohorts (one per rollout round) can land on one training step with fill: average them
    cohort = {s: statistics.fmean(v) for s, v in _history(client, res.run_id, schema.COHORT_REWARD_METRIC).items()}
    held = _history(client, res.run_id, "eval/heldout/avg_at_k")
    last = max(held) if held else None
    return {
        "steps": res.steps,
        "step_s_mean": statistics.fmean(v[-1] for v in step_s.values()),
        "skipped_frac": statistics.fmean(v[-1] for v in skipped.values()),
        "fill_rounds_mean": statistics.fmean(v[-1] for v in rounds.values()) if rounds else 1.0,
        "cohort_reward_mean": statistics.fmean(cohort.values()) if cohort else float("nan"),
        "cohort_last_minus_first_20pct": _window_diff(cohort) if cohort else float("nan"),
        "heldout_avg_at_k_final": held[last][-1] if last is not None else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ulorl.bench.fill_effect", description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment")
    ap.add_argument("overrides", nargs="*", help="dotted overrides applied to both arms")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--out", type=Path, help="write per-run numbers here (JSON)")
    ap.add_argument("--workdir", type=Path, help="run folders and the MLflow store (default: a temp dir)")
    args = ap.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="ulorl-fill-"))
    uri = f"sqlite:///{work.resolve()}/mlflow.db"
    rows = []
    for seed in args.seeds:
        for fill in (False, True):
            over = [*args.overrides, f"data.seed={seed}", f"rollout.seed={seed}", f"train.seed={seed}",
                    f"algo.dynamic_sampling_fill={str(fill).lower()}"]
            r = run_one(args.experiment, over, uri, work / f"seed{seed}-fill{int(fill)}")
            rows.append({"seed": seed, "fill": fill, **r})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'fill':>5} {'s/step':>8} {'skipped':>8} {'rounds':>7} {'cohort':>8} {'cohort d':>9} {'held-out':>9}")
    for fill in (False, True):
        sel = [r for r in rows if r["fill"] == fill]

        def avg(k: str, sel: list[dict[str, Any]] = sel) -> float:
            return statistics.fmean(r[k] for r in sel)
        print(f"{str(fill):>5} {avg('step_s_mean'):8.2f} {avg('skipped_frac'):8.3f} {avg('fill_rounds_mean'):7.2f} "
              f"{avg('cohort_reward_mean'):8.3f} {avg('cohort_last_minus_first_20pct'):+9.3f} "
              f"{avg('heldout_avg_at_k_final'):9.3f}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
