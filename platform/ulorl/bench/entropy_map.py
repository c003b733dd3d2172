"""The entropy map: where each configuration's entropy drop comes from, by token class and threshold tau.

    python -m ulorl.bench.entropy_map sweeps/entropy/map.yaml --out experiments/results/entropy_map.jsonl

The spec is a grid sweep file (``ulorl.sweep.spec``: base experiment, fixed overrides, ``variants`` x
``repeats``; valid for ``ulorl-sweep`` too). Each trial runs here, in this process, one after
the other, as a real training run (``ulorl.train.trainer.Trainer``, tracked in MLflow under
``--workdir``) with the exact entropy probe on (``train.entropy_probe_every`` from the spec); the
probe keeps every probed step's per-token terms, so one run gives the MPT share at every tau of
``TAUS`` (the bins of ``ulorl.algo.entropy_decomp.probability_bins``), not only at its own
``algo.mpt.tau``. One JSON line per finished trial is appended to ``--out`` at once (a trial
already there is skipped: rerun the command to resume), holding:

- ``entropy``: train/entropy per step, its start / end means (first / last ``WINDOW`` update steps);
- ``share``: per geometry (sgd, adam) and tau, the MPT term summed over the probed steps over the
  unmasked update's term summed the same way (the ratio of sums: a step with little change weighs
  little), and ``share_gross``: |MPT| over the sum of |class terms|;
- ``bins``: the summed terms by advantage sign x p bin; ``classes``: per-class sums (exact and proxies);
- ``agreement``: each proxy against each exact geometry over (probed step x class) pairs (Pearson,
  Spearman, sign agreement) and on the MPT class alone over steps;
- ``linear``: the AdamW prediction (adam/total + carry) against the realized change, per probed step;
- ``cost``: wall and CPU seconds of the trial, and the load average around it.

``--summary`` prints the table of a results file without running anything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from ulorl.algo.entropy_decomp import CLASSES, MPT_CLASS, P_EDGES, agreement
from ulorl.jsonout import emit_json, json_command

__all__ = ["FINAL_WINDOW", "TAUS", "WINDOW", "final_entropy", "main", "model_shape", "paired_final_entropy", "plot_map",
           "pool_by_variant", "run_table", "summarize_trial", "summary_table", "variant_table"]

TAUS = (0.8, 0.85, 0.9, 0.95, 0.99)
WINDOW = 5   # update steps averaged for the start / end entropy of a short run
GEOMETRIES = ("sgd", "adam")
PROXIES = ("cov", "state")


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def _bins(records: Sequence[Any], geometry: str) -> dict[str, dict[str, float]]:
    """Summed per-token terms by advantage sign and p bin over the probed steps."""
    import torch

    out: dict[str, dict[str, float]] = {"pos": {}, "neg": {}}
    for rec in records:
        terms = rec.terms[geometry]
        for sign, sm in (("pos", rec.advantage > 0), ("neg", ~(rec.advantage > 0))):
            for i, (lo, hi) in enumerate(zip(P_EDGES[:-1], P_EDGES[1:])):
                last = i == len(P_EDGES) - 2
                in_bin = (rec.p >= lo) & ((rec.p <= hi) if last else (rec.p < hi))
                key = f"{lo:g}-{hi:g}"
                out[sign][key] = out[sign].get(key, 0.0) + float(terms[sm & in_bin].sum().to(torch.float64))
    return out


def _share_at(records: Sequence[Any], geometry: str, tau: float) -> tuple[float, float, list[float]]:
    """(MPT terms / all terms, |MPT| / sum |class terms|, per-step shares) at ``tau`` over the records."""
    mpt_sum, all_sum, gross_mpt, gross_all, per_step = 0.0, 0.0, 0.0, 0.0, []
    for rec in records:
        t = rec.terms[geometry]
        mpt = float(t[(rec.advantage > 0) & (rec.p >= tau)].sum())
        total = float(t.sum())
        classes = []
        for pos in (True, False):
            sm = (rec.advantage > 0) if pos else ~(rec.advantage > 0)
            high = rec.p >= tau
            low = (rec.p < 0.5) & ~high
            for bm in (high, low, ~high & ~low):
                classes.append(float(t[sm & bm].sum()))
        mpt_sum += mpt
        all_sum += total
        gross_mpt += abs(mpt)
        gross_all += math.fsum(abs(c) for c in classes)
        per_step.append(mpt / total if total else float("nan"))
    share = mpt_sum / all_sum if all_sum else float("nan")
    gross = gross_mpt / gross_all if gross_all else float("nan")
    return share, gross, per_step


def _median(xs: Sequence[float]) -> float:
    v = sorted(x for x in xs if math.isfinite(x))
    if not v:
        return float("nan")
    m = len(v) // 2
    return v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2


def summarize_trial(history: Sequence[dict[str, float]], records: Sequence[Any], tau: float) -> dict[str, Any]:
    """The map row of one run: its per-step metrics (``history``, one dict per step) and the probe's
    records (``ulorl.train.entropy_probe.ProbeRecord``); ``tau`` = the run's algo.mpt.tau (the
    classes its logged metrics use)."""
    ent = [(i + 1, h["train/entropy"]) for i, h in enumerate(history) if "train/entropy" in h]
    values = [v for _, v in ent]
    row: dict[str, Any] = {
        "entropy": {"steps": [s for s, _ in ent], "values": values,
                    "start": sum(values[:WINDOW]) / max(1, len(values[:WINDOW])),
                    "end": sum(values[-WINDOW:]) / max(1, len(values[-WINDOW:]))},
        "reward": [h.get("train/reward_mean") for h in history],
        "probed_steps": [r.step for r in records],
    }
    row["entropy"]["drop"] = row["entropy"]["start"] - row["entropy"]["end"]
    if not records:
        return row
    row["share"] = {g: {f"{t:g}": _share_at(records, g, t)[0] for t in TAUS} for g in GEOMETRIES}
    row["share_gross"] = {g: {f"{t:g}": _share_at(records, g, t)[1] for t in TAUS} for g in GEOMETRIES}
    row["share_median_step"] = {g: {f"{t:g}": _median(_share_at(records, g, t)[2]) for t in TAUS}
                                for g in GEOMETRIES}
    row["bins"] = {g: _bins(records, g) for g in GEOMETRIES}
    probed = {r.step: r.summary for r in records}
    row["token_share"] = {}
    total_tokens = sum(int(r.p.numel()) for r in records)
    for t in TAUS:
        n = sum(int(((r.advantage > 0) & (r.p >= t)).sum()) for r in records)
        row["token_share"][f"{t:g}"] = n / max(1, total_tokens)
    prefixes = {"sgd": "entropy/exact/sgd", "adam": "entropy/exact/adam",
                "cov": "entropy/proxy/cov", "state": "entropy/proxy/state"}
    per_step: dict[str, dict[str, list[float]]] = {k: {c: [] for c in CLASSES} for k in prefixes}
    steps_ok = []
    for i, h in enumerate(history):
        step = i + 1
        if step not in probed:
            continue
        merged = {**h, **probed[step]}
        if not all(f"{p}/{c}" in merged for p in prefixes.values() for c in CLASSES):
            continue
        steps_ok.append(step)
        for k, p in prefixes.items():
            for c in CLASSES:
                per_step[k][c].append(float(merged[f"{p}/{c}"]))
    row["classes"] = {k: {c: math.fsum(v) for c, v in d.items()} for k, d in per_step.items()}
    row["agreement"] = {}
    for proxy in PROXIES:
        for geom in GEOMETRIES:
            xs = [v for c in CLASSES for v in per_step[proxy][c]]
            ys = [v for c in CLASSES for v in per_step[geom][c]]
            a = agreement(xs, ys) if xs else None
            m = agreement(per_step[proxy][MPT_CLASS], per_step[geom][MPT_CLASS]) if xs else None
            row["agreement"][f"{proxy}_vs_{geom}"] = {
                "pairs": a.__dict__ if a else None, "mpt_over_steps": m.__dict__ if m else None}
    pred = [probed[s].get("entropy/exact/adam/total", float("nan")) + probed[s].get("entropy/exact/adam/carry", 0.0)
            for s in probed]
    real = [probed[s].get("entropy/exact/realized", float("nan")) for s in probed]
    fresh = [probed[s].get("entropy/exact/adam/total", float("nan")) for s in probed]
    row["linear"] = {"predicted": pred, "realized": real, "fresh": fresh,
                     "agreement": agreement(pred, real).__dict__ if len(pred) > 1 else None}
    return row


def _run_trial(cfg: Any, workdir: Path, label: str, progress: bool, spec: Optional[str] = None) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    from ulorl.tracking.provenance import row_provenance, spec_tags
    from ulorl.train.entropy_probe import probe_of
    from ulorl.train.trainer import Trainer
    from ulorl.train.update import UpdateContext

    run_dir = workdir / "runs" / label.replace(" ", "_").replace("/", "_")
    uri = f"sqlite:///{(workdir / 'mlflow.db').resolve()}"
    t0, c0, load0 = time.perf_counter(), _cpu_s(), os.getloadavg()[0]
    trainer = Trainer(cfg, run_dir=run_dir, tracking_uri=uri, progress=False,
                      extra_tags={"ulorl.entropy_map": label, **(spec_tags(spec) if spec else {})})
    trainer.setup()
    probe = probe_of(UpdateContext.of_run(trainer.backend, cfg, trainer.pad_id, trainer.device), keep_records=True)
    history: list[dict[str, float]] = []
    status = "FINISHED"
    try:
        for _ in range(cfg.train.max_steps):
            m = trainer.train_step().metrics
            history.append(m)
            if progress:
                ent = m.get("train/entropy")
                adam = m.get("entropy/exact/adam/total")
                print(f"[entropy-map] {label}: step {trainer.step}/{cfg.train.max_steps} entropy "
                      f"{'-' if ent is None else f'{ent:.4f}'}"
                      + ("" if adam is None else f", probe adam dH {adam:.3g} (mpt {m['entropy/exact/adam/mpt']:.3g})"),
                      file=sys.stderr, flush=True)
    except BaseException:
        status = "FAILED"
        raise
    finally:
        trainer.close(status)
    row = summarize_trial(history, probe.records, cfg.algo.mpt.tau)
    row["cost"] = {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu_s() - c0,
                   "load_before": load0, "load_after": os.getloadavg()[0], "threads": cfg.train.threads}
    row["run_id"] = trainer.run_id
    row["provenance"] = row_provenance(MlflowClient(uri).get_run(row["run_id"]).data.tags) if row["run_id"] else {}
    return row


class MapInputError(ValueError):
    """A results file or a ``--summary`` flag the map cannot use; the message names it and the fix."""


#: Keys every row the map appends holds (``main``), with their type; a row with probe ``bins`` holds
#: ``ROW_PROBE_KEYS`` too.
ROW_KEYS: dict[str, type] = {"label": str, "variant": str, "seed_offset": int, "entropy": dict, "cost": dict}
ROW_PROBE_KEYS: dict[str, type] = {"share": dict, "classes": dict}


def read_results(out: Path) -> list[dict[str, Any]]:
    """The rows of the results JSONL ``out`` (``--out``) for ``--summary``; :class:`MapInputError` naming
    the file (and line) when it is missing, empty, not UTF-8, not one JSON object per line, or holds a
    line that is not an entropy-map row (another tool's results file)."""
    made_by = "the file python -m ulorl.bench.entropy_map SPEC --out FILE appends to"
    if out.is_dir():
        raise MapInputError(f"--out {out} is a folder; give the results JSONL ({made_by})")
    if not out.is_file():
        raise MapInputError(f"--out {out} does not exist; give the results JSONL ({made_by}), or run the map first")
    try:
        text = out.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise MapInputError(f"--out {out} is not UTF-8 text (at byte offset {exc.start}); give the results JSONL "
                            f"({made_by})") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise MapInputError(f"--out {out} line {n} is not JSON ({exc.msg}, column {exc.colno}); the file "
                                "holds one JSON object per line: remove or repair that line (a run cut short "
                                "leaves at most its last line torn)") from None
        need = {**ROW_KEYS, **(ROW_PROBE_KEYS if isinstance(row, dict) and "bins" in row else {})}
        bad = (sorted(k for k, t in need.items() if not isinstance(row.get(k), t)) if isinstance(row, dict)
               else sorted(need))
        if bad:
            raise MapInputError(f"--out {out} line {n} is not an entropy-map row (no {', '.join(bad)} of the right "
                                f"type): is it another tool's results file? give {made_by}")
        rows.append(row)
    if not rows:
        raise MapInputError(f"--out {out} holds no rows; run the map first (python -m ulorl.bench.entropy_map SPEC "
                            f"--out {out}) or give the file it wrote")
    return rows


def parse_pair(text: str, rows: Sequence[dict[str, Any]]) -> tuple[str, str]:
    """``--pair 'A,B'`` as two variant names the rows hold; :class:`MapInputError` otherwise."""
    variants = sorted({r["variant"] for r in rows})
    names = [x.strip() for x in text.split(",")]
    if len(names) != 2 or not all(names):
        raise MapInputError(f"--pair {text!r}: expected two variant names 'A,B' (A's final entropy minus B's); "
                            f"the file's variants: {', '.join(variants)}")
    unknown = [x for x in names if x not in variants]
    if unknown:
        raise MapInputError(f"--pair {text!r}: no row of variant {', '.join(map(repr, unknown))}; the file's "
                            f"variants: {', '.join(variants)}")
    return names[0], names[1]


def plot_format_check(path: Path) -> None:
    """:class:`MapInputError` when ``--plot``'s file extension names no image format matplotlib writes (no
    extension: matplotlib would quietly write ``<path>.png``, not the file asked for)."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    ext = path.suffix.lstrip(".").lower()
    if ext not in formats:
        why = "has no file extension" if not ext else f"ends in .{ext}, not an image format matplotlib writes"
        raise MapInputError(f"--plot {path} {why}; give the image file with its extension, e.g. "
                            f"{path.with_suffix('.png')} "
                            "(or .pdf, .svg)")


def _done(out: Path) -> set[str]:
    if not out.is_file():
        return set()
    return {json.loads(line)["label"] for line in out.read_text().splitlines() if line.strip()}


def _fmt(x: Optional[float], pct: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.1%}" if pct else f"{x:.3g}"


def summary_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table of map rows: entropy start -> end (first / last ``WINDOW`` steps), the net of the
    class terms over their gross (Adam), the MPT share at each tau (Adam), at tau 0.9 / 0.99 (SGD), the
    gross MPT share at tau 0.8 (Adam), the MPT token share at tau 0.99 / 0.8, and the trial's CPU s."""
    head = ("| configuration | entropy start -> end | net / gross | " + " | ".join(f"share {t:g}" for t in TAUS)
            + " | SGD share 0.9 / 0.99 | gross share 0.8 | MPT tokens 0.99 / 0.8 | CPU s |")
    lines = [head, "|" + "---|" * (7 + len(TAUS))]
    for r in rows:
        e = r.get("entropy", {})
        cells = [r["label"].replace(" seed+0", ""), f"{_fmt(e.get('start'))} -> {_fmt(e.get('end'))}"]
        adam = r.get("classes", {}).get("adam", {})
        gross = math.fsum(abs(v) for v in adam.values())
        cells.append(_fmt(math.fsum(adam.values()) / gross if gross else None))
        sh, sgd = r.get("share", {}).get("adam", {}), r.get("share", {}).get("sgd", {})
        cells += [_fmt(sh.get(f"{t:g}"), True) for t in TAUS]
        cells.append(f"{_fmt(sgd.get('0.9'), True)} / {_fmt(sgd.get('0.99'), True)}")
        cells.append(_fmt(r.get("share_gross", {}).get("adam", {}).get("0.8"), True))
        ts = r.get("token_share", {})
        cells.append(f"{_fmt(ts.get('0.99'), True)} / {_fmt(ts.get('0.8'), True)}")
        cells.append(f"{r.get('cost', {}).get('cpu_s', float('nan')):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mpt_sum(pos_bins: dict[str, float], tau: float) -> float:
    """Sum of the positive-advantage bins (keys "lo-hi") that start at or above ``tau``: the MPT class at tau."""
    return math.fsum(v for key, v in pos_bins.items() if float(key.split("-")[0]) >= tau)


def _by_variant(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The rows with probe bins, grouped by variant in first-seen order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("bins"):
            groups.setdefault(r["variant"], []).append(r)
    return groups


def pool_by_variant(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per variant with its runs' ``bins`` summed and ``share`` recomputed from the sums (the ratio
    of sums over every probed step of every run), labelled "<variant> (<n> runs)": what ``plot_map`` draws
    for a map with repeats."""
    out = []
    for name, group in _by_variant(rows).items():
        bins = {g: {side: {k: math.fsum(r["bins"][g][side][k] for r in group) for k in side_bins}
                    for side, side_bins in geometry_bins.items()}
                for g, geometry_bins in group[0]["bins"].items()}
        share = {}
        for g, b in bins.items():
            total = math.fsum(v for side in b.values() for v in side.values())
            share[g] = {f"{t:g}": _mpt_sum(b["pos"], t) / total if total else float("nan") for t in TAUS}
        out.append({"label": f"{name} ({len(group)} runs)", "variant": name, "bins": bins, "share": share,
                    "runs": group})
    return out


def variant_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table, one line per variant, its seeds pooled: the model's parameters and shape (hidden x
    layers), entropy start -> end (means over the runs), the net of the class terms over their gross, the MPT
    share at tau 0.8 / 0.9 / 0.99 as a ratio of sums over every probed step of every run (a run with little
    change weighs little, as within a run), the range of the runs' own shares at tau 0.8, the gross MPT share
    at tau 0.8 (|MPT terms| over the summed |class terms|, pooled), and the mean CPU s of a run."""
    lines = ["| variant | runs | parameters | hidden x layers | entropy start -> end | net / gross | share 0.8 | "
             "share 0.9 | share 0.99 | runs' share 0.8 | gross share 0.8 | CPU s |", "|" + "---|" * 12]
    for pooled in pool_by_variant(rows):
        group = pooled["runs"]
        total = math.fsum(v for side in pooled["bins"]["adam"].values() for v in side.values())
        gross = math.fsum(abs(v) for r in group for v in r["classes"]["adam"].values())
        shape = group[0].get("shape") or {}
        params = shape.get("parameters")
        own = [r["share"]["adam"]["0.8"] for r in group]
        cells = [pooled["variant"], str(len(group)), f"{params / 1e6:.2f} M" if params else "-",
                 f"{shape.get('hidden_size', '?')} x {shape.get('num_hidden_layers', '?')}" if shape else "-",
                 f"{_fmt(statistics.fmean(r['entropy']['start'] for r in group))} -> "
                 f"{_fmt(statistics.fmean(r['entropy']['end'] for r in group))}",
                 _fmt(total / gross if gross else None)]
        cells += [_fmt(pooled["share"]["adam"][f"{t:g}"], True) for t in (0.8, 0.9, 0.99)]
        cells.append(f"{_fmt(min(own), True)} - {_fmt(max(own), True)}")
        gross_mpt = math.fsum(abs(_mpt_sum(r["bins"]["adam"]["pos"], 0.8)) for r in group)
        cells.append(_fmt(gross_mpt / gross if gross else None, True))
        cells.append(f"{statistics.fmean(r['cost']['cpu_s'] for r in group):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


FINAL_WINDOW = 10   # "final entropy": mean train/entropy of a run's last 10 logged steps (as ulorl.report.claims)


def final_entropy(row: dict[str, Any]) -> float:
    values = row.get("entropy", {}).get("values", [])
    tail = values[-FINAL_WINDOW:]
    return sum(tail) / len(tail) if tail else float("nan")


def _pair_cell(agreement: dict[str, Any], key: str) -> str:
    a = (agreement.get(key) or {}).get("pairs") or {}
    return f"{_fmt(a.get('pearson'))}, {_fmt(a.get('sign_agreement'))}"


def run_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown table, one line per run, of what decides a paired regime: final entropy (mean
    train/entropy of the last ``FINAL_WINDOW`` steps, +- the standard error of that mean over its steps)
    beside the first ``FINAL_WINDOW``; the MPT class's
    share of the first-order change at the run's own tau (Adam; with a mask on, the part the mask removed)
    and its gross share; the realized change of the probed steps' own batches, summed (what the update did
    to the batch it trained on); the state and Clip-Cov proxies against the exact Adam terms over (probed
    step x class) pairs (Pearson, sign agreement); the AdamW linearisation's Pearson against the realized change."""
    lines = ["| run | entropy first -> final +- SE | MPT share (gross) at tau | own-batch realized dH, summed "
             "| state proxy: Pearson, sign | Clip-Cov proxy: Pearson, sign | linearisation Pearson |",
             "|" + "---|" * 7]
    for r in rows:
        values = r.get("entropy", {}).get("values", [])
        first = sum(values[:FINAL_WINDOW]) / len(values[:FINAL_WINDOW]) if values else None
        tail = values[-FINAL_WINDOW:]
        se = statistics.stdev(tail) / math.sqrt(len(tail)) if len(tail) > 1 else None
        tau = f"{r.get('tau', 0.0):g}"
        share = r.get("share", {}).get("adam", {}).get(tau)
        gross = r.get("share_gross", {}).get("adam", {}).get(tau)
        realized = r.get("linear", {}).get("realized") or []
        agree = r.get("agreement", {})
        lin = (r.get("linear", {}).get("agreement") or {}).get("pearson")
        lines.append(f"| {r.get('label', '?')} | {_fmt(first)} -> {_fmt(final_entropy(r))} +- {_fmt(se)} | "
                     f"{_fmt(share, True)} ({_fmt(gross, True)}) | {_fmt(math.fsum(realized)) if realized else '-'} | "
                     f"{_pair_cell(agree, 'state_vs_adam')} | {_pair_cell(agree, 'cov_vs_adam')} | {_fmt(lin)} |")
    return "\n".join(lines)


def paired_final_entropy(rows: Sequence[dict[str, Any]], arm_a: str, arm_b: str) -> dict[str, Any]:
    """Final entropy of variant ``arm_a`` minus ``arm_b``, paired by seed offset: the per-seed
    differences, their mean, the 95 % t-interval and the minimum detectable effect
    (``ulorl.eval.paired``), and whether |mean| > 2 MDE (the regime criterion of platform/ulorl/docs/entropy.md)."""
    from ulorl.eval.paired import mde_seeds, seed_interval_usable, t_interval

    a = {r["seed_offset"]: final_entropy(r) for r in rows if r.get("variant") == arm_a}
    b = {r["seed_offset"]: final_entropy(r) for r in rows if r.get("variant") == arm_b}
    seeds = sorted(set(a) & set(b))
    diffs = [a[s] - b[s] for s in seeds]
    out: dict[str, Any] = {"a": arm_a, "b": arm_b, "seeds": seeds, "diffs": diffs,
                           "final_a": [a[s] for s in seeds], "final_b": [b[s] for s in seeds]}
    usable, why = seed_interval_usable(diffs)
    if not usable:
        out["why"] = why
        return out
    mean, lo, hi = t_interval(diffs)
    mde = mde_seeds(diffs)
    out.update({"mean": mean, "t95": [lo, hi], "mde": mde,
                "beyond_2_mde": mde is not None and abs(mean) > 2 * mde})
    return out


def plot_map(rows: Sequence[dict[str, Any]], path: str | Path, geometry: str = "adam") -> None:
    """Two panels: the MPT share of the run's first-order entropy change against tau, one line per
    configuration (``geometry``'s terms); the summed terms by advantage sign and p bin of each
    configuration (bars), which show where the change comes from and how the signs cancel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "share" in r]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for r in rows:
        ys = [100 * r["share"][geometry][f"{t:g}"] for t in TAUS]
        ax1.plot(TAUS, ys, marker="o", label=r["label"].replace(" seed+0", ""))
    ax1.axhline(20, color="grey", linestyle=":", linewidth=1)
    ax1.set_xlabel("tau (MPT: positive advantage, p >= tau)")
    ax1.set_ylabel(f"MPT share of the entropy change, % ({geometry})")
    ax1.set_title("MPT share of the first-order entropy change over the run")
    ax1.legend(fontsize=7)
    keys = list(rows[0]["bins"][geometry]["pos"]) if rows else []
    width = 0.8 / max(1, len(rows))
    for i, r in enumerate(rows):
        b = r["bins"][geometry]
        total = sum(abs(v) for s in ("pos", "neg") for v in b[s].values()) or 1.0
        xs = [k + i * width for k in range(len(keys))]
        ax2.bar(xs, [100 * b["pos"][k] / total for k in keys], width, color=f"C{i}")
        ax2.bar(xs, [100 * b["neg"][k] / total for k in keys], width, color=f"C{i}", alpha=0.45)
    ax2.axhline(0, color="black", linewidth=0.6)
    ax2.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))], keys, rotation=30, fontsize=8)
    ax2.set_xlabel("p of the sampled token (solid: A > 0, light: A <= 0)")
    ax2.set_ylabel("% of the summed |terms|")
    ax2.set_title("Where the change comes from, by p bin (negative = entropy falls)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")


def model_shape(name_or_path: str) -> dict[str, Any]:
    """The shape of a local model folder (``config.json``) and its parameter count when a warm-start manifest
    holds it; {} for a model that is not a local folder."""
    from ulorl.models.loading import resolve_model_path
    from ulorl.models.warmstart import MANIFEST

    folder = Path(resolve_model_path(name_or_path))
    if not (folder / "config.json").is_file():
        return {}
    config = json.loads((folder / "config.json").read_text())
    shape = {k: config[k] for k in SHAPE_KEYS if k in config}
    if (folder / MANIFEST).is_file():
        shape["parameters"] = json.loads((folder / MANIFEST).read_text()).get("parameters")
    return shape


@json_command
def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ulorl.bench.entropy_map",
        description="Run a grid sweep's trials one after the other with the exact entropy probe on, and append "
                    "each trial's entropy map row (MPT share by tau, classes, proxy agreement) to a JSONL file.")
    p.add_argument("sweep", nargs="?", help="grid sweep spec (variants x repeats), e.g. sweeps/entropy/map.yaml")
    p.add_argument("--out", required=True, help="results JSONL (appended; trials already in it are skipped)")
    p.add_argument("--workdir", default="runs/entropy_map", help="run folders and the MLflow store of the trials")
    p.add_argument("--only", default="", help="comma-separated variant names to run (default: all)")
    p.add_argument("--summary", action="store_true", help="print the table of --out and stop")
    p.add_argument("--plot", help="with --summary: also draw the map (PNG) of --out's rows with a probe")
    p.add_argument("--pair", help="with --summary: 'A,B' = variant A's final entropy minus B's, paired by seed")
    p.add_argument("--by-variant", action="store_true",
                   help="with --summary: also one line per variant, its seeds pooled (maps with repeats); "
                        "--plot then draws the pooled variants")
    p.add_argument("--json", action="store_true", help="with --summary: the rows as one JSON object")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.summary:
        from ulorl.out_path import out_file_problem

        try:
            rows = read_results(out)
            pair = paired_final_entropy(rows, *parse_pair(args.pair, rows)) if args.pair else None
            problem = out_file_problem(Path(args.plot), "--plot", "entropy_map.png") if args.plot else None
            if problem:
                raise MapInputError(problem)
            if args.plot:
                plot_format_check(Path(args.plot))
        except MapInputError as exc:
            print(f"entropy_map: {exc}", file=sys.stderr)
            return 2
        if args.plot:
            plot_map(pool_by_variant(rows) if args.by_variant else rows, args.plot)
        if args.json:
            emit_json({"rows": rows, "pair": pair})
            return 0
        print(summary_table(rows))
        if args.by_variant:
            print()
            print(variant_table(rows))
        if pair is not None:
            print()
            print(run_table(rows))
            print(json.dumps(pair, indent=1))
        return 0
    if not args.sweep:
        p.error("give a sweep spec (or --summary)")
    from ulorl.config import apply_overrides as apply
    from ulorl.config import config_from_dict
    from ulorl.models.loading import ModelLoadError
    from ulorl.sweep.spec import SweepError, grid_trials, load_sweep, seed_overrides

    try:
        spec, _, base = load_sweep(args.sweep)
        trials = grid_trials(spec)
    except SweepError as exc:
        print(f"entropy_map: {exc}", file=sys.stderr)
        return 2
    only = {x for x in args.only.split(",") if x}
    unknown = only - {t["variant"] for t in trials}
    if unknown:
        print(f"entropy_map: --only names no variant of {args.sweep}: {sorted(unknown)}", file=sys.stderr)
        return 2
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = _done(out)
    fixed = dict(spec.overrides)
    if spec.stop.steps:
        fixed["train.max_steps"] = spec.stop.steps
    for trial in trials:
        label = f"{trial['variant']} seed+{trial['repeat']}"
        if (only and trial["variant"] not in only) or label in done:
            continue
        over = {**fixed, **trial["overrides"]}
        merged = apply(base, over)
        over.update(seed_overrides(merged, trial["repeat"]))
        cfg = config_from_dict(apply(base, over), source=f"{args.sweep} ({label})")
        print(f"[entropy-map] {label}: {cfg.train.max_steps} steps, probe every {cfg.train.entropy_probe_every}",
              file=sys.stderr, flush=True)
        try:
            row = _run_trial(cfg, workdir, label, progress=True, spec=args.sweep)
        except ModelLoadError as exc:
            print(f"entropy_map: {label}: {exc} (a model the sweep file names must be built first: its comment "
                  "has the command)", file=sys.stderr)
            return 2
        row.update({"label": label, "variant": trial["variant"], "seed_offset": trial["repeat"],
                    "overrides": {k: v for k, v in over.items()}, "tau": cfg.algo.mpt.tau,
                    "temperature": cfg.rollout.temperature, "lr": cfg.train.lr, "model": cfg.model.name_or_path,
                    "mode": cfg.algo.mpt.mode, "sweep": spec.name, "shape": model_shape(cfg.model.name_or_path)})
        with out.open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        print(f"[entropy-map] {label}: written to {out} ({row['cost']['cpu_s']:.0f} CPU s, "
              f"{row['cost']['wall_s']:.0f} s wall)", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
