"""Results files: what the claims and figures read from a sweep's runs, kept small enough to commit,
so verdicts survive the MLflow store they came from.

One JSON Lines file per sweep (``<dir>/<ulorl.sweep tag>.jsonl``), one FINISHED training run per
line (sorted by start time, then run id), written by :func:`export_results` and read back by
:class:`ResultsStore` (the same :class:`~ulorl.report.store.RunSource` interface as the store).
A record holds:

- ``run_id``, ``experiment_id``, ``name``, ``status``, ``start_time``, ``tags`` and ``params``
  (all of them: the arm, the seeds, role, variant, paper_ref, git commit, every config key);
- ``metrics``: the last value of every exported metric;
- ``curves``: per-step histories of :data:`CURVES` and of every ``eval/<bench>/avg_at_k``, the final
  evaluation's ``eval/<bench>_final/avg_at_k`` (``eval.final``, one point) included
  (``{"start": s, "values": [...]}`` for consecutive steps s, s+1, ..., else ``{"steps", "values"}``);
- ``means``: the mean over logged steps of :data:`MEANS` (mask fractions, step and eval seconds);
- ``mismatch``: the train / inference mismatch folded over the run's updates (``ulorl.report.mismatch``:
  every ``mismatch/*`` and ``correction/*`` metric as one number), absent when the run logged none;
- ``provenance``: where and when the run was made (:func:`ulorl.tracking.provenance.row_provenance`):
  commit and whether the tree was dirty, the spec file and its SHA-256, start and end (UTC), CPU,
  host, threads, BLAS and torch; "unknown" where the run's tags do not say (runs tracked before them);
- ``per_problem``: per benchmark, the problem ids once (``prefix`` + ``ids``) and per eval step the
  correct counts out of ``k`` (``{"k": 2, "correct": [...]}``) or, for CSVs without counts, the
  accuracies. A union benchmark (``heldout``) whose parts ``heldout_select`` and
  ``heldout_confirm`` are present is not stored twice: :meth:`ResultsStore.per_problem` joins them.

Exporting merges: records of runs already in the file are replaced by the fresh export, runs the
store no longer holds (an earlier session's) are kept, so a later session's seeds add to the file.
The write is skipped when nothing changed (the export is idempotent, and safe to repeat while a
sweep runs: unfinished runs are not exported).

    ulorl-tables --tracking-uri sqlite:////abs/path/is_mode.db --export-results experiments/results
    ulorl-tables --results experiments/results --out paper_tables      # claims.md, fig{2,4,5}.png
"""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from ulorl.report.mismatch import summarize
from ulorl.report.store import RunInfo, RunSource, RunStore
from ulorl.tracking import schema
from ulorl.tracking.provenance import row_provenance

FORMAT = 1
CURVES: tuple[str, ...] = ("train/entropy", "rollout/reward_mean", "train/samples")
MEANS: tuple[str, ...] = ("train/mpt_frac", "train/masked_frac", "train/mask_active_frac", "time/step_s",
                          "time/eval_s")
LAST: tuple[str, ...] = ("time/wall_s", "train/policy_version", "time/final_eval_s")   # eval.final's seconds
SELECT_SUFFIX, CONFIRM_SUFFIX = "_select", "_confirm"


# ----------------------------------------------------------------------------- encoding (pure)


def encode_curve(steps: Sequence[int], values: Sequence[float]) -> dict[str, Any]:
    """``{"start": 1, "values": [...]}`` when ``steps`` are consecutive, else ``{"steps", "values"}``.
    ``encode_curve([3, 4], [0.5, 0.25]) == {"start": 3, "values": [0.5, 0.25]}``."""
    steps = [int(s) for s in steps]
    vals = [float(v) for v in values]
    if steps and steps == list(range(steps[0], steps[0] + len(steps))):
        return {"start": steps[0], "values": vals}
    return {"steps": steps, "values": vals}


def decode_curve(curve: dict[str, Any]) -> tuple[list[int], list[float]]:
    """Inverse of :func:`encode_curve`."""
    values = [float(v) for v in curve["values"]]
    if "start" in curve:
        return list(range(int(curve["start"]), int(curve["start"]) + len(values))), values
    return [int(s) for s in curve["steps"]], values


