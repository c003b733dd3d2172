"""The paper's Tables 1-3 rebuilt from the MLflow store, with the paper's numbers beside ours.

Every cell remembers the MLflow run ids it was computed from (``cells.csv``). A cell with no run
behind it says ``not run`` and the table's notes name the command that produces its runs; no
number is ever filled in from anything but a tracked run or the paper (``ulorl.report.paper``).

    store = RunStore.open(uri)
    summary = write_all(store, "out/")   # table{1,2,3}.{md,tex,csv}, fig{2,4,5}.png, cells.csv
"""

from __future__ import annotations

import csv
import io
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ulorl.report import paper, speed
from ulorl.report.store import RunInfo, RunSource
from ulorl.tracking import schema

NOT_RUN = "not run"
NA = "n/a"
DASH = "—"

BATCHING_REGIMES = ("static", "compact")  # rollout.batching values of the config

# Commands that produce each table's / figure's runs, used when the repo's sweeps/ and
# experiments/ folders do not name a file for it (see ``find_hints``).
DEFAULT_HINTS: dict[str, str] = {
    "table1": "ulorl-sweep sweeps/segments.yaml",
    "table2": "ulorl-eval --benchmark aime2025 --k 32 --model <path|runs:/<run_id>/checkpoints/final> "
              "--label <row name>",
    "table3": "ulorl-sweep sweeps/output_length.yaml",
    "fig2": "ulorl-sweep sweeps/is_mode.yaml",
    "fig4": "ulorl-sweep sweeps/mpt_mode.yaml",
    "fig5": "ulorl-sweep sweeps/mpt_threshold.yaml",
}


# ----------------------------------------------------------------------------- table model


@dataclass(frozen=True)
class Cell:
    """One table cell: display text, the number behind it (if any) and its MLflow run ids."""

    text: str
    value: Optional[float] = None
    run_ids: tuple[str, ...] = ()
    note: str = ""
    mode: str = ""                # reward extraction mode of the runs behind a score ("" = none)


def label(text: Any) -> Cell:
    return Cell(str(text))


@dataclass
class Table:
    key: str                      # "table1"
    title: str
    columns: list[str]
    rows: list[list[Cell]]
    n_label_cols: int = 1         # leading columns that name the row
    notes: list[str] = field(default_factory=list)

    def row_label(self, row: list[Cell]) -> str:
        return " / ".join(c.text for c in row[: self.n_label_cols])

    def not_run_count(self) -> int:
        return sum(1 for row in self.rows for c in row if c.text == NOT_RUN)


