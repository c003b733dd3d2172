"""``ulorl-tables``: rebuild the paper's Tables 1-3 and Figures 2, 4, 5 from the MLflow store.

    ulorl-tables --tracking-uri sqlite:///$PWD/mlflow.db --out paper_tables/
    ulorl-tables --tracking-uri sqlite:///$PWD/mlflow.db --export-results experiments/results
    ulorl-tables --results experiments/results --out paper_tables/ \
        [--docs platform/ulorl/docs/paper_claims.md --docs README.md]
    ulorl-tables --mismatch [--results FILE | --tracking-uri URI] [--sweep NAME] --out paper_tables/

Writes table{1,2,3}.md / .tex (booktabs) / .csv, fig{2,4,5}.png, cells.csv (every cell -> its
MLflow run ids) and claims.md / claims.json (the paper's claims over seeds: effect a - b, intervals
across seeds and over held-out problems at the level each verdict uses, minimum detectable effect,
verdict holds / does not hold / inconclusive / not enough seeds). Cells without runs read "not run";
the notes under each table name the command that produces them. Figures draw an arm run on several
seeds as faint per-seed curves, their mean and a min-max band.

--export-results DIR merges the store's FINISHED sweep runs into DIR/<sweep>.jsonl (what the claims
and figures read; safe to repeat while a sweep runs) and writes nothing else. --results reads those
files instead of a store: claims.md / claims.json and fig{2,4,5}.png (Tables 1-3 need the store);
--docs FILE (repeatable) then rewrites the claims tables between the markers of FILE: the full table
(paper_claims.md) and the README's short one.

--mismatch reports the train / inference mismatch of every run that logged it (from a store or results
files; --sweep keeps one sweep's runs): mismatch.md / mismatch.csv (one row per run: the gap folded over
its updates, the correction's rejected / truncated shares and mean weight, held-out avg@k; each run's gap
by segment index and position bucket) and mismatch_arms.md (the runs of each arm averaged over seeds).
"""

from __future__ import annotations

import argparse
import os
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
    p.add_argument("--export-results", metavar="DIR", default=None,
                   help="merge the store's FINISHED sweep runs into DIR/<sweep>.jsonl and stop (repeatable; "
                        "runs already in the files are replaced, others kept)")
    p.add_argument("--sweep", action="append", default=None,
                   help="with --export-results or --mismatch: only this ulorl.sweep name (repeat for several)")
    p.add_argument("--mismatch", action="store_true",
                   help="report each run's train / inference mismatch (mismatch.md, mismatch.csv, mismatch_arms.md "
                        "in --out) from the store or from --results files, and stop")
    p.add_argument("--results", action="append", default=None, metavar="PATH",
                   help="read results files (a .jsonl or a folder of them; repeat for several) instead of a "
                        "store: claims and figures only")
    p.add_argument("--docs", action="append", default=None, metavar="FILE",
                   help="with --results: rewrite the claims tables between the markers FILE holds (repeatable): "
                        "the full table (claims-table, platform/ulorl/docs/paper_claims.md) and the short one "
                        "(claims-summary, README.md)")
    return p


def _folder_problem(folder: Path) -> Optional[str]:
    """Why ``folder`` cannot be an output folder (None when it is one or can be created): it, or the first
    of its parents that exists, is a file."""
    for p in (folder, *folder.parents):
        if p.exists():
            if p.is_dir():
                return None
            return "is a file" if p == folder else f"is inside {p}, which is a file"
    return None


EXPORT_HINT = "ulorl-tables --tracking-uri URI --export-results DIR"


def _results_problem(paths: list[str]) -> Optional[str]:
    """Why the ``--results`` files cannot be read as results files (None: let the reader go on): a file that
    is not UTF-8 (named, in a folder too), or a file given by name whose first record is not a results
    record (another tool's JSON lines: an entropy map, a bench's rows)."""
    import json

    for given in map(Path, paths):
        files = sorted(given.glob("*.jsonl")) if given.is_dir() else [given] if given.is_file() else []
        for f in files:
            try:
                text = f.read_bytes().decode("utf-8")
            except UnicodeDecodeError as exc:
                return (f"--results {f} is not UTF-8 text (at byte offset {exc.start}); give the results files "
                        f"{EXPORT_HINT} writes")
            if given.is_dir():
                continue          # a folder's other JSON lines are passed over (ulorl.report.results.holds_records)
            for n, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    first = json.loads(line)
                except json.JSONDecodeError:
                    break         # the reader names the line
                if not (isinstance(first, dict) and "format" in first and "run_id" in first):
                    return (f"--results {f} line {n} is not a results record (no format / run_id field): another "
                            f"tool's file? give the results files {EXPORT_HINT} writes")
                break
    return None


