"""Run detail panel "Where long outputs go": the length audit (``ulorl.train.length_audit``) of one run.

A chart of the response lengths (p50 / p90 / max) of the samples that met each fate, step by step,
and a table per fate: how many samples met it over the run, its share of the decoded tokens and the
longest sample. Pure frame builders (``audit_frame``, ``audit_table``) plus the Streamlit panel.
"""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from ulorl.dashboard import cache
from ulorl.tracking import schema
from ulorl.tracking.schema import AUDIT_COMPLETION_FATES, AUDIT_FINAL_FATES, AUDIT_POOL_FATES, audit_metric

FATES: tuple[str, ...] = AUDIT_FINAL_FATES + AUDIT_COMPLETION_FATES + AUDIT_POOL_FATES
QUANTILES: tuple[str, ...] = ("len_p50", "len_p90", "len_max")
FATE_TEXT = {
    "trained": "trained", "filtered": "filtered (dynamic sampling)", "stale": "dropped as stale",
    "refused": "update refused", "lost_resume": "lost at a resume", "eos": "finished (EOS)",
    "truncated": "truncated at the length budget", "clipped": "clipped at the engine context",
    "unfinished": "still decoding (pool)", "waiting": "done, group incomplete (pool)",
}


def audit_keys() -> tuple[str, ...]:
    """Every metric the panel reads."""
    return (schema.AUDIT_STARTED,) + tuple(
        audit_metric(f, s) for f in FATES for s in ("count", "total", "token_share") + QUANTILES)


def audit_frame(hist: pd.DataFrame) -> pd.DataFrame:
    """Length quantiles per fate and step: columns step, fate, quantile (p50 | p90 | max), length.

    ``hist``: a long history frame (``store.histories``: metric, step, value) of one run."""
    rows = []
    for fate in FATES:
        for q in QUANTILES:
            part = hist[hist["metric"] == audit_metric(fate, q)]
            rows += [{"step": int(s), "fate": FATE_TEXT[fate], "quantile": q.removeprefix("len_"), "length": float(v)}
                     for s, v in zip(part["step"], part["value"])]
    return pd.DataFrame(rows, columns=["step", "fate", "quantile", "length"])


def audit_table(hist: pd.DataFrame) -> pd.DataFrame:
    """One row per fate that any sample met: samples over the run (pool fates: at the last step),
    token share at the last step, the longest sample (max of len_max)."""
    def series(key: str) -> pd.Series:
        part = hist[hist["metric"] == key].sort_values("step")
        return pd.Series(part["value"].to_numpy(), index=part["step"].to_numpy(), dtype=float)

    rows = []
    for fate in FATES:
        counts = series(audit_metric(fate, "count"))
        if counts.empty:
            continue
        total = series(audit_metric(fate, "total"))
        samples = float(counts.iloc[-1]) if fate in AUDIT_POOL_FATES else (
            float(total.iloc[-1]) if not total.empty else float(counts.sum()))
        longest = series(audit_metric(fate, "len_max"))
        share = series(audit_metric(fate, "token_share"))
        if samples == 0 and longest.empty:
            continue
        rows.append({"fate": FATE_TEXT[fate], "kind": "final" if fate in AUDIT_FINAL_FATES else (
            "completion" if fate in AUDIT_COMPLETION_FATES else "pool (now)"), "samples": int(samples),
            "token share": float(share.iloc[-1]) if not share.empty else 0.0,
            "longest": float(longest.max()) if not longest.empty else float("nan")})
    return pd.DataFrame(rows, columns=["fate", "kind", "samples", "token share", "longest"])


def audit_chart(frame: pd.DataFrame) -> alt.Chart:
    """Lines of response length per fate (colour) and quantile (dash) over training steps."""
    return alt.Chart(frame).mark_line(point=len(frame) <= 90).encode(
        x=alt.X("step:Q", title="training step", axis=alt.Axis(tickMinStep=1, format="d")),
        y=alt.Y("length:Q", title="response length (tokens)"),
        color=alt.Color("fate:N", title="fate"),
        strokeDash=alt.StrokeDash("quantile:N", title="quantile", scale=alt.Scale(
            domain=["p50", "p90", "max"], range=[[1, 0], [6, 3], [2, 2]])),
        tooltip=["fate:N", "quantile:N", "step:Q", alt.Tooltip("length:Q", format=".0f")],
    ).properties(height=300).interactive()


def render_length_audit(uri: str, run_id: str) -> None:
    """The panel for one run (nothing but a caption when the run has no length audit)."""
    hist = cache.histories(uri, (run_id,), audit_keys())
    with st.expander("Where long outputs go (length audit)", expanded=False):
        if hist.empty:
            st.caption("This run logged no length audit (`audit/*` metrics): training runs log it every step "
                       "since the audit was added.")
            return
        frame = audit_frame(hist)
        if not frame.empty:
            st.altair_chart(audit_chart(frame), width="stretch", key=f"detail_audit_chart_{run_id}")
        st.dataframe(audit_table(hist), hide_index=True, key=f"detail_audit_table_{run_id}")
        last = hist[hist["step"] == hist["step"].max()]
        lost = last[last["metric"] == audit_metric("lost_resume", "total")]["value"]
        st.caption("Lengths of the samples that met each fate at each step (p50 solid, p90 dashed, max dotted). "
                   "Final fates (trained, filtered, stale, refused, lost) happen once per sample; completion "
                   "fates (EOS, truncated, clipped) when it stops decoding. Token share: the fate's tokens / all "
                   "decoded response tokens so far. "
                   + (f"Samples lost at a resume: {int(lost.iloc[0])} (must be 0)." if not lost.empty else ""))