def _fmt(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


def _pct(x: float) -> str:
    return _fmt(100.0 * x, 1)


# ----------------------------------------------------------------------------- hints


def _repo_roots() -> list[Path]:
    here = Path(__file__).resolve()
    roots = [Path.cwd()]
    if len(here.parents) > 3:
        roots.append(here.parents[3])  # <repo>/platform/ulorl/report/tables.py
    return roots


_PAPER_REF_RE = re.compile(r"paper_ref\W{1,6}(table[123]|fig[245])\b")


def find_hints(roots: Optional[list[Path]] = None) -> dict[str, str]:
    """Command hint per table/figure: a sweep (or experiment) YAML of the repo tagging that
    ``paper_ref`` if one exists, else ``DEFAULT_HINTS``."""
    hints = dict(DEFAULT_HINTS)
    found: dict[str, str] = {}
    for root in roots or _repo_roots():
        exp_refs: dict[str, str] = {}
        for p in sorted((root / "experiments").glob("*.yaml")) if (root / "experiments").is_dir() else []:
            m = _PAPER_REF_RE.search(p.read_text(errors="replace"))
            if m:
                exp_refs[p.name] = m.group(1)
                found.setdefault(f"exp:{m.group(1)}", f"ulorl-train experiments/{p.name}")
        for p in sorted((root / "sweeps").glob("*.yaml")) if (root / "sweeps").is_dir() else []:
            text = p.read_text(errors="replace")
            refs = set(_PAPER_REF_RE.findall(text))
            refs |= {ref for name, ref in exp_refs.items() if name in text}
            paper_scale = root / "sweeps" / "paper" / p.name
            cmd = f"ulorl-sweep sweeps/{p.name}" + (f" (paper scale: sweeps/paper/{p.name})"
                                                    if paper_scale.is_file() else "")
            for ref in sorted(refs):
                found.setdefault(ref, cmd)
        if found:
            break
    for ref in ("table1", "table3", "fig2", "fig4", "fig5"):
        if ref in found:
            hints[ref] = found[ref]
        elif f"exp:{ref}" in found:
            hints[ref] = found[f"exp:{ref}"]
    return hints


# ----------------------------------------------------------------------------- Table 1


def simulator_table1(segments: list[int]) -> Optional[dict[int, tuple[float, bool]]]:
    """Paper-scale seconds/step per segment count from the rollout simulator's ``run_paper`` (the
    static regime, flat per-iteration cost fitted exactly to the paper's S = 1 and S = 2 times):
    ``{S: (seconds, fitted)}`` where ``fitted`` marks the two calibration points. None when the
    simulator is not available."""
    from ulorl.sim.studies import run_paper

    try:
        res = run_paper(paper.table1_by_segments(), segments=tuple(segments))
    except Exception:  # noqa: BLE001 -- a simulator failure must not break the tables
        return None
    return {int(r["segments"]): (float(r["predicted_step_s"]), bool(r.get("fitted_on"))) for r in res["rows"]}


def steady_stats(store: RunSource, run: RunInfo, segments: int) -> Optional[dict[str, float]]:
    """Median step time and trained samples per second over the steady window
    (:func:`ulorl.report.speed.run_speed`: steps after the first S, evaluation time left out);
    None when the run has no step in it."""
    hist = {key: dict(zip(*store.history(run.run_id, key))) for key in speed.SPEED_METRICS}
    stats = speed.run_speed(hist[speed.STEP_TIME], segments, trained=hist[speed.TRAINED], eval_s=hist[speed.EVAL_TIME])
    if stats is None:
        return None
    return {"median_step_s": stats.median_step_s, "steps": float(stats.steps), "trained_per_s": stats.trained_per_s}


def build_table1(
    store: RunSource,
    hints: dict[str, str],
    simulator: Callable[[list[int]], Optional[dict[int, tuple[float, bool]]]] = simulator_table1,
) -> Table:
    """Median ``time/step_s`` and trained samples/s per (segments, batching) from training runs
    tagged table1, over each run's steady window (:mod:`ulorl.report.speed`: steps after the first S).

    A cell with several runs (seeds) shows the median of the per-run values. Speedup =
    time(S=1) / time(S) within the same batching regime.
    """
    hints = {**DEFAULT_HINTS, **hints}
    runs = [r for r in store.runs(paper_ref="table1") if r.kind in ("train", "")]
    measured: dict[tuple[int, str], list[tuple[str, float]]] = {}
    trained: dict[tuple[int, str], list[float]] = {}
    lens: set[str] = set()
    no_time: list[str] = []
    for r in runs:
        s = r.int_param("rollout.segments")
        if s is None:
            no_time.append(f"{r.name} ({r.run_id}): no rollout.segments param")
            continue
        if not store.history(r.run_id, "time/step_s")[0]:
            no_time.append(f"{r.name} ({r.run_id}): no time/step_s points")
            continue
        stats = steady_stats(store, r, s)
        if stats is None:
            no_time.append(f"{r.name} ({r.run_id}): no step after the first S={s} (warm-up) steps; run more steps")
            continue
        measured.setdefault((s, r.param("rollout.batching", "?")), []).append((r.run_id, stats["median_step_s"]))
        trained.setdefault((s, r.param("rollout.batching", "?")), []).append(stats["trained_per_s"])
        lens.add(r.param("rollout.max_response_len", "?"))
    seg_values = sorted({row.segments for row in paper.TABLE1} | {s for s, _ in measured})
    batchings = list(BATCHING_REGIMES) + sorted({b for _, b in measured} - set(BATCHING_REGIMES))
    ref = paper.table1_by_segments()
    sim = simulator(seg_values)
    sim_base = sim[1][0] if sim and 1 in sim else None

    def time_of(key: tuple[int, str]) -> Optional[tuple[float, tuple[str, ...]]]:
        pts = measured.get(key)
        if not pts:
            return None
        return statistics.median(v for _, v in pts), tuple(rid for rid, _ in pts)

    rows: list[list[Cell]] = []
    for s in seg_values:
        for b in batchings:
            t = time_of((s, b))
            base = time_of((1, b))
            if t is None:
                t_cell = sp_cell = tr_cell = Cell(NOT_RUN)
                n_cell = Cell("0")
            else:
                t_cell = Cell(_fmt(t[0], 3), t[0], t[1], note=f"median over {len(t[1])} run(s) of per-run median "
                              f"time/step_s over the steady window (steps > S={s})")
                tr = statistics.median(trained[(s, b)])
                tr_cell = Cell(_fmt(tr, 3), tr, t[1], note="train/samples / time/step_s summed over steps > S")
                n_cell = Cell(str(len(t[1])), float(len(t[1])), t[1])
                if base is None:
                    sp_cell = Cell(f"{NA} (no S=1 run)", None, t[1])
                else:
                    sp = base[0] / t[0]
                    sp_cell = Cell(f"{sp:.2f}x", sp, tuple(dict.fromkeys(base[1] + t[1])),
                                   note="time(S=1)/time(S), same batching")
            p = ref.get(s)
            p_time = Cell(_fmt(p.time_per_step_s, 0), p.time_per_step_s, note="paper") if p else Cell(DASH)
            p_sp = Cell(f"{p.speedup:.2f}x", p.speedup, note="paper") if p else Cell(DASH)
            if sim and s in sim:
                v, fitted = sim[s]
                src = "ulorl.sim.simulator (run_paper)" + (
                    " (calibration point: equals the paper by construction)" if fitted else " (prediction)")
                tag = " (fit)" if fitted else ""
                sim_t = Cell(_fmt(v, 0) + tag, v, note=src)
                sim_sp = Cell(f"{sim_base / v:.2f}x{tag}", sim_base / v, note=src) if sim_base else Cell(NA)
            else:
                sim_t = sim_sp = Cell(NA, note="no simulator prediction available")
            rows.append([label(s), label(b), t_cell, tr_cell, sp_cell, n_cell, p_time, p_sp, sim_t, sim_sp])
    notes = [
        "Ours: steady window = the steps after the first S of each run (with S segments the pools fill, and the "
        "samples trained per step settle, only after S steps); median time/step_s (less time/eval_s) and trained "
        "samples/s (train/samples / step time, summed) over that window of each training run tagged "
        "ulorl.paper_ref=table1"
        + (f" (rollout.max_response_len={', '.join(sorted(lens))})" if lens else "")
        + "; speedup = time(S=1)/time(S) within a batching regime.",
        f"Paper: {paper.TABLE1_SETTING['model']}, 64k outputs (Table 1). Sim.: ulorl.sim.simulator at paper scale "
        "(128 prompts x 8, 64k, static batching, flat per-iteration cost fitted to the paper's S=1 and S=2 times, "
        "marked '(fit)'; other rows are predictions).",
    ]
    if not measured:
        notes.append(f"not run: produce training runs tagged ulorl.paper_ref=table1 with {hints['table1']}")
    elif any(c.text == NOT_RUN for row in rows for c in row):
        notes.append(f"cells marked '{NOT_RUN}' have no run; produce them with {hints['table1']}")
    notes += [f"skipped run {m}" for m in no_time]
    return Table(
        "table1",
        "Table 1: segment count vs. time per step",
        ["Segments", "Batching", "Time/step (s)", "Trained samples/s", "Speedup", "Runs", "Paper time/step (s)",
         "Paper speedup",
         "Sim. paper-scale (s)", "Sim. speedup"],
        rows,
        n_label_cols=2,
        notes=notes,
    )


# ----------------------------------------------------------------------------- Table 2


def eval_label(run: RunInfo, store: Optional[RunSource] = None) -> str:
    """Row name of an eval run: ``ulorl.model_label`` tag, else ``ulorl.model``, else run name."""
    return run.tags.get(schema.MODEL_LABEL_TAG) or run.tags.get(schema.MODEL_TAG) or run.name


def _eval_score(run: RunInfo) -> Optional[tuple[str, float]]:
    bench = run.tags.get(schema.BENCHMARK_TAG, "")
    v = run.metrics.get(schema.eval_metric(bench, "avg_at_k")) if bench else None
    return (bench, v) if v is not None else None


def _bench_columns(extra: set[str]) -> list[tuple[str, str]]:
    cols = list(paper.BENCHMARKS)
    known = {b for b, _ in cols}
    if "heldout" in extra:
        cols.append(("heldout", "Held-out"))
        known.add("heldout")
    cols += [(b, b) for b in sorted(extra - known)]
    return cols


def extraction_mode(run: RunInfo) -> str:
    """Reward extraction mode of a run: tag, else param, else ``boxed`` (runs older than the mode)."""
    return run.tags.get(schema.EXTRACTION_TAG) or run.param(schema.EXTRACTION_PARAM) or "boxed"


def one_mode_per_column(rows: list[list[Cell]], cols: range) -> dict[int, str]:
    """Keep each column to one extraction mode: the most common mode of its scored cells (ties:
    alphabetical); cells of another mode become ``n/a`` with a note. Returns {column: mode}."""
    modes: dict[int, str] = {}
    for j in cols:
        counts: dict[str, int] = {}
        for row in rows:
            if row[j].mode:
                counts[row[j].mode] = counts.get(row[j].mode, 0) + 1
        if not counts:
            continue
        modes[j] = min(counts, key=lambda m: (-counts[m], m))
        for row in rows:
            c = row[j]
            if c.mode and c.mode != modes[j]:
                row[j] = Cell(NA, None, c.run_ids, note=f"scored with reward.extraction={c.mode}, the column with "
                              f"{modes[j]}: not comparable ({c.text})")
    return modes


def _score_cell(run: RunInfo, bench: str) -> Cell:
    v = run.metrics[schema.eval_metric(bench, "avg_at_k")]
    lo = run.metrics.get(schema.eval_metric(bench, "ci_low"))
    hi = run.metrics.get(schema.eval_metric(bench, "ci_high"))
    k = run.tags.get("ulorl.k", "?")
    ci = f", 95% CI [{_pct(lo)}, {_pct(hi)}]" if lo is not None and hi is not None else ""
    mode = extraction_mode(run)
    return Cell(_pct(v), 100.0 * v, (run.run_id,), note=f"avg@{k} x100{ci}, extraction {mode}", mode=mode)


def _count_cell(ids: tuple[str, ...]) -> Cell:
    return Cell(str(len(ids)), float(len(ids)), ids) if ids else Cell("0")


def _avg_cell(cells: list[Cell]) -> Cell:
    if any(c.value is None for c in cells):
        return Cell(NOT_RUN)
    if len({c.mode for c in cells}) > 1:  # never average across extraction modes
        return Cell(NA, note="benchmarks scored with different reward.extraction modes")
    v = sum(c.value for c in cells) / len(cells)  # type: ignore[misc]
    ids = tuple(dict.fromkeys(rid for c in cells for rid in c.run_ids))
    return Cell(_fmt(v, 1), v, ids, note="mean of AIME-2025 and BeyondAIME", mode=cells[0].mode)


def build_table2(store: RunSource, hints: dict[str, str]) -> Table:
    """avg@k (x100) per model row and benchmark from eval runs; the latest run of a (row,
    benchmark) pair wins. AVG = mean of AIME-2025 and BeyondAIME (as in the paper)."""
    hints = {**DEFAULT_HINTS, **hints}
    runs = [r for r in store.runs(kind="eval") if _eval_score(r) is not None]
    latest: dict[tuple[str, str], RunInfo] = {}
    counts: dict[tuple[str, str], int] = {}
    order: list[str] = []
    for r in runs:  # oldest first: later runs overwrite
        lab = eval_label(r)
        bench = r.tags[schema.BENCHMARK_TAG]
        latest[(lab, bench)] = r
        counts[(lab, bench)] = counts.get((lab, bench), 0) + 1
        if lab not in order:
            order.append(lab)
    cols = _bench_columns({b for _, b in latest})
    header = ["Model", "Source"] + [h for _, h in cols[:2]] + ["AVG"] + [h for _, h in cols[2:]] + ["k"]
    rows: list[list[Cell]] = []
    for lab in order or ["ours"]:
        cells = []
        ks = set()
        for b, _ in cols:
            hit = latest.get((lab, b))
            if hit is None:
                cells.append(Cell(NOT_RUN))
            else:
                c = _score_cell(hit, b)
                if counts[(lab, b)] > 1:
                    c = Cell(c.text, c.value, c.run_ids, note=c.note + f"; latest of {counts[(lab, b)]} runs",
                             mode=c.mode)
                cells.append(c)
                ks.add(hit.tags.get("ulorl.k", "?"))
        rows.append([label(lab), label("ours")] + cells[:2] + [Cell(NOT_RUN)] + cells[2:]
                    + [label("/".join(sorted(ks)) or DASH)])
    modes = one_mode_per_column(rows, range(2, 3 + len(cols)))
    for row in rows:
        row[4] = _avg_cell(row[2:4])
    for p in paper.TABLE2:
        rows.append(
            [label(p.model), label("paper"), Cell(_fmt(p.aime2025, 1), p.aime2025, note="paper"),
             Cell(_fmt(p.beyondaime, 1), p.beyondaime, note="paper"), Cell(_fmt(p.avg, 1), p.avg, note="paper")]
            + [Cell(DASH) for _ in cols[2:]] + [label(paper.EVAL_K)]
        )
    notes = [
        "Ours: avg@k x100 from eval runs (ulorl.kind=eval); row = ulorl.model_label tag, else ulorl.model; "
        "the latest eval run of a (row, benchmark) pair is shown. Paper: avg@32 (Table 2).",
    ]
    if modes:
        notes.append("reward extraction per column (one mode per column; other modes shown as n/a): "
                     + ", ".join(f"{header[j]}={m}" for j, m in sorted(modes.items())))
    if not latest:
        notes.append(f"not run: produce eval runs with {hints['table2']}")
    elif any(c.text == NOT_RUN for row in rows for c in row):
        notes.append(f"cells marked '{NOT_RUN}' have no eval run; produce them with {hints['table2']}")
    return Table("table2", "Table 2: benchmark scores (avg@k, %)", header, rows, n_label_cols=2, notes=notes)


# ----------------------------------------------------------------------------- Table 3


def cumulative_samples(steps: Sequence[int], samples: Sequence[float]) -> dict[int, float]:
    """Trained samples up to and including each logged step: ``{step: sum of train/samples for steps <= step}``."""
    out: dict[int, float] = {}
    total = 0.0
    for step, n in sorted(dict(zip(steps, samples)).items()):
        total += n
        out[step] = total
    return out


def samples_at(cum: dict[int, float], step: int) -> float:
    """Trained samples after ``step`` (0 before the first logged step)."""
    done = [v for s, v in cum.items() if s <= step]
    return max(done) if done else 0.0


def point_at_budget(eval_steps: Sequence[int], eval_values: Sequence[float], cum: dict[int, float],
                    budget: float) -> Optional[tuple[int, float]]:
    """The latest periodic eval point ``(step, value)`` whose trained samples are <= ``budget``; None if
    even the first eval point came after the budget was spent."""
    inside = [(s, v) for s, v in zip(eval_steps, eval_values) if samples_at(cum, s) <= budget + 1e-9]
    return max(inside) if inside else None


def sample_budget(store: RunSource, runs: Sequence[RunInfo]) -> Optional[float]:
    """Equal-samples budget of Table 3: the fewest trained samples any run had at its last periodic
    held-out eval (so every run has a point at or before it); None when no run logs both."""
    key = schema.eval_metric("heldout", "avg_at_k")
    totals = []
    for r in runs:
        eval_steps, _ = store.history(r.run_id, key) if key in r.metrics else ([], [])
        if eval_steps and "train/samples" in r.metrics:
            totals.append(samples_at(cumulative_samples(*store.history(r.run_id, "train/samples")), max(eval_steps)))
    return min(totals) if totals else None


def _train_score(store: RunSource, run: RunInfo, bench: str, budget: Optional[float] = None) -> Optional[Cell]:
    """Score of a training run on ``bench``. Held-out with a ``budget``: the last periodic
    ``eval/heldout/avg_at_k`` point within ``budget`` trained samples (equal-samples comparison).
    Otherwise: its latest nested eval run on that benchmark (a final checkpoint, at the run's own
    budget), else (held-out only) the last periodic point logged in the run itself."""
    key = schema.eval_metric(bench, "avg_at_k")
    steps, values = store.history(run.run_id, key) if key in run.metrics else ([], [])
    if budget is not None and values and "train/samples" in run.metrics:
        cum = cumulative_samples(*store.history(run.run_id, "train/samples"))
        hit = point_at_budget(steps, values, cum, budget)
        if hit is None:
            return Cell(NA, None, (run.run_id,), note=f"first periodic eval after the budget of {budget:.0f} trained "
                        "samples: not comparable at equal samples", mode=extraction_mode(run))
        return Cell(_pct(hit[1]), 100.0 * hit[1], (run.run_id,),
                    note=f"{key} at step {hit[0]} ({samples_at(cum, hit[0]):.0f} trained samples) x100",
                    mode=extraction_mode(run))
    nested = [c for c in store.children(run.run_id, kind="eval") if c.tags.get(schema.BENCHMARK_TAG) == bench
              and key in c.metrics]
    if nested:
        c = _score_cell(nested[-1], bench)
        return Cell(c.text, c.value, c.run_ids, note=c.note + " (nested eval run, final checkpoint)", mode=c.mode)
    if values:
        return Cell(_pct(values[-1]), 100.0 * values[-1], (run.run_id,),
                    note=f"{key} at step {steps[-1]} x100 (periodic eval, last point)", mode=extraction_mode(run))
    return None


def _mean_cell(cells: list[Cell]) -> Cell:
    if not cells:
        return Cell(NOT_RUN)
    if len({c.mode for c in cells}) > 1:  # never average across extraction modes
        return Cell(NA, None, tuple(rid for c in cells for rid in c.run_ids),
                    note="runs scored with different reward.extraction modes: "
                         + ", ".join(sorted({c.mode for c in cells})))
    vals = [c.value for c in cells if c.value is not None]
    ids = tuple(dict.fromkeys(rid for c in cells for rid in c.run_ids))
    if not vals:
        return Cell(NA, None, ids, note="; ".join(dict.fromkeys(c.note for c in cells)), mode=cells[0].mode)
    if len(vals) < len(cells):
        return Cell(NA, None, ids, note=f"{len(cells) - len(vals)} of {len(cells)} runs have no comparable point: "
                    + "; ".join(dict.fromkeys(c.note for c in cells if c.value is None)), mode=cells[0].mode)
    v = sum(vals) / len(vals)
    note = cells[0].note if len(cells) == 1 else f"mean over {len(cells)} runs"
    return Cell(_fmt(v, 1), v, ids, note=note, mode=cells[0].mode)


def build_table3(store: RunSource, hints: dict[str, str], equal_samples: bool = True) -> Table:
    """Score by training ``rollout.max_response_len`` from training runs tagged table3 (mean over
    runs of equal length and segments), plus the base model's eval runs, with the paper beside.

    With ``equal_samples`` the held-out column compares runs at one budget of trained samples
    (``sample_budget``): runs of different lengths / segment counts train different numbers of
    samples per step, so equal step counts are not an equal amount of learning."""
    hints = {**DEFAULT_HINTS, **hints}
    runs = [r for r in store.runs(paper_ref="table3") if r.kind in ("train", "")]
    budget = sample_budget(store, runs) if equal_samples else None
    groups: dict[tuple[int, int], list[RunInfo]] = {}
    for r in runs:
        key = (r.int_param("rollout.max_response_len") or 0, r.int_param("rollout.segments") or 0)
        groups.setdefault(key, []).append(r)
    benches = [("heldout", "Held-out")] + list(paper.BENCHMARKS)
    header = ["Max response len", "Segments", "Model", "Source"] + [h for _, h in benches] + ["AVG", "Runs"]
    rows: list[list[Cell]] = []

    # Base row: the untrained embedded model (standalone eval runs of model 'embedded').
    base_runs = [r for r in store.runs(kind="eval") if not r.parent_id and r.tags.get(schema.MODEL_TAG) == "embedded"]
    base_cells = []
    for b, _ in benches:
        rs = [r for r in base_runs
              if r.tags.get(schema.BENCHMARK_TAG) == b and schema.eval_metric(b, "avg_at_k") in r.metrics]
        base_cells.append(_score_cell(rs[-1], b) if rs else Cell(NOT_RUN))
    base_ids = tuple(dict.fromkeys(rid for c in base_cells for rid in c.run_ids))
    rows.append([label(DASH), label(DASH), label("base (embedded, no RL)"), label("ours")] + base_cells
                + [_avg_cell(base_cells[1:3]), _count_cell(base_ids)])

    for (length, segs) in sorted(groups) or [(0, 0)]:
        grp = groups.get((length, segs), [])
        cells = []
        for b, _ in benches:
            found = [c for c in (_train_score(store, r, b, budget if b == "heldout" else None) for r in grp)
                     if c is not None]
            cells.append(_mean_cell(found))
        ids = tuple(r.run_id for r in grp)
        name = f"ulorl-{length}" if grp else "ours"
        rows.append([label(length or DASH), label(segs or DASH), label(name), label("ours")] + cells
                    + [_avg_cell(cells[1:3]), _count_cell(ids)])
    modes = one_mode_per_column(rows, range(4, 4 + len(benches)))
    for row in rows:
        row[4 + len(benches)] = _avg_cell(row[5:7])
    for p in paper.TABLE3:
        rows.append(
            [label(p.max_response_len or DASH), label(p.segments or DASH), label(p.model), label("paper"), Cell(DASH),
             Cell(_fmt(p.aime2025, 1), p.aime2025, note="paper"),
             Cell(_fmt(p.beyondaime, 1), p.beyondaime, note="paper"),
             Cell(_fmt(p.avg, 1), p.avg, note="paper"), label(DASH)]
        )
    notes = [
        "Ours: avg@k x100 of training runs tagged ulorl.paper_ref=table3, grouped by rollout.max_response_len and "
        "rollout.segments (mean over runs). Benchmark columns: nested eval runs (final checkpoints, each at its "
        "run's own budget). Base row: standalone eval runs of the embedded model. Paper: avg@32 (Table 3).",
    ]
    if budget is not None:
        notes.append(f"Held-out column at equal trained samples: each run's last periodic eval/heldout/avg_at_k within "
                     f"{budget:.0f} trained samples (train/samples summed; the fewest any run had at its last eval)")
    else:
        notes.append("Held-out column: no run logs both train/samples and periodic evals, so each run's nested eval "
                     "or last periodic point is used (equal step counts, not equal trained samples)")
    if modes:
        notes.append("reward extraction per column (one mode per column; other modes shown as n/a): "
                     + ", ".join(f"{header[j]}={m}" for j, m in sorted(modes.items())))
    if not groups:
        notes.append(f"not run: produce training runs tagged ulorl.paper_ref=table3 with {hints['table3']}")
    if any(c.text == NOT_RUN for row in rows[: len(rows) - len(paper.TABLE3)] for c in row[4:7]):
        notes.append(
            f"benchmark cells marked '{NOT_RUN}': evaluate a training run's checkpoint with `ulorl-eval --benchmark "
            "<bench> --k 32 --model runs:/<run_id>/checkpoints/final --parent-run-id <run_id>`; the base row with "
            "`ulorl-eval --benchmark <bench> --k 32` (embedded model)"
        )
    return Table("table3", "Table 3: score by training output length (avg@k, %)", header, rows, n_label_cols=4,
                 notes=notes)


# ----------------------------------------------------------------------------- writers


def to_markdown(t: Table) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    out = [f"### {t.title}", "", "| " + " | ".join(esc(c) for c in t.columns) + " |",
           "|" + "|".join("---" if i < t.n_label_cols else "---:" for i in range(len(t.columns))) + "|"]
    for row in t.rows:
        out.append("| " + " | ".join(esc(c.text) for c in row) + " |")
    if t.notes:
        out.append("")
        out += [f"- {n}" for n in t.notes]
    return "\n".join(out) + "\n"


_TEX_ESC = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
            "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "—": "---",
            "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}"}