def _from_results(args: argparse.Namespace) -> int:
    """``--results``: claims.md / claims.json and the figures from results files alone."""
    from ulorl.report.claims import update_docs, write_claims
    from ulorl.report.figures import build_figures
    from ulorl.report.results import ResultsStore
    from ulorl.report.tables import find_hints

    try:
        problem = _results_problem(args.results)
        if problem:
            raise ValueError(problem)
        source = ResultsStore.open(args.results)
        if not source.runs():
            raise ValueError(f"--results {', '.join(args.results)} holds no runs (an empty file, or a folder "
                             f"without results files); write them with {EXPORT_HINT}")
    except (FileNotFoundError, ValueError) as exc:
        print(f"ulorl-tables: error: {exc}", file=sys.stderr)
        return 2
    if args.mismatch:
        return _mismatch_report(source, args, f"--results {', '.join(args.results)}")
    out = Path(args.out)
    print(f"[ulorl-tables] {len(source.runs())} runs from {', '.join(args.results)}; writing {out}",
          file=sys.stderr, flush=True)
    claims = write_claims(source, out)
    files = list(claims["files"])
    for fig in build_figures(source, find_hints()):
        fig.save(out / f"{fig.key}.png")
        files.append(str(out / f"{fig.key}.png"))
    for docs in map(Path, args.docs or ()):
        try:
            docs.write_text(update_docs(docs.read_text(), claims["results"]))
        except (OSError, ValueError) as exc:
            print(f"ulorl-tables: error: --docs {docs}: {exc}", file=sys.stderr)
            return 2
        files.append(str(docs))
    summary = {"out": str(out.resolve()), "files": files, "claims": claims["rows"], "results": args.results}
    if args.json:
        emit_json(summary)
    else:
        print((out / "claims.md").read_text())
        print(f"wrote {len(files)} files: {', '.join(files)}")
    return 0


@json_command
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")   # one bar per per-problem CSV read
    if args.mismatch and (args.export_results or args.docs):
        print("ulorl-tables: error: --mismatch writes its own report: give it without --export-results / --docs",
              file=sys.stderr)
        return 2
    if args.results and args.export_results:
        print("ulorl-tables: error: --results reads files, --export-results writes them from a store: give one",
              file=sys.stderr)
        return 2
    if args.docs and not args.results:
        print("ulorl-tables: error: --docs needs --results (the docs table comes from the results files)",
              file=sys.stderr)
        return 2
    for flag, folder in (("--out", args.out), ("--export-results", args.export_results)):
        problem = _folder_problem(Path(folder)) if folder is not None else None
        if problem:
            print(f"ulorl-tables: error: {flag} {folder} {problem}; give a folder (created when missing)",
                  file=sys.stderr)
            return 2
    if args.results:
        return _from_results(args)
    from ulorl.cli.checks import tracking_uri_problem, uri_source
    from ulorl.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(args.tracking_uri)
    problem = tracking_uri_problem(uri, uri_source(args.tracking_uri))
    if problem:
        print(f"ulorl-tables: error: {problem}", file=sys.stderr)
        return 2
    if uri.startswith("sqlite:///"):   # reading a store that is not there would create it (and its folder)
        db = Path(uri[len("sqlite:///"):])
        if not db.is_file():
            where = "" if db.parent.is_dir() else f" (the folder {db.parent} does not exist either)"
            print(f"ulorl-tables: error: no MLflow store at {db}{where}; check --tracking-uri (or "
                  "$MLFLOW_TRACKING_URI): ulorl-train and ulorl-sweep write ./mlflow.db by default", file=sys.stderr)
            return 2
    from mlflow.exceptions import MlflowException

    from ulorl.report.claims import write_claims
    from ulorl.report.store import RunStore
    from ulorl.report.tables import build_tables, find_hints, to_markdown, write_all

    if args.export_results:
        from ulorl.report.results import export_results, sqlite_snapshot

        print(f"[ulorl-tables] exporting {uri} (a read-only snapshot of a sqlite store)", file=sys.stderr, flush=True)
        try:
            with sqlite_snapshot(uri) as snap:
                exported = export_results(RunStore.open(snap, experiment=args.experiment), args.export_results,
                                          args.sweep)
        except (MlflowException, FileNotFoundError, ValueError) as exc:
            print(f"ulorl-tables: error: cannot export {uri}: {getattr(exc, 'message', exc)}", file=sys.stderr)
            return 2
        if args.json:
            emit_json({"tracking_uri": uri, "export": exported})
        else:
            for e in exported.values():
                print(f"{e['file']}: {e['runs']} run(s) ({e['added']} added, {e['updated']} updated, "
                      f"{e['kept']} kept from earlier exports){'' if e['written'] else ', unchanged'}")
            if not exported:
                print(f"no FINISHED sweep runs in {uri}: nothing exported")
        return 0
    print(f"[ulorl-tables] reading {uri}", file=sys.stderr, flush=True)
    try:
        store = RunStore.open(uri, experiment=args.experiment)
    except MlflowException as exc:
        print(f"ulorl-tables: error: cannot read the MLflow store {uri}: {exc.message}", file=sys.stderr)
        return 2
    print(f"[ulorl-tables] {len(store.runs())} runs; writing {args.out}", file=sys.stderr, flush=True)
    if args.mismatch:
        return _mismatch_report(store, args, f"the MLflow store {uri}")
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
                  f"({row['seeds']} seed(s){effect}; pre-registered: {row['preregistered']})")
        print(f"\nwrote {len(summary['files'])} files to {summary['out']}")
    return 0