def _common_prefix(ids: Sequence[str]) -> str:
    return os.path.commonprefix(list(ids)) if len(ids) > 1 else ""


def encode_per_problem(csv_by_step: dict[int, str]) -> dict[str, Any]:
    """One benchmark's per-problem CSVs (step -> CSV text) as ``{"prefix", "ids", "steps": {step:
    {"k", "correct"} | {"accuracy"}}}``; a step whose problems differ from the first one's carries
    its own ``ids`` (suffixes after ``prefix``)."""
    parsed: dict[int, tuple[list[str], dict[str, Any]]] = {}
    for step, text in sorted(csv_by_step.items()):
        rows = list(csv.DictReader(io.StringIO(text)))
        ids = [str(r["problem_id"]) for r in rows]
        ks = {r.get("k") for r in rows}
        if rows and len(ks) == 1 and all(r.get("num_correct") not in (None, "") for r in rows) \
                and float(next(iter(ks)) or 0) > 0:
            k = float(next(iter(ks)) or 0)
            body: dict[str, Any] = {"k": int(k) if k.is_integer() else k,
                                    "correct": [int(float(r["num_correct"])) for r in rows]}
        else:
            body = {"accuracy": [float(r.get("accuracy") or 0.0) for r in rows]}
        parsed[step] = (ids, body)
    all_ids = [i for ids, _ in parsed.values() for i in ids]
    prefix = _common_prefix(all_ids)
    first = next(iter(parsed.values()))[0] if parsed else []
    steps: dict[str, Any] = {}
    for step, (ids, body) in parsed.items():
        if ids != first:
            body = {**body, "ids": [i[len(prefix):] for i in ids]}
        steps[str(step)] = body
    return {"prefix": prefix, "ids": [i[len(prefix):] for i in first], "steps": steps}


def decode_per_problem(bench: dict[str, Any], step: int) -> dict[str, float]:
    """``problem_id -> accuracy`` of one step of :func:`encode_per_problem`'s output ({} when absent)."""
    body = bench["steps"].get(str(step))
    if body is None:
        return {}
    ids = [bench["prefix"] + i for i in body.get("ids", bench["ids"])]
    if "correct" in body:
        k = float(body["k"])
        return {i: c / k for i, c in zip(ids, body["correct"])}
    return {i: float(a) for i, a in zip(ids, body["accuracy"])}


def merge_records(old: Iterable[dict[str, Any]], new: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records by run id, a ``new`` one replacing an ``old`` one of the same run, sorted by
    (start_time, run_id)."""
    by_id = {r["run_id"]: r for r in old}
    by_id.update({r["run_id"]: r for r in new})
    return sorted(by_id.values(), key=lambda r: (int(r.get("start_time") or 0), r["run_id"]))


def dumps_records(records: Sequence[dict[str, Any]]) -> str:
    """JSON Lines text, keys sorted, no spaces: the same records always give the same bytes."""
    return "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of one results file ([] when it does not exist)."""
    p = Path(path)
    if not p.is_file():
        return []
    out = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p}:{n}: not a JSON record ({exc.msg}); re-export it with "
                             "ulorl-tables --tracking-uri URI --export-results DIR") from None
        if not isinstance(rec, dict) or "run_id" not in rec:
            raise ValueError(f"{p}:{n}: a results record needs a run_id")
        out.append(rec)
    return out


# ----------------------------------------------------------------------------- export from a store


