"""Figures 2, 4 and 5 of the paper from tracked training runs, drawn with matplotlib (Agg, no
display, no pyplot global state).

- fig2: ``train/entropy`` and accuracy (``rollout/reward_mean``) vs step, runs tagged fig2, one
  line per run labelled by ``algo.is_mode``; one row of panels per ``rollout.max_response_len``.
- fig4: ``train/entropy`` vs step, runs tagged fig4, labelled by ``algo.mpt.mode`` (off = baseline,
  static = static MPT masking); one panel per model.
- fig5: as fig4 for runs tagged fig5 (dynamic masking), with each run's target ``algo.mpt.sigma``
  drawn as a dashed line.
An arm run on several seeds (runs that differ only in data.seed / rollout.seed / train.seed) is
drawn as each seed's curve, faint (alpha 0.25), plus the mean across seeds in bold with a min-max
band over the seeds (the legend says so); its cells.csv row "(mean of N seeds)" holds the mean's
last point.
A figure with no runs is still written: it says "not run" and names the command that makes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ulorl.report.store import RunInfo, RunSource
from ulorl.tracking.schema import DISTINGUISHING_KEYS, SEED_KEYS

ENTROPY = "train/entropy"
ACCURACY = "rollout/reward_mean"

MODE_NAMES = {
    "algo.is_mode": {"tois": "TOIS", "sais": "SAIS", "pois": "POIS"},
    "algo.mpt.mode": {"off": "baseline (no masking)", "static": "static MPT masking", "dynamic": "DMMPT"},
}
SEED_ALPHA = 0.25    # per-seed curves of an arm run on several seeds
BAND_ALPHA = 0.15    # its min-max band
SEEDS_NOTE = ("arms run on several seeds: faint lines = each seed, bold line = mean across seeds, "
              "shaded band = min-max across seeds")


@dataclass
class Line:
    """One run in one panel: its label and (steps, values) per metric."""

    label: str
    run_id: str
    panel: str
    series: dict[str, tuple[list[int], list[float]]]
    target: Optional[float] = None   # fig5: the run's algo.mpt.sigma, drawn dashed in its colour
    arm: str = ""                    # label without the seeds: lines of one panel with the same arm are its seeds


@dataclass
class SeedGroup:
    """Lines of one panel that are seeds of one arm (``arm`` set, more than one line)."""

    arm: str
    lines: list[Line]


def seed_groups(lines: list[Line]) -> list[SeedGroup]:
    """Lines grouped by ``arm`` (first appearance order); a line without an arm is its own group
    named by its label."""
    out: dict[str, SeedGroup] = {}
    for ln in lines:
        key = ln.arm or ln.label
        out.setdefault(key, SeedGroup(key, [])).lines.append(ln)
    return list(out.values())


def seed_band(curves: list[tuple[list[int], list[float]]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """(steps, mean, min, max) across seeds at the steps every curve has.

    ``seed_band([([1, 2, 3], [1., 2., 3.]), ([2, 3], [4., 5.])]) == ([2, 3], [3., 4.], [2., 3.], [4., 5.])``."""
    if not curves:
        return [], [], [], []
    common = sorted(set.intersection(*(set(st) for st, _ in curves)))
    at = [dict(zip(st, v)) for st, v in curves]
    cols = [[c[s] for c in at] for s in common]
    return (common, [sum(c) / len(c) for c in cols], [min(c) for c in cols], [max(c) for c in cols])


def draw_seed_group(ax: Any, group: SeedGroup, metric: str, w: int, color: str, style: str) -> None:
    """One arm run on several seeds, drawn on the matplotlib axes ``ax``: each seed's curve faint, the mean
    across seeds bold, the min-max band across seeds shaded (every curve trailing-mean smoothed first when
    ``w`` > 1)."""
    curves = []
    for ln in group.lines:
        steps, values = ln.series[metric]
        values = trailing_mean(values, w) if w > 1 else values
        ax.plot(steps, values, color=color, linestyle=style, linewidth=0.8, alpha=SEED_ALPHA)
        curves.append((steps, values))
    steps, mean, low, high = seed_band(curves)
    if not steps:
        return
    n = len(group.lines)
    ax.fill_between(steps, low, high, color=color, alpha=BAND_ALPHA, linewidth=0)
    smooth = f", {w}-step mean" if w > 1 else ""
    ax.plot(steps, mean, color=color, linestyle=style, linewidth=1.6, marker="o" if len(steps) < 12 else None,
            markersize=3, label=f"{group.arm}: mean of {n} seeds{smooth}")


@dataclass
class PaperFigure:
    key: str                                   # "fig2"
    title: str
    metrics: list[tuple[str, str]]             # (metric key, axis label): one column of panels each
    panels: list[str]                          # one row of panels each
    lines: list[Line] = field(default_factory=list)
    hint: str = ""

    def save(self, path: str | Path) -> None:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

        if not self.lines:
            fig = Figure(figsize=(6.4, 3.2))
            ax = fig.add_subplot(1, 1, 1)
            ax.axis("off")
            ax.text(0.5, 0.62, f"{self.title}\n\nnot run", ha="center", va="center", fontsize=12)
            ax.text(0.5, 0.18, f"produce the runs with:\n{self.hint}", ha="center", va="center", fontsize=8, wrap=True)
            fig.savefig(path, dpi=100)
            return
        nrows, ncols = len(self.panels), len(self.metrics)
        fig = Figure(figsize=(6.4 * ncols, 3.4 * nrows + 0.6), layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=False)
        labels = list(dict.fromkeys(g.arm for p in self.panels
                                    for g in seed_groups([ln for ln in self.lines if ln.panel == p])))
        colors = {lab: f"C{i % 10}" for i, lab in enumerate(labels)}
        # distinct dash patterns keep overlapping curves visible (POIS and TOIS nearly coincide in the paper)
        styles = {lab: ("-", "--", "-.", ":")[i % 4] for i, lab in enumerate(labels)}
        for i, panel in enumerate(self.panels):
            for j, (metric, ylabel) in enumerate(self.metrics):
                ax = axes[i][j]
                here = [ln for ln in self.lines if ln.panel == panel and metric in ln.series]
                w = smoothing_window(max((len(ln.series[metric][1]) for ln in here), default=0))  # one window per panel
                color_of: dict[str, str] = {}
                for g in seed_groups(here):
                    color, style = colors[g.arm], styles[g.arm]
                    color_of.update({ln.label: color for ln in g.lines})
                    if len(g.lines) > 1:
                        draw_seed_group(ax, g, metric, w, color, style)
                        continue
                    ln = g.lines[0]
                    steps, values = ln.series[metric]
                    if w > 1:  # long noisy runs: faint per-step points, bold trailing mean
                        ax.plot(steps, values, color=color, linewidth=0.6, alpha=0.25)
                        values = trailing_mean(values, w)
                    ax.plot(steps, values, label=ln.label + (f" ({w}-step mean)" if w > 1 else ""),
                            color=color, linestyle=style, linewidth=1.4,
                            marker="o" if len(steps) < 12 else None, markersize=3)
                if metric == ENTROPY:
                    targets = {ln.target: ln.label for ln in self.lines if ln.panel == panel and ln.target is not None}
                    one = len(targets) == 1
                    for sigma, lab in sorted(targets.items()):
                        ax.axhline(sigma, color="k" if one else color_of.get(lab, "k"), linestyle="--", linewidth=1.0,
                                   label=f"target sigma = {sigma:.3g}")
                ax.set_xlabel("training step")
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.set_ylabel(ylabel)
                ax.set_title(panel if len(self.metrics) == 1 else f"{panel}: {ylabel}", fontsize=9)
                ax.grid(alpha=0.3)
                if ax.get_legend_handles_labels()[0]:  # beside the axes: inside, it covered the curves
                    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        fig.suptitle(self.title, fontsize=11)
        if any(len(g.lines) > 1 for p in self.panels for g in seed_groups([ln for ln in self.lines if ln.panel == p])):
            fig.text(0.0, -0.01, SEEDS_NOTE, fontsize=7, ha="left", va="top")
        fig.savefig(path, dpi=110, bbox_inches="tight")

    def cell_records(self) -> list[dict[str, str]]:
        """cells.csv rows: one per (line, metric), value = last point, plus one per (arm run on
        several seeds, metric) with the mean's last point; 'not run' when empty."""
        if not self.lines:
            return [{"table": self.key, "row": "", "column": m, "text": "not run", "value": "", "run_ids": "",
                     "note": f"produce the runs with: {self.hint}"} for m, _ in self.metrics]
        recs = []
        for ln in self.lines:
            for m, _ in self.metrics:
                steps, values = ln.series.get(m, ([], []))
                recs.append({
                    "table": self.key, "row": f"{ln.panel} / {ln.label}", "column": m,
                    "text": f"{values[-1]:.4g}" if values else "no points",
                    "value": repr(float(values[-1])) if values else "", "run_ids": ln.run_id,
                    "note": f"{len(values)} points, last at step {steps[-1]}" if values else "metric not logged",
                })
        for panel in self.panels:
            for g in seed_groups([ln for ln in self.lines if ln.panel == panel]):
                if len(g.lines) < 2:
                    continue
                for m, _ in self.metrics:
                    steps, mean, low, high = seed_band([ln.series[m] for ln in g.lines if m in ln.series])
                    recs.append({
                        "table": self.key, "row": f"{panel} / {g.arm} (mean of {len(g.lines)} seeds)", "column": m,
                        "text": f"{mean[-1]:.4g}" if mean else "no common step",
                        "value": repr(float(mean[-1])) if mean else "",
                        "run_ids": ";".join(ln.run_id for ln in g.lines),
                        "note": f"mean over seeds at step {steps[-1]}, min {low[-1]:.4g}, max {high[-1]:.4g}"
                        if mean else "the seeds share no logged step",
                    })
        return recs


