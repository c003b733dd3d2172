"""``ulorl-tables``: rebuild the paper's Tables 1-3 and Figures 2, 4, 5 from the MLflow store.

    ulorl-tables --tracking-uri sqlite:///$PWD/mlflow.db --out paper_tables/

Writes table{1,2,3}.md / .tex (booktabs) / .csv, fig{2,4,5}.png, cells.csv (every cell -> its
MLflow run ids) and claims.md / claims.json (the paper's claims over seeds: effect a - b, intervals
across seeds and over held-out problems, verdict holds / does not hold / inconclusive / not enough
seeds). Cells without runs read "not run"; the notes under each table name the command that
produces them. Figures draw an arm run on several seeds as faint per-seed curves, their mean and
a min-max band.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from ulorl.jsonout import emit_json, json_command


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ulorl-tables", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tracking-uri", default=None, help="MLflow URI (else $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    p.add_argument("--out", default="paper_tables", help="output folder (created)")
    p.add_argument("--experiment", default=None, help="only runs of this MLflow experiment (default: all)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON summary object on stdout")
    p.add_argument("--table3-at", choices=("samples", "last"), default="samples",
                   help="Table 3's held-out column: 'samples' (default) compares runs at equal trained samples "
                        "(the fewest any run had at its last periodic eval); 'last' takes each run's last point "
                        "(equal step counts)")
    return p


@json_command
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from ulorl.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(args.tracking_uri)
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        if not db.is_file():
            print(f"ulorl-tables: note: {db} does not exist yet; an empty store gives 'not run' everywhere",
                  file=sys.stderr)
    from mlflow.exceptions import MlflowException

    from ulorl.report.claims import write_claims
    from ulorl.report.store import RunStore
    from ulorl.report.tables import build_tables, find_hints, to_markdown, write_all

    print(f"[ulorl-tables] reading {uri}", file=sys.stderr, flush=True)
    try:
        store = RunStore.open(uri, experiment=args.experiment)
    except MlflowException as exc:
        print(f"ulorl-tables: error: cannot read the MLflow store {uri}: {exc.message}", file=sys.stderr)
        return 2
    print(f"[ulorl-tables] {len(store.runs())} runs; writing {args.out}", file=sys.stderr, flush=True)
    hints = find_hints()
    equal_samples = args.table3_at == "samples"
    summary = write_all(store, args.out, hints, equal_samples)
    claims = write_claims(store, args.out)
    summary["files"] += claims["files"]
    summary["claims"] = claims["rows"]
    summary["tracking_uri"] = uri
    if args.json:
        emit_json(summary)
    else:
        for t in build_tables(store, hints, equal_samples):
            print(to_markdown(t))
        for key, f in summary["figures"].items():
            state = "not run" if f["not_run"] else f"{f['runs']} run(s): {', '.join(f['lines'])}"
            print(f"{key}.png: {state}")
        for row in summary["claims"]:
            effect = "" if row["effect"] is None else f", effect {row['effect']:+.4f}"
            print(f"claim {row['claim']} ({row['sweep'] or 'no sweep'}): {row['verdict']} "
                  f"({row['seeds']} seed(s){effect})")
        print(f"\nwrote {len(summary['files'])} files to {summary['out']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