def run_record(store: RunStore, run: RunInfo) -> dict[str, Any]:
    """The results record of one run of ``store`` (see the module docstring)."""
    evals = sorted(k for k in run.metrics if k.startswith("eval/") and k.endswith("/avg_at_k"))
    curves: dict[str, Any] = {}
    for key in list(CURVES) + evals:
        steps, values = store.history(run.run_id, key)
        if values:
            curves[key] = encode_curve(steps, values)
    means = {}
    for key in MEANS:
        _, values = store.history(run.run_id, key)
        if values:
            means[key] = sum(values) / len(values)
    metrics = {k: decode_curve(c)[1][-1] for k, c in curves.items()}
    metrics.update({k: run.metrics[k] for k in LAST if k in run.metrics})
    benches = store.per_problem_benches(run.run_id)
    per_problem = {}
    for bench in benches:
        if bench + SELECT_SUFFIX in benches and bench + CONFIRM_SUFFIX in benches:
            continue   # the union of its two parts (ResultsStore.per_problem joins them)
        csvs = {st: store.per_problem_csv(run.run_id, st, bench) for st in store.per_problem_steps(run.run_id, bench)}
        per_problem[bench] = encode_per_problem(csvs)
    record = {"format": FORMAT, "run_id": run.run_id, "experiment_id": run.experiment_id, "name": run.name,
              "status": run.status, "start_time": run.start_time, "tags": dict(run.tags), "params": dict(run.params),
              "metrics": metrics, "curves": curves, "means": means, "per_problem": per_problem}
    record["provenance"] = row_provenance(run.tags, run.start_time, run.metrics.get("time/wall_s"))
    mismatch = summarize(lambda key: store.history(run.run_id, key), run.metrics)
    if mismatch:
        record["mismatch"] = mismatch
    return record


def exportable(run: RunInfo) -> bool:
    """A FINISHED training run of a sweep (the runs the claims read)."""
    return run.status == "FINISHED" and run.kind in ("train", "") and bool(run.tags.get(schema.SWEEP_TAG))


def results_path(out_dir: str | Path, sweep: str) -> Path:
    return Path(out_dir) / f"{sweep}.jsonl"