def tex_escape(s: str) -> str:
    return "".join(_TEX_ESC.get(ch, ch) for ch in s)


def to_latex(t: Table) -> str:
    spec = "l" * t.n_label_cols + "r" * (len(t.columns) - t.n_label_cols)
    lines = [
        "% generated by ulorl-tables; requires \\usepackage{booktabs}",
        "\\begin{table}[t]", "\\centering", f"\\caption{{{tex_escape(t.title)}}}", f"\\label{{tab:ulorl-{t.key}}}",
        "\\small", f"\\begin{{tabular}}{{{spec}}}", "\\toprule",
        " & ".join(tex_escape(c) for c in t.columns) + r" \\", "\\midrule",
    ]
    prev_source = None
    for row in t.rows:
        source = next((c.text for c in row[: t.n_label_cols + 2] if c.text in ("ours", "paper")), None)
        if prev_source is not None and source != prev_source:
            lines.append("\\midrule")
        prev_source = source
        lines.append(" & ".join(tex_escape(c.text) for c in row) + r" \\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    if t.notes:
        lines.append("\\par\\smallskip\\footnotesize " + r" \par ".join(tex_escape(n) for n in t.notes))
    lines.append("\\end{table}")
    return "\n".join(lines) + "\n"


def to_csv(t: Table) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(t.columns)
    for row in t.rows:
        w.writerow([c.text for c in row])
    return buf.getvalue()


CELLS_HEADER = ["table", "row", "column", "text", "value", "run_ids", "note"]


def cell_records(t: Table) -> list[dict[str, str]]:
    """One record per non-label cell: where it is, its value, the run ids behind it."""
    recs = []
    for row in t.rows:
        rl = t.row_label(row)
        for col, c in zip(t.columns[t.n_label_cols :], row[t.n_label_cols :]):
            recs.append({
                "table": t.key, "row": rl, "column": col, "text": c.text,
                "value": "" if c.value is None else repr(float(c.value)),
                "run_ids": ";".join(c.run_ids), "note": c.note,
            })
    return recs


def build_tables(store: RunSource, hints: Optional[dict[str, str]] = None, equal_samples: bool = True) -> list[Table]:
    """Tables 1-3; ``equal_samples`` picks Table 3's held-out budget (see ``build_table3``)."""
    hints = {**DEFAULT_HINTS, **(hints if hints is not None else find_hints())}
    return [build_table1(store, hints), build_table2(store, hints), build_table3(store, hints, equal_samples)]


def write_all(store: RunSource, out_dir: str | Path, hints: Optional[dict[str, str]] = None,
              equal_samples: bool = True) -> dict[str, Any]:
    """Write table{1,2,3}.{md,tex,csv}, fig{2,4,5}.png and cells.csv into ``out_dir``.

    Returns a summary: ``{"out": ..., "files": [...], "tables": {key: {"cells", "not_run", "runs"}},
    "figures": {key: {"runs", "lines"}}, "hints": {...}}``.
    """
    from ulorl.report.figures import build_figures

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hints = {**DEFAULT_HINTS, **(hints if hints is not None else find_hints())}
    files: list[str] = []
    records: list[dict[str, str]] = []
    summary: dict[str, Any] = {"out": str(out.resolve()), "files": files, "tables": {}, "figures": {}, "hints": hints}
    for t in build_tables(store, hints, equal_samples):
        for ext, text in (("md", to_markdown(t)), ("tex", to_latex(t)), ("csv", to_csv(t))):
            p = out / f"{t.key}.{ext}"
            p.write_text(text)
            files.append(str(p))
        recs = cell_records(t)
        records += recs
        summary["tables"][t.key] = {
            "cells": len(recs), "not_run": t.not_run_count(),
            "runs": len({rid for r in recs for rid in r["run_ids"].split(";") if rid}),
        }
    for fig in build_figures(store, hints):
        p = out / f"{fig.key}.png"
        fig.save(p)
        files.append(str(p))
        records += fig.cell_records()
        summary["figures"][fig.key] = {"runs": len(fig.lines), "lines": [ln.label for ln in fig.lines],
                                       "not_run": not fig.lines}
    cells = out / "cells.csv"
    with cells.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CELLS_HEADER, lineterminator="\n")
        w.writeheader()
        w.writerows(records)
    files.append(str(cells))
    return summary
