"""Altair chart builders (Altair ships with Streamlit; plotly is not a dependency).

Each builder takes a frame from :mod:`ulorl.dashboard.frames` and returns an Altair chart.
"""

from __future__ import annotations

from typing import Optional, Union

import altair as alt
import pandas as pd

from ulorl.dashboard import frames

# alt.layer returns a FacetChart when every layer shares a facet encoding (none of these charts has one)
LayeredChart = Union[alt.LayerChart, alt.FacetChart]

X_TITLES = {"step": "training step", "wall": "wall-clock (s since run start)"}
LEGEND_LABEL_PX = 320   # short labels (role and swept values) fit whole; the full run name is on hover


def _x(x: str) -> alt.X:
    """Steps are integers: no fractional ticks."""
    axis = alt.Axis(tickMinStep=1, format="d") if x == "step" else alt.Axis()
    return alt.X("x:Q", title=X_TITLES.get(x, x), axis=axis)


def _y(field: str, title: str, log: bool) -> alt.Y:
    scale = alt.Scale(type="log") if log else alt.Scale(zero=False)
    return alt.Y(f"{field}:Q", title=title, scale=scale)


def curves_chart(curves: pd.DataFrame, metric: str, x: str = "step", log: bool = False,
                 sigma: Optional[pd.DataFrame] = None, height: int = 320) -> LayeredChart:
    """One line per run (``curve_frame`` output); optional dashed sigma reference per run."""
    base = alt.Chart(curves).mark_line(point=len(curves) <= 60).encode(
        x=_x(x),
        y=_y("value", metric, log),
        color=alt.Color("run:N", title="run", legend=alt.Legend(labelLimit=LEGEND_LABEL_PX)),
        tooltip=["run:N", *(["name:N", "run_id:N"] if "name" in curves else []), "step:Q",
                 alt.Tooltip("raw:Q", format=".4g"), alt.Tooltip("value:Q", format=".4g")],
    )
    layers = [base]
    if sigma is not None and not sigma.empty:
        layers.append(alt.Chart(sigma).mark_rule(strokeDash=[6, 4], size=1.5).encode(
            y="sigma:Q", color=alt.Color("run:N"),
            tooltip=["run:N", alt.Tooltip("sigma:Q", title="target sigma"), "mask_mode:N"]))
    return alt.layer(*layers).properties(height=height).interactive()


def bands_chart(bands: pd.DataFrame, metric: str, x: str = "step", log: bool = False,
                sigma: Optional[pd.DataFrame] = None, height: int = 320) -> LayeredChart:
    """Mean line and min-max band per group (``group_bands`` output)."""
    enc_x = _x(x)
    band = alt.Chart(bands).mark_area(opacity=0.2).encode(
        x=enc_x, y=_y("min", metric, log), y2="max:Q", color=alt.Color("group:N", title="group"))
    line = alt.Chart(bands).mark_line().encode(
        x=enc_x, y=_y("mean", metric, log), color=alt.Color("group:N"),
        tooltip=["group:N", "step:Q", alt.Tooltip("mean:Q", format=".4g"), alt.Tooltip("min:Q", format=".4g"),
                 alt.Tooltip("max:Q", format=".4g"), "n:Q"])
    layers = [band, line]
    if sigma is not None and not sigma.empty:
        layers.append(alt.Chart(sigma.drop_duplicates("sigma")).mark_rule(strokeDash=[6, 4], color="black").encode(
            y="sigma:Q", tooltip=[alt.Tooltip("sigma:Q", title="target sigma")]))
    return alt.layer(*layers).properties(height=height).interactive()


def small_multiples(curves: pd.DataFrame, height: int = 160) -> alt.FacetChart:
    """Several metrics of the selected runs, one small panel each (column ``metric``)."""
    return alt.Chart(curves).mark_line().encode(
        x=_x("step"), y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=False)),
        color=alt.Color("run:N", legend=alt.Legend(labelLimit=LEGEND_LABEL_PX)),
        tooltip=["run:N", *(["name:N"] if "name" in curves else []), "metric:N", "step:Q",
                 alt.Tooltip("value:Q", format=".4g")],
    ).properties(height=height, width=260).facet(facet=alt.Facet("metric:N", title=None), columns=2).resolve_scale(
        y="independent")


def speedup_chart(table: pd.DataFrame, value: str, title: str) -> alt.Chart:
    """Grouped bars of ``value`` by segment count, one colour per batching mode."""
    return alt.Chart(table).mark_bar().encode(
        x=alt.X("segments:O", title="segments S"), xOffset="batching:N",
        y=alt.Y(f"{value}:Q", title=title), color=alt.Color("batching:N"),
        tooltip=["batching:N", "segments:O", alt.Tooltip(f"{value}:Q", format=".3g"), "runs:Q"],
    ).properties(height=260)


def paper_table1_chart(table1: pd.DataFrame) -> alt.Chart:
    return alt.Chart(table1).mark_bar(color="#888").encode(
        x=alt.X("segments:O", title="segments S"), y=alt.Y("speedup:Q", title="paper speedup (x)"),
        tooltip=["segments:O", "time_per_step_s:Q", "speedup:Q"],
    ).properties(height=260)


