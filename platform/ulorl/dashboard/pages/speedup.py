"""Speedup: per sweep, time per step and finished samples per second by segment count, relative
to the sweep's S = 1 baseline (per rollout.batching), beside the paper's Table 1."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from ulorl.dashboard import cache, charts, frames, paper_ref, ui
from ulorl.report import speed

WINDOWS = {"steady": "steady state: each run's steps after its first S", "all": "all steps (includes the warm-up)"}


def ratio_text(sp: speed.Speedup, window: str) -> str:
    """``S = 4 vs S = 1 (compact batching, steady state ...), shown: CPU seconds ...: 1.05x CPU s per step
    (...); wall: 0.71x time per step (0.812 s vs 0.577 s), ... under load 7.4 vs 1.1; ...``. The shown
    figure (:attr:`ulorl.report.speed.Speedup.shown`) is in bold; the other one follows with the loads."""
    def fmt(v: float, f: str) -> str:
        return format(v, f) if math.isfinite(v) else "-"

    bold = sp.shown == "wall"
    trained = (f", {_b(fmt(sp.throughput_x, '.2f') + 'x', bold)} trained samples/s ({fmt(sp.trained_per_s, '.1f')} vs "
               f"{fmt(sp.reference_trained_per_s, '.1f')})") if math.isfinite(sp.throughput_x) else ""
    wall = (f"{_b(fmt(sp.step_speedup, '.2f') + 'x', bold)} wall time per step ({fmt(sp.step_s, '.3f')} s vs "
            f"{fmt(sp.reference_step_s, '.3f')} s){trained}")
    cpu = ""
    if sp.shown == "cpu":
        per_cpu = (f", **{fmt(sp.cpu_throughput_x, '.2f')}x** trained samples per CPU second") \
            if math.isfinite(sp.cpu_throughput_x) else ""
        cpu = (f"**{fmt(sp.cpu_step_speedup, '.2f')}x** CPU seconds per step ({fmt(sp.cpu_step_s, '.3f')} s vs "
               f"{fmt(sp.reference_cpu_step_s, '.3f')} s){per_cpu}; ")
    return (f"**S = {sp.segments} vs S = 1** ({sp.batching} batching, {WINDOWS[window]}), shown: "
            f"{speed.SHOWN_TEXT[sp.shown]}: {cpu}{wall}; under {speed.load_text(sp)} (mean 1-minute load average); "
            f"medians over {sp.runs} run(s) vs {sp.reference_runs}.")


def _b(text: str, bold: bool) -> str:
    return f"**{text}**" if bold else text


def render() -> None:
    st.title("Speedup")
    uri = ui.tracking_uri()
    runs = ui.load_runs()
    seg_col = frames.param_col("rollout.segments")
    train = ui.of_kind(runs, "train")
    if seg_col in train:
        train = train[train[seg_col].notna()]
    if train.empty:
        ui.empty_state("No training runs with `rollout.segments` in this store yet.", ui.SEGMENTS_HINT)
    groups = frames.sweep_groups(train)
    # Groups that vary the segment count and contain S = 1 first, sweeps before loose runs of a config.
    def rank(g: str) -> tuple[int, int, int, str]:
        segs = pd.to_numeric(train.loc[groups == g, seg_col], errors="coerce")
        return (-int(segs.nunique() > 1), -int((segs == 1).any()), int(g.startswith("config: ")), g)
    options = sorted(groups.unique(), key=rank)
    group = st.selectbox("Sweep (or experiment config for runs outside a sweep)", options, key="speedup_group")
    members = train[groups == group]

    window = st.radio("Window", list(WINDOWS), key="speedup_window", horizontal=True, format_func=WINDOWS.get,
                      help="With S segments the pools fill (and the samples trained per step settle) only after "
                           "S steps; timing the warm-up flatters large S.")
    hist = cache.histories(uri, tuple(members["run_id"]), speed.SPEED_METRICS)
    segs = pd.to_numeric(members[seg_col], errors="coerce").fillna(0).astype(int)
    skip = dict(zip(members["run_id"], segs)) if window == "steady" else None
    stats = frames.rollout_stats(hist, skip)
    short = stats[stats["steps"] == 0]
    stats = stats[stats["steps"] > 0]
    st.caption("Shown figure: CPU seconds of the trainer process per step (`time/step_cpu_s`) when both sides "
               "logged them, since wall times of runs at different moments of a shared machine differ with its "
               "load; the wall figure follows with the mean load average (`sys/load1`) each side ran under. "
               f"Runs with `rollout.schedule: overlap` have rows of their own (batching `...{frames.OVERLAP_SUFFIX}`), "
               "against their own S = 1: sync and overlap side by side.")
    st.caption(f"Window: {WINDOWS[window]}. Budget: per run, its own logged steps; throughput columns are "
               "per second of step time (finished = rollout/finished, trained = train/samples; held-out "
               "evaluation time left out), so runs of different length and S compare at equal time, not equal "
               "steps. Several runs of one (batching, S): the median of their values.")
    if len(short):
        st.warning(f"{len(short)} run(s) have no step in the window (too short for their S): "
                   + ", ".join(frames.labels_of(members).get(r, r) for r in short["run_id"]))
    table = frames.speedup_table(stats, members)
    if table.empty:
        ui.empty_state(f"The runs of `{group}` logged no `time/step_s` yet.", ui.SEGMENTS_HINT)
    if table["step_speedup"].isna().all():
        st.warning("No S = 1 run in this group: relative columns are empty. The headline sweep runs one "
                   "(`ulorl-sweep sweeps/mpt_threshold.yaml`: its reference trial `non_segmented`); "
                   "`ulorl-sweep sweeps/segments.yaml` runs S = 1, 2, 4, 8 in both batching regimes.")
    for sp in frames.speedups(table):
        st.markdown(ratio_text(sp, window))
        note = speed.below_one_note(sp)
        if note:
            st.info(note.replace(speed.OTHER_REGIME_COMMANDS, f"`{speed.OTHER_REGIME_COMMANDS}`"))

    left, right = st.columns(2)
    with left:
        st.subheader(f"Measured: {group}")
        st.dataframe(table, hide_index=True, key="speedup_table", column_config={
            "median_step_s": st.column_config.NumberColumn("median s/step", format="%.3f"),
            "finished_per_s": st.column_config.NumberColumn("finished/s", format="%.2f"),
            "trained_per_s": st.column_config.NumberColumn("trained samples/s", format="%.2f"),
            "step_speedup": st.column_config.NumberColumn("step speedup (x)", format="%.2f"),
            "throughput_x": st.column_config.NumberColumn("finished/s (x)", format="%.2f"),
            "trained_x": st.column_config.NumberColumn("trained/s (x)", format="%.2f"),
            "median_step_cpu_s": st.column_config.NumberColumn("median CPU s/step", format="%.3f"),
            "trained_per_cpu_s": st.column_config.NumberColumn("trained per CPU s", format="%.2f"),
            "cpu_speedup": st.column_config.NumberColumn("CPU-s speedup (x)", format="%.2f"),
            "trained_cpu_x": st.column_config.NumberColumn("trained per CPU s (x)", format="%.2f"),
            "load": st.column_config.NumberColumn("load (1-min avg)", format="%.1f"),
        })
        has_base = table["step_speedup"].notna().any()
        has_cpu = table["cpu_speedup"].notna().any()
        ycol, ytitle = (("cpu_speedup", "CPU-s speedup vs S=1 (x), shown: CPU seconds") if has_cpu else
                        ("step_speedup", "wall step speedup vs S=1 (x), shown: wall time") if has_base else
                        ("median_step_s", "median wall s/step"))
        st.altair_chart(charts.speedup_chart(table, ycol, ytitle), width="stretch", key="speedup_chart")
        rate = "trained_x" if table["trained_x"].notna().any() else "throughput_x"
        if table[rate].notna().any():
            what = "trained" if rate == "trained_x" else "finished"
            st.altair_chart(charts.speedup_chart(table, rate, f"{what} samples/s vs S=1 (x)"),
                            width="stretch", key="speedup_throughput")
    with right:
        st.subheader("Paper Table 1")
        t1 = paper_ref.table1()
        st.dataframe(t1, hide_index=True, key="speedup_paper")
        st.altair_chart(charts.paper_table1_chart(t1), width="stretch", key="speedup_paper_chart")
        setting = paper_ref.TABLE1_SETTING
        st.caption(f"{setting.get('model')}, {setting.get('max_response_len')} token outputs. "
                   f"{paper_ref.CITATION}.")
    with st.expander("Per run"):
        names = frames.labels_of(members)
        per_run = stats.assign(run=stats["run_id"].map(names))
        meta = members[["run_id", seg_col]].rename(columns={seg_col: "segments"})
        bat = frames.param_col("rollout.batching")
        if bat in members:
            meta = meta.assign(batching=members[bat].to_numpy())
        st.dataframe(per_run.merge(meta, on="run_id"), hide_index=True, key="speedup_runs")


if __name__ == "__main__":
    render()
