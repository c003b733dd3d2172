"""Run detail: config (params), tags, metrics, checkpoints, and the sampled responses with segment
boundaries coloured by policy version and masked MPT tokens highlighted; panels for the length audit
and the train / inference mismatch (by segment and position bucket)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ulorl.dashboard import cache, ui
from ulorl.dashboard import render as html_render
from ulorl.dashboard.audit_panel import render_length_audit
from ulorl.dashboard.mismatch_panel import render_mismatch

MAX_SAMPLES_SHOWN = 16


def _kv(d: dict, key: str = "key") -> pd.DataFrame:
    return pd.DataFrame(sorted(d.items()), columns=[key, "value"])


def _samples_tab(uri: str, run_id: str) -> None:
    files = cache.sample_files(uri, run_id)
    if not files:
        st.info("This run logged no sampled responses (`samples/step_*.jsonl`). Training runs log them "
                "every `tracking.sample_every` steps (`tracking.samples_per_log` per step).")
        return
    steps = [s for s, _ in files]
    c1, c2 = st.columns([2, 1])
    step = c1.select_slider("Step", options=steps, value=steps[-1], key=f"detail_step_{run_id}") \
        if len(steps) > 1 else steps[0]
    which = c2.radio("Show", ["all", "reward 1", "reward 0"], horizontal=True, key="detail_reward")
    path = dict(files)[step]
    records = cache.samples(uri, run_id, path)
    if which != "all":
        want = 1.0 if which == "reward 1" else 0.0
        records = [r for r in records if r.get("reward") is not None and float(r["reward"]) == want]
    if not records:
        st.info(f"No sampled responses to show in `{path}` with this filter.")
        return
    st.dataframe(html_render.samples_summary(records), hide_index=True, key="detail_samples_table")
    versions = [s.get("version") for r in records for s in (r.get("segments") or []) if s.get("version") is not None]
    st.html(html_render.legend_html(versions))
    for rec in records[:MAX_SAMPLES_SHOWN]:
        st.html(html_render.sample_html(rec))
    if len(records) > MAX_SAMPLES_SHOWN:
        st.caption(f"{len(records) - MAX_SAMPLES_SHOWN} more samples in `{path}` not shown.")


def render() -> None:
    st.title("Run detail")
    uri = ui.tracking_uri()
    runs = ui.load_runs().sort_values("start_time", ascending=False, na_position="last")
    ids = list(runs["run_id"])
    names = ui.run_names(runs)
    # ?run=<run id> links straight to a run; else the shared selection; else the newest training run.
    linked = st.query_params.get("run")
    preferred = [linked] if linked in names else [r for r in ui.selection() if r in names]
    if not preferred:
        preferred = list(runs[runs["kind"] == "train"]["run_id"][:1]) or ids[:1]
    kinds = dict(zip(runs["run_id"], runs["kind"]))
    run_id = st.selectbox("Run", ids, index=ids.index(preferred[0]), key="detail_run",
                          format_func=lambda r: f"{names[r]} · {kinds[r]}")
    st.query_params["run"] = run_id
    row = runs[runs["run_id"] == run_id].iloc[0]

    m = st.columns(4)
    m[0].metric("status", str(row["status"]))
    m[1].metric("kind", str(row["kind"]))
    m[2].metric("steps", "-" if pd.isna(row.get("steps")) else int(row["steps"]))
    m[3].metric("duration", "-" if pd.isna(row.get("duration_s")) else f"{row['duration_s']:.1f} s")
    st.caption(f"run id `{run_id}` · experiment `{row['experiment']}`"
               + (f" · sweep `{row['sweep']}`" if isinstance(row.get("sweep"), str) else "")
               + (f" · config `{row['config']}`" if isinstance(row.get("config"), str) else ""))

    params = {c[len("params."):]: v for c, v in row.items() if c.startswith("params.") and pd.notna(v)}
    tags = {c[len("tags."):]: v for c, v in row.items() if c.startswith("tags.") and pd.notna(v)}
    metrics = {c[len("metrics."):]: v for c, v in row.items() if c.startswith("metrics.") and pd.notna(v)}

    render_length_audit(uri, run_id)
    max_len = pd.to_numeric(params.get("rollout.max_response_len"), errors="coerce")
    render_mismatch(uri, run_id, None if pd.isna(max_len) else int(max_len))
    t_samples, t_config, t_metrics, t_tags, t_ckpt = st.tabs(["Samples", "Config", "Metrics", "Tags", "Checkpoints"])
    with t_samples:
        _samples_tab(uri, run_id)
    with t_config:
        if params:
            st.dataframe(_kv(params, "param"), hide_index=True, key="detail_params")
        else:
            st.info("This run logged no params.")
        resolved = cache.text_artifact(uri, run_id, "config/resolved.yaml")
        if resolved:
            with st.expander("config/resolved.yaml"):
                st.code(resolved, language="yaml")
    with t_metrics:
        st.dataframe(_kv(metrics, "metric (latest)"), hide_index=True, key="detail_metrics")
    with t_tags:
        st.dataframe(_kv(tags, "tag"), hide_index=True, key="detail_tags")
    with t_ckpt:
        ckpt = cache.checkpoints(uri, run_id)
        if ckpt.empty:
            st.info("No checkpoints logged under `checkpoints/` for this run.")
        else:
            st.dataframe(ckpt, hide_index=True, key="detail_checkpoints")
            st.caption("Load one with `transformers.AutoModelForCausalLM.from_pretrained(<downloaded folder>)`; "
                       "download with `mlflow artifacts download -r <run id> -a checkpoints/final`.")


if __name__ == "__main__":
    render()