def smoothing_window(n_points: int) -> int:
    """Trailing-mean window for a curve of ``n_points``: 1 (raw) below 40 points, else n / 20 (>= 5)."""
    return 1 if n_points < 40 else max(5, n_points // 20)


def trailing_mean(values: list[float], w: int) -> list[float]:
    """``out[i]`` = mean of ``values[max(0, i - w + 1) : i + 1]``."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= w:
            acc -= values[i - w]
        out.append(acc / min(i + 1, w))
    return out


def _pretty(param: str, value: str) -> str:
    return MODE_NAMES.get(param, {}).get(value, value)


def _short(param: str) -> str:
    return param.split(".")[-1]


def _val(v: str) -> str:
    """Param value for a legend: floats to 3 significant digits (Optuna draws 0.3456789...)."""
    try:
        f = float(v)
    except ValueError:
        return v
    return v if f.is_integer() and "." not in v else f"{f:.3g}"


def _panel_value(v: str) -> str:
    """A model path is shown by its last component (``/x/cache/c87d...`` -> ``c87d...``)."""
    return v.rstrip("/").rsplit("/", 1)[-1] if v.startswith(("/", ".", "~")) else v


def _parts(run: RunInfo, params: list[str]) -> list[str]:
    """``short=value`` per param; seed params that all move together read as one ``seed=v``."""
    seeds = [p for p in params if p in SEED_KEYS]
    values = {run.param(p) for p in seeds}
    parts = []
    for p in params:
        if p in seeds and len(seeds) > 1:
            if len(values) == 1:
                if p == seeds[0]:
                    parts.append(f"seed={_val(run.param(p))}")
                continue
            parts.append(f"{p}={_val(run.param(p))}")
        else:
            parts.append(f"{_short(p)}={_val(run.param(p))}")
    return parts


def _labels(runs: list[RunInfo], primary: str, panel_param: Optional[str], seeds: bool = True) -> list[str]:
    """Label = primary param (pretty), plus whichever other params differ among runs whose labels
    would otherwise collide, plus the run name as a last resort. ``seeds=False``: the arm label,
    without the seed params, so the seeds of one arm share it; runs it cannot tell apart by their
    seeds keep the run name."""
    base = [_pretty(primary, r.param(primary, "?")) for r in runs]
    out = list(base)
    params = DISTINGUISHING_KEYS if seeds else tuple(p for p in DISTINGUISHING_KEYS if p not in SEED_KEYS)
    for lab in set(base):
        idx = [i for i, b in enumerate(base) if b == lab]
        if len(idx) < 2:
            continue
        extra = [p for p in params if p not in (primary, panel_param)
                 and len({runs[i].param(p) for i in idx}) > 1]
        for i in idx:
            parts = _parts(runs[i], extra)
            out[i] = f"{lab} ({', '.join(parts)})" if parts else lab
        if seeds:
            if len({out[i] for i in idx}) < len(idx):
                for i in idx:
                    out[i] = f"{out[i]} [{runs[i].name}]"
            continue
        for name in {out[i] for i in idx}:
            same = [i for i in idx if out[i] == name]
            if len({tuple(runs[i].param(p) for p in SEED_KEYS) for i in same}) < len(same):
                for i in same:
                    out[i] = f"{out[i]} [{runs[i].name}]"
    return out


def _build(store: RunSource, key: str, title: str, metrics: list[tuple[str, str]], primary: str,
           panel_param: Optional[str], panel_fmt: str, hint: str, sigma: bool = False) -> PaperFigure:
    runs = [r for r in store.runs(paper_ref=key) if r.kind in ("train", "")]
    panel_of = {r.run_id: (panel_fmt.format(_panel_value(r.param(panel_param, "?"))) if panel_param else "")
                for r in runs}
    panels = sorted(set(panel_of.values()), key=lambda s: (len(s), s)) or [""]
    fig = PaperFigure(key, title, metrics, panels, hint=hint)
    for panel in panels:
        pruns = [r for r in runs if panel_of[r.run_id] == panel]
        arms = _labels(pruns, primary, panel_param, seeds=False)
        for r, lab, arm in zip(pruns, _labels(pruns, primary, panel_param), arms):
            series = {}
            for m, _ in metrics:
                steps, values = store.history(r.run_id, m)
                if values:
                    series[m] = (steps, values)
            target = r.float_param("algo.mpt.sigma") if sigma and r.param("algo.mpt.mode") == "dynamic" else None
            fig.lines.append(Line(lab, r.run_id, panel, series, target, arm))
    return fig


def build_figures(store: RunSource, hints: dict[str, str]) -> list[PaperFigure]:
    ent = (ENTROPY, "entropy (mean per token)")
    acc = (ACCURACY, "accuracy (rollout reward mean)")
    return [
        _build(store, "fig2", "Fig. 2: entropy and accuracy of TOIS / SAIS / POIS", [ent, acc], "algo.is_mode",
               "rollout.max_response_len", "max response len {}", hints["fig2"]),
        _build(store, "fig4", "Fig. 4: entropy, baseline vs. static MPT masking", [ent], "algo.mpt.mode",
               "model.name_or_path", "model {}", hints["fig4"]),
        _build(store, "fig5", "Fig. 5: entropy under DMMPTs vs. target sigma", [ent], "algo.mpt.mode",
               "model.name_or_path", "model {}", hints["fig5"], sigma=True),
    ]


__all__ = ["ACCURACY", "ENTROPY", "Line", "PaperFigure", "SeedGroup", "build_figures", "seed_band", "seed_groups"]
