"""A finished sweep's summary as text: ``sweep/ranking.csv`` (logged to the parent run) and the
printout at the end of ``ulorl-sweep`` (``print_summary``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from ulorl.sweep.ranking import PRUNED, RANKING_COLUMNS, ROLE_BASELINE


def ranking_csv(rows: Sequence[dict[str, Any]]) -> str:
    df = pd.DataFrame(list(rows))
    first = [c for c in RANKING_COLUMNS if c in df]
    return df[first + [c for c in df.columns if c not in first]].to_csv(index=False)


def _fmt(v: Any, signed: bool = False) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:+.3f}" if signed else f"{v:.3f}"
    return str(v)


def print_summary(summary: dict[str, Any], spec: Any, file: Any = None) -> None:
    """What a researcher reads at the end: where the runs are, then the ranking (one row per trial
    with its held-out interval and paired difference vs the baseline), the best configuration and its
    command, the speedup against S = 1, what the verdict does not cover, and the verdict last."""
    out = file or sys.stdout
    console = Console(file=out, width=None if getattr(out, "isatty", lambda: False)() else 200)
    uri = summary.get("tracking_uri", "")
    console.print(f"parent run: {summary.get('parent_run_id')}  tracking: {uri}  log: "
                  f"{Path(summary.get('sweep_dir', '.')) / 'sweep.log'}", soft_wrap=True, markup=False)
    console.print(f"next: ulorl-dashboard --tracking-uri {uri}   (Sweep, Benchmarks: difference vs baseline, "
                  "Speedup: S vs S = 1)", soft_wrap=True, markup=False)
    console.print(f"      ulorl-tables --tracking-uri {uri} --out tables   (paper tables and figures; "
                  "ranking.csv is in the parent run's artifacts under sweep/)", soft_wrap=True, markup=False)
    rows = summary["ranking"]
    table = Table(title=f"sweep {spec.name}: trials ranked by {spec.metrics[0]} ({spec.modes[0]}), "
                        "held-out avg@k with 95% bootstrap intervals over problems")
    searched = list(spec.space)
    cols = ["#", "run", "role", "status", "heldout [95% CI]", "vs baseline [95% CI, paired]"]
    for c in cols:
        table.add_column(c, no_wrap=True)
    for r in rows:
        ci = f"{_fmt(r['heldout_avg'])} [{_fmt(r['heldout_ci_low'])}, {_fmt(r['heldout_ci_high'])}]"
        diff = ("(baseline)" if r["role"] == ROLE_BASELINE else
                f"{_fmt(r['diff_vs_baseline'], True)} "
                f"[{_fmt(r['diff_ci_low'], True)}, {_fmt(r['diff_ci_high'], True)}]")
        role = r["role"] + (f" seed+{r['seed_offset']}" if r["seed_offset"] else "")
        status = r["status"] + (f" ({r['pruned_reason']}, step {r['pruned_step']})" if r["status"] == PRUNED else "")
        table.add_row(_fmt(r["rank"]), r["run_name"], role, status, ci, diff)
    console.print(table)
    best = summary.get("best")
    if best is not None:
        values = ", ".join([f"variant {best['variant']}"] * bool(best.get("variant"))
                           + [f"{k}={best.get(k)}" for k in searched if k in best])
        console.print(f"best search trial: {best['run_name']} (run {best['run_id']}): {values}", soft_wrap=True)
    if summary.get("command"):
        console.print("re-run the best config:", soft_wrap=True)
        console.print("  " + summary["command"], soft_wrap=True, markup=False, highlight=False)
    for sp in summary.get("speedup") or []:
        console.print(sp["line"], soft_wrap=True, markup=False, highlight=False)
        if sp.get("note"):
            console.print("  " + sp["note"], soft_wrap=True, markup=False, highlight=False)
    if summary.get("not_covered"):
        console.print(summary["not_covered"], soft_wrap=True)
    console.print(summary.get("verdict") or "verdict: -", soft_wrap=True)
    for line in getattr(spec, "epilogue", None) or []:
        console.print(line, soft_wrap=True, markup=False, highlight=False)