def _mismatch_report(source: object, args: argparse.Namespace, where: str) -> int:
    """``--mismatch``: the per-run mismatch report of ``source`` (a store or results files, ``where`` as the
    user named it). A source without runs, or a ``--sweep`` no run carries, is refused (exit 2) before any
    file is written."""
    from ulorl.report.mismatch import (
        arm_rows,
        arms_markdown,
        overview_rows,
        run_summary,
        split_rows,
        to_csv,
        to_markdown,
    )
    from ulorl.report.store import RunSource
    from ulorl.tracking import schema

    assert isinstance(source, RunSource)
    if not source.runs():
        print(f"ulorl-tables: error: {where} holds no runs; give the store (or results files) your runs were "
              "tracked in", file=sys.stderr)
        return 2
    sweeps = sorted({r.tags[schema.SWEEP_TAG] for r in source.runs() if r.tags.get(schema.SWEEP_TAG)})
    unknown = [s for s in args.sweep or () if s not in sweeps]
    if unknown:
        print(f"ulorl-tables: error: --sweep {', '.join(unknown)}: no run in {where} belongs to "
              f"{'that sweep' if len(unknown) == 1 else 'those sweeps'}; the sweeps it holds: "
              f"{', '.join(sweeps) or 'none (runs outside a sweep: leave --sweep out)'}", file=sys.stderr)
        return 2
    runs = [r for r in source.runs() if r.kind in ("train", "")
            and (not args.sweep or r.tags.get(schema.SWEEP_TAG) in args.sweep)]
    rows = overview_rows(source, runs)
    by_id = {r.run_id: r for r in runs}
    splits = {}
    for row in rows:
        run = by_id[row["run_id"]]
        splits[f"{row['run']} ({row['run_id'][:8]})"] = split_rows(run_summary(source, run),
                                                                  run.int_param("rollout.max_response_len"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = to_markdown(rows, splits)
    arms = arm_rows(rows)
    files = {"mismatch.md": text, "mismatch.csv": to_csv(rows),
             "mismatch_arms.md": "# Train / inference mismatch per arm (mean over seeds)\n\n" + arms_markdown(arms)}
    for name, body in files.items():
        (out / name).write_text(body)
    if args.json:
        emit_json({"out": str(out.resolve()), "files": [str(out / f) for f in files], "runs": rows, "arms": arms})
    else:
        print(text)
        print(files["mismatch_arms.md"])
        print(f"wrote {', '.join(str(out / f) for f in files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
