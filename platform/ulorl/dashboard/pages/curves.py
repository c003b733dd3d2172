"""Curves: any metric of the selected runs against step or wall-clock time, smoothing, log
scale, group-by bands, entropy with each run's target sigma, masking and pool sizes, and the train /
inference mismatch (mismatch/*, correction/*)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ulorl.dashboard import cache, charts, frames, ui
from ulorl.dashboard.mismatch_panel import HEADLINE as MISMATCH_HEADLINE
from ulorl.tracking import schema

NONE = "(none)"
DEFAULT_METRIC = "train/entropy"
MASK_POOL_METRICS: tuple[str, ...] = (
    "train/masked_frac", "train/mpt_frac", "train/mask_active_frac",
    "pool/unfinished", "pool/experience", "pool/staleness_max",
)
WALL_METRIC = "time/wall_s"


def _metric_order(keys: list[str]) -> list[str]:
    known = (schema.TRAIN_METRICS + schema.ROLLOUT_METRICS + schema.POOL_METRICS + schema.TIME_METRICS
             + MISMATCH_HEADLINE)
    return [k for k in known if k in keys] + [k for k in keys if k not in known]


def render() -> None:
    st.title("Curves")
    uri = ui.tracking_uri()
    runs = ui.load_runs()
    train = ui.of_kind(runs, "train")
    if train.empty:
        ui.empty_state("No training runs in this store yet.", ui.TRAIN_HINT)
    recent = list(train.sort_values("start_time", ascending=False)["run_id"][:6])
    chosen = ui.select_runs("Runs", train, page="curves", default=recent)
    if not chosen:
        st.info("Select one or more training runs above (or on the Runs page).")
        st.stop()

    keys = _metric_order(cache.metric_keys(uri, tuple(chosen)))
    if not keys:
        ui.empty_state("The selected runs have no metrics yet (still starting?).", ui.TRAIN_HINT)
    c1, c2, c3 = st.columns([2, 1, 1])
    metric = c1.selectbox("Metric", keys, index=keys.index(DEFAULT_METRIC) if DEFAULT_METRIC in keys else 0,
                          key="curves_metric")
    x = c2.radio("x axis", ["step", "wall"], key="curves_x", horizontal=True,
                 format_func=lambda v: "step" if v == "step" else "wall-clock")
    log = c3.checkbox("Log scale", key="curves_log")
    d1, d2 = st.columns(2)
    smoothing = d1.slider("Smoothing (EMA weight)", 0.0, 0.99, 0.0, 0.01, key="curves_smooth")
    sub = runs[runs["run_id"].isin(chosen)]
    group_options = frames.varying_params(sub) or frames.param_keys(sub)
    group = d2.selectbox("Group by hyperparameter (mean, min-max band)", [NONE] + group_options, key="curves_group")

    extra = (WALL_METRIC,) if x == "wall" and metric != WALL_METRIC else ()
    hist = cache.histories(uri, tuple(chosen), (metric,) + extra)
    wall = hist[hist["metric"] == WALL_METRIC] if x == "wall" else None
    curves = frames.curve_frame(hist[hist["metric"] == metric], runs, x=x, smoothing=smoothing, wall=wall)
    if curves.empty:
        st.info(f"None of the selected runs logged `{metric}`.")
    else:
        sigma = frames.sigma_lines(runs, chosen) if metric == "train/entropy" else None
        if group == NONE:
            chart = charts.curves_chart(curves, metric, x=x, log=log, sigma=sigma)
        else:
            chart = charts.bands_chart(frames.group_bands(curves, runs, group), metric, x=x, log=log, sigma=sigma)
        st.altair_chart(chart, width="stretch", key="curves_main")
        if sigma is not None and not sigma.empty:
            st.caption("Dashed lines: each run's target entropy sigma (`algo.mpt.sigma`); DMMPT masks "
                       "well-mastered positive tokens only while entropy is below it (mask mode `dynamic`).")
        with st.expander("Data"):
            st.dataframe(curves, hide_index=True, key="curves_data")

    st.subheader("Masking and pool sizes")
    _small_multiples(uri, runs, chosen, [k for k in MASK_POOL_METRICS if k in keys], smoothing, "curves_pools",
                     "The selected runs logged no masking or pool metrics.")
    st.subheader("Train / inference mismatch")
    _small_multiples(uri, runs, chosen, [k for k in MISMATCH_HEADLINE if k in keys], smoothing, "curves_mismatch",
                     "The selected runs logged no mismatch: runs log `mismatch/*` at every update when the engine "
                     "returns the sampled tokens' log-probs; `correction/*` when `algo.rollout_correction.mode` is on.")


def _small_multiples(uri: str, runs: pd.DataFrame, chosen: list[str], present: list[str], smoothing: float, key: str,
                     empty: str) -> None:
    """One small panel per metric of ``present`` for the chosen runs (``empty``: the note when none is)."""
    if not present:
        st.info(empty)
        return
    mp = cache.histories(uri, tuple(chosen), tuple(present))
    parts = []
    for metric in present:
        part = frames.curve_frame(mp[mp["metric"] == metric], runs, x="step", smoothing=smoothing)
        parts.append(part.assign(metric=metric))
    small = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if not small.empty:
        st.altair_chart(charts.small_multiples(small), key=key)


if __name__ == "__main__":
    render()