def benchmark_chart(table: pd.DataFrame) -> LayeredChart:
    """avg@k per run and benchmark as horizontal bars (one row per run, its short label on the axis,
    the full run name on hover) with the logged confidence interval as whiskers; a benchmark scored
    under several reward extraction modes gets one series per mode (``frames.bench_series``)."""
    series = frames.bench_series(table) if "extraction" in table else table["bench"]
    table = table.assign(series=series)
    order = list(dict.fromkeys(table["label"]))
    enc = dict(y=alt.Y("label:N", title=None, sort=order, axis=alt.Axis(labelLimit=LEGEND_LABEL_PX)),
               yOffset="series:N")
    hover = ["label:N", *(["name:N"] if "name" in table else []), "series:N",
             alt.Tooltip("avg_at_k:Q", format=".3f"), alt.Tooltip("pass_at_k:Q", format=".3f"),
             alt.Tooltip("ci_low:Q", format=".3f"), alt.Tooltip("ci_high:Q", format=".3f"), "k:Q"]
    bars = alt.Chart(table).mark_bar().encode(
        **enc, x=alt.X("avg_at_k:Q", title="avg@k (%)", scale=alt.Scale(domainMin=0)),
        color=alt.Color("series:N", title="bench"), tooltip=hover)
    height = 40 + 22 * max(1, len(order)) * max(1, table["series"].nunique())
    ci = table.dropna(subset=["ci_low", "ci_high"])
    if ci.empty:
        return alt.layer(bars).properties(height=height)
    err = alt.Chart(ci).mark_errorbar(ticks=True).encode(**enc, x=alt.X("ci_low:Q", title="avg@k (%)"), x2="ci_high:Q")
    return alt.layer(bars, err).properties(height=height)


def difference_chart(diffs: pd.DataFrame) -> LayeredChart:
    """Paired difference vs the baseline per run and benchmark: point and interval, zero rule."""
    enc = dict(y=alt.Y("label:N", title=None, axis=alt.Axis(labelLimit=400)), yOffset="bench:N")
    bars = alt.Chart(diffs).mark_errorbar(ticks=True).encode(
        **enc, x=alt.X("diff_low:Q", title="difference vs baseline (% points)"), x2="diff_high:Q",
        color=alt.Color("bench:N"))
    pts = alt.Chart(diffs).mark_point(filled=True, size=60).encode(
        **enc, x="diff:Q", color=alt.Color("bench:N"),
        tooltip=["label:N", "bench:N", alt.Tooltip("diff:Q", format=".1f"), alt.Tooltip("diff_low:Q", format=".1f"),
                 alt.Tooltip("diff_high:Q", format=".1f"), "paired_problems:Q"])
    zero = alt.Chart(pd.DataFrame({"x": [0.0]})).mark_rule(color="#999", strokeDash=[4, 3]).encode(x="x:Q")
    return alt.layer(zero, bars, pts).properties(height=40 + 28 * max(1, len(diffs)))


def parallel_chart(long: pd.DataFrame, objective_title: str) -> LayeredChart:
    """Parallel coordinates: each trial a line over the [0, 1]-scaled axes, coloured by objective."""
    order = list(long.sort_values("order")["axis"].drop_duplicates())
    x = alt.X("axis:N", sort=order, title=None, axis=alt.Axis(labelAngle=0))
    lines = alt.Chart(long).mark_line(opacity=0.7).encode(
        x=x, y=alt.Y("norm:Q", title="scaled value", scale=alt.Scale(domain=[0, 1])), detail="run_id:N",
        color=alt.Color("objective:Q", title=objective_title, scale=alt.Scale(scheme="viridis")),
        tooltip=["run:N", "axis:N", "label:N", alt.Tooltip("objective:Q", format=".4g")])
    points = alt.Chart(long).mark_circle(size=40).encode(
        x=x, y="norm:Q", color=alt.Color("objective:Q"), tooltip=["run:N", "axis:N", "label:N"])
    rules = alt.Chart(pd.DataFrame({"axis": order})).mark_rule(color="#999").encode(x=x)
    return alt.layer(rules, lines, points).properties(height=340)


def importance_chart(imp: pd.DataFrame, value: str = "spearman", title: str = "Spearman rho") -> alt.Chart:
    return alt.Chart(imp.dropna(subset=[value])).mark_bar().encode(
        x=alt.X(f"{value}:Q", title=title), y=alt.Y("param:N", sort="-x", title=None),
        color=alt.condition(alt.datum[value] > 0, alt.value("#4c78a8"), alt.value("#e45756")),
        tooltip=["param:N", alt.Tooltip(f"{value}:Q", format=".3f")],
    ).properties(height=60 + 36 * max(1, len(imp)))


def history_chart(hist: pd.DataFrame, objective_title: str) -> LayeredChart:
    pts = alt.Chart(hist).mark_circle(size=60).encode(
        x=alt.X("trial:Q", title="trial (start order)", axis=alt.Axis(tickMinStep=1, format="d")),
        y=alt.Y("value:Q", title=objective_title,
                                                                 scale=alt.Scale(zero=False)),
        tooltip=["trial:Q", "run:N", alt.Tooltip("value:Q", format=".4g")])
    best = alt.Chart(hist).mark_line(interpolate="step-after", color="#e45756").encode(x="trial:Q", y="best:Q")
    return alt.layer(pts, best).properties(height=260)
