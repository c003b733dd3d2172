"""Run detail panel "Train / inference mismatch": the gap between the engine's and the trainer's log-probs
of the same sampled tokens under the same weights (``mismatch/*``, ``ulorl.train.mismatch``), by segment
index and by position bucket, and what the rollout correction did (``correction/*``).

Pure frame builders (``split_frame``, ``split_table``) plus the Streamlit panel; the
folding over steps is the report's (``ulorl.report.mismatch.summarize``).
"""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from ulorl.dashboard import cache
from ulorl.report.mismatch import SPLIT_STATS, split_rows, summarize
from ulorl.tracking import schema

HEADLINE: tuple[str, ...] = (
    schema.mismatch_metric("abs_mean"), schema.mismatch_metric("abs_max"), schema.mismatch_metric("k3_kl"),
    schema.mismatch_metric("ratio_out_frac"), schema.mismatch_metric("coverage"),
    schema.mismatch_metric("seq_logratio_min"), schema.CORRECTION_PREFIX + "rejected_frac",
    schema.CORRECTION_PREFIX + "weight_mean",
)
STAT_TEXT = {"abs_mean": "mean |delta|", "abs_max": "max |delta|", "k3_kl": "k3 KL",
             "ratio_out_frac": "ratio outside [0.5, 2]", "tokens": "tokens"}


def split_frame(hist: pd.DataFrame) -> pd.DataFrame:
    """Per step the split statistics: columns step, split (segment | position), index, stat, value.

    ``hist``: a long history frame (metric, step, value) of one run."""
    rows = []
    for metric, step, value in zip(hist["metric"], hist["step"], hist["value"]):
        parts = str(metric).split("/")
        if len(parts) != 3 or parts[0] + "/" != schema.MISMATCH_PREFIX:
            continue
        for kind, prefix in (("segment", "seg"), ("position", "pos")):
            if parts[1].startswith(prefix) and parts[1][len(prefix):].isdigit():
                rows.append({"step": int(step), "split": kind, "index": int(parts[1][len(prefix):]),
                             "stat": parts[2], "value": float(value)})
    return pd.DataFrame(rows, columns=["step", "split", "index", "stat", "value"])


def split_table(hist: pd.DataFrame, max_response_len: int | None) -> pd.DataFrame:
    """One row per segment index and per position bucket: the statistics folded over the run's updates
    (token-weighted means, the max of the max, summed tokens)."""
    def history(key: str) -> tuple[list[int], list[float]]:
        part = hist[hist["metric"] == key].sort_values("step")
        return [int(s) for s in part["step"]], [float(v) for v in part["value"]]

    rows = split_rows(summarize(history, set(hist["metric"])), max_response_len)
    return pd.DataFrame([{"split": r["label"], **{STAT_TEXT[s]: r.get(s) for s in SPLIT_STATS}} for r in rows],
                        columns=["split", *(STAT_TEXT[s] for s in SPLIT_STATS)])


def split_chart(frame: pd.DataFrame, stat: str = "abs_mean") -> alt.Chart:
    """Mean |delta| per step, one line per segment index and per position bucket (two panels)."""
    data = frame[frame["stat"] == stat].assign(group=lambda d: d["split"] + " " + d["index"].astype(str))
    return alt.Chart(data).mark_line(point=len(data) <= 120).encode(
        x=alt.X("step:Q", title="training step", axis=alt.Axis(tickMinStep=1, format="d")),
        y=alt.Y("value:Q", title=STAT_TEXT.get(stat, stat)),
        color=alt.Color("index:N", title="segment / bucket"),
        tooltip=["split:N", "index:Q", "step:Q", alt.Tooltip("value:Q", format=".3g")],
    ).properties(height=220, width=330).facet(column=alt.Column("split:N", title=None)).resolve_scale(y="shared")


def render_mismatch(uri: str, run_id: str, max_response_len: int | None) -> None:
    """The panel for one run (a caption when the run logged no mismatch)."""
    keys = tuple(k for k in cache.metric_keys(uri, (run_id,))
                 if k.startswith((schema.MISMATCH_PREFIX, schema.CORRECTION_PREFIX)))
    with st.expander("Train / inference mismatch (engine vs trainer log-probs)", expanded=False):
        if not keys:
            st.caption("This run logged no mismatch (`mismatch/*` metrics): runs log it at every update when the "
                       "engine returns the sampled tokens' log-probs (the hf and vllm engines do).")
            return
        hist = cache.histories(uri, (run_id,), keys)
        table = split_table(hist, max_response_len)
        st.dataframe(table, hide_index=True, key=f"detail_mismatch_table_{run_id}")
        frame = split_frame(hist)
        if not frame.empty:
            stat = st.radio("Statistic", list(STAT_TEXT)[:4], format_func=lambda s: STAT_TEXT[s], horizontal=True,
                            key=f"detail_mismatch_stat_{run_id}")
            st.altair_chart(split_chart(frame, stat), key=f"detail_mismatch_chart_{run_id}")
        st.caption("delta = trainer log-prob - engine log-prob of the same sampled token under the same weights: "
                   "with SAIS trainer log-probs every segment at the version that decoded it, else the tokens the "
                   "update's own version decoded (`mismatch/coverage` of the batch). Folded over the run's updates: "
                   "means weighted by the tokens each update measured, max |delta| the max. Position buckets are "
                   "eighths of `rollout.max_response_len` (16k tokens each at 128k).")
