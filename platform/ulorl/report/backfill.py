"""Provenance for results rows written before runs recorded it (``python -m ulorl.report.backfill DIR``).

Every row of ``DIR/*.jsonl`` without a ``provenance`` gets one, derived from what the row and git show
and "unknown" for the rest:

- a results record (``ulorl.report.results``): :func:`ulorl.tracking.provenance.row_provenance` of its
  tags, start time and ``time/wall_s`` (commit and machine from its tags, the start from MLflow's,
  the end as start + wall seconds; whether the tree was dirty and the spec's hash are unknown);
- an entropy-map row (``ulorl.bench.entropy_map``): none of the run's tags were kept, so everything is
  unknown except ``first_committed``: the commit that first added the row to the file and its time
  (the run ended before it).

Rows that have a ``provenance`` are left as they are, and rerunning it changes nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any, Optional

from ulorl.report.results import dumps_records, read_records
from ulorl.tracking.provenance import UNKNOWN, iso_utc, row_provenance


def _git(repo: Path, *args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def first_commits(path: Path) -> dict[str, tuple[str, int]]:
    """run_id -> (commit, committer time in ms) of the oldest commit whose version of ``path`` holds it."""
    repo = path.resolve().parent
    top = (_git(repo, "rev-parse", "--show-toplevel") or "").strip()
    if not top:
        return {}
    rel = path.resolve().relative_to(Path(top).resolve()).as_posix()
    out: dict[str, tuple[str, int]] = {}
    for line in (_git(Path(top), "log", "--reverse", "--format=%H %ct", "--", rel) or "").splitlines():
        sha, ct = line.split()
        for row in (_git(Path(top), "show", f"{sha}:{rel}") or "").splitlines():
            if row.strip():
                run_id = json.loads(row).get("run_id")
                if run_id and run_id not in out:
                    out[run_id] = (sha, int(ct) * 1000)
    return out


def backfilled(row: dict[str, Any], committed: Optional[tuple[str, int]]) -> dict[str, Any]:
    """``row`` with a derived ``provenance`` (unchanged when it has one)."""
    if "provenance" in row:
        return row
    if "format" in row:
        prov = row_provenance(dict(row.get("tags", {})), row.get("start_time"),
                              dict(row.get("metrics", {})).get("time/wall_s"))
    else:
        prov = row_provenance({})
    prov["first_committed"] = f"{committed[0]} {iso_utc(committed[1])}" if committed else UNKNOWN
    return {**row, "provenance": prov}


def backfill_file(path: Path) -> int:
    """Backfill one file in place; the rows changed."""
    rows = read_records(path)
    if not rows or all("provenance" in r for r in rows):
        return 0
    committed = first_commits(path)
    new = [backfilled(r, committed.get(r["run_id"])) for r in rows]
    if "format" in rows[0]:
        text = dumps_records(new)
    else:  # the entropy map writes its rows in run order, keys as they come
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in new)
    path.write_text(text)
    return sum(a != b for a, b in zip(rows, new))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ulorl.report.backfill", description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a results folder, e.g. experiments/results")
    args = ap.parse_args(argv)
    for f in sorted(args.folder.glob("*.jsonl")):
        print(f"{f}: {backfill_file(f)} row(s) given a provenance")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