def export_results(store: RunStore, out_dir: str | Path, sweeps: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Merge every exportable run of ``store`` (only the ``sweeps`` named, when given) into
    ``out_dir/<sweep>.jsonl``. Returns ``{sweep: {"file", "runs", "added", "updated", "kept",
    "written"}}``: runs in the file after the merge, new ones, re-exported ones that changed, ones
    only the file had, and whether the file was rewritten."""
    out = Path(out_dir)
    by_sweep: dict[str, list[RunInfo]] = {}
    for r in store.runs():
        if exportable(r) and (sweeps is None or r.tags[schema.SWEEP_TAG] in sweeps):
            by_sweep.setdefault(r.tags[schema.SWEEP_TAG], []).append(r)
    summary: dict[str, Any] = {}
    for sweep, runs in sorted(by_sweep.items()):
        path = results_path(out, sweep)
        old = read_records(path)
        old_by_id = {r["run_id"]: r for r in old}
        new = [run_record(store, r) for r in runs]
        merged = merge_records(old, new)
        text = dumps_records(merged)
        written = not path.is_file() or path.read_text() != text
        if written:
            out.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text(text)
            tmp.replace(path)
        new_ids = {r["run_id"] for r in new}
        summary[sweep] = {
            "file": str(path), "runs": len(merged), "added": len(new_ids - set(old_by_id)),
            "updated": sum(1 for r in new if r["run_id"] in old_by_id and old_by_id[r["run_id"]] != r),
            "kept": len(set(old_by_id) - new_ids), "written": written,
        }
    return summary


@contextmanager
def sqlite_snapshot(uri: str) -> Iterator[str]:
    """A ``sqlite:`` tracking URI as a read-only consistent copy in a temporary folder (SQLite's
    online backup, read-only source connection), so exporting never holds a lock a running sweep's
    writer waits on; other URIs are yielded as they are. Artifacts stay where the runs point."""
    if not uri.startswith("sqlite:///"):
        yield uri
        return
    db = Path(uri[len("sqlite:///"):])
    if not db.is_file():
        raise FileNotFoundError(f"no MLflow store at {db}")
    with tempfile.TemporaryDirectory(prefix="ulorl-export-") as tmp:
        copy = Path(tmp) / db.name
        src = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        dst = sqlite3.connect(copy)
        try:
            src.backup(dst)
        finally:
            dst.close()
            src.close()
        yield f"sqlite:///{copy}"


# ----------------------------------------------------------------------------- reading the files


def holds_records(path: Path) -> bool:
    """Whether the JSON Lines file ``path`` is a results file: empty, or its first record carries the
    results ``format`` (a bench's own JSON lines beside them in a folder are not runs)."""
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                first = json.loads(line)
            except json.JSONDecodeError:
                return True          # read_records names the bad line
            return isinstance(first, dict) and "format" in first
    return True


def results_files(paths: Sequence[str | Path]) -> list[Path]:
    """The ``*.jsonl`` files named by ``paths`` (a folder: every ``*.jsonl`` in it that holds results
    records, sorted; see :func:`holds_records`)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += [f for f in sorted(p.glob("*.jsonl")) if holds_records(f)]
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"results file or folder not found: {p} (write it with "
                                    "ulorl-tables --tracking-uri URI --export-results DIR)")
    return out


class ResultsStore(RunSource):
    """The runs of results files, read through the reports' :class:`RunSource` interface."""

    def __init__(self, records: Sequence[dict[str, Any]]) -> None:
        self._records = {r["run_id"]: r for r in records}
        super().__init__([RunInfo(run_id=r["run_id"], experiment_id=str(r.get("experiment_id", "")),
                                  name=r.get("name") or r["run_id"][:8], status=r.get("status", ""),
                                  start_time=int(r.get("start_time") or 0), tags=dict(r.get("tags", {})),
                                  params=dict(r.get("params", {})), metrics=dict(r.get("metrics", {})))
                          for r in self._records.values()])

    @classmethod
    def open(cls, paths: str | Path | Sequence[str | Path]) -> ResultsStore:
        """Every record of the files (or folders of ``*.jsonl``) ``paths``; a run in several files:
        the one read last wins."""
        seq = [paths] if isinstance(paths, (str, Path)) else list(paths)
        records: list[dict[str, Any]] = []
        for f in results_files(seq):
            records = merge_records(records, read_records(f))
        return cls(records)

    def history(self, run_id: str, key: str) -> tuple[list[int], list[float]]:
        curve = self._records.get(run_id, {}).get("curves", {}).get(key)
        return decode_curve(curve) if curve else ([], [])

    def means(self, run_id: str) -> dict[str, float]:
        """The record's per-step means (:data:`MEANS`)."""
        return dict(self._records.get(run_id, {}).get("means", {}))

    def provenance(self, run_id: str) -> dict[str, str]:
        """The record's provenance ({} for a record exported before it was recorded)."""
        return dict(self._records.get(run_id, {}).get("provenance", {}))

    def mismatch_summary(self, run_id: str) -> dict[str, Any]:
        """The record's folded train / inference mismatch ({} when the run logged none)."""
        return dict(self._records.get(run_id, {}).get("mismatch", {}))

    def _benches(self, run_id: str) -> dict[str, Any]:
        return dict(self._records.get(run_id, {}).get("per_problem", {}))

    def per_problem_benches(self, run_id: str) -> list[str]:
        stored = self._benches(run_id)
        unions = {b[: -len(SELECT_SUFFIX)] for b in stored if b.endswith(SELECT_SUFFIX)
                  and b[: -len(SELECT_SUFFIX)] + CONFIRM_SUFFIX in stored}
        return sorted(set(stored) | unions)

    def per_problem_steps(self, run_id: str, bench: str = "heldout") -> list[int]:
        stored = self._benches(run_id)
        if bench in stored:
            return sorted(int(s) for s in stored[bench]["steps"])
        parts = [stored.get(bench + SELECT_SUFFIX), stored.get(bench + CONFIRM_SUFFIX)]
        if parts[0] is None or parts[1] is None:
            return []
        return sorted(set(int(s) for s in parts[0]["steps"]) & set(int(s) for s in parts[1]["steps"]))

    def per_problem(self, run_id: str, step: Optional[int] = None, bench: str = "heldout") -> dict[str, float]:
        step = self._eval_step(run_id, step, bench)
        if step is None:
            return {}
        stored = self._benches(run_id)
        if bench in stored:
            return decode_per_problem(stored[bench], step)
        return {**decode_per_problem(stored[bench + SELECT_SUFFIX], step),
                **decode_per_problem(stored[bench + CONFIRM_SUFFIX], step)}


__all__ = ["CURVES", "MEANS", "ResultsStore", "decode_curve", "decode_per_problem", "dumps_records", "encode_curve",
           "encode_per_problem", "export_results", "holds_records", "merge_records", "read_records", "results_files",
           "run_record"]
