"""Runs: every run with status, parent sweep, key params, final / best metrics; filter, sort,
select for the other pages, CSV export."""

from __future__ import annotations

import streamlit as st

from ulorl.dashboard import frames, ui

NONE = "(none)"


def render() -> None:
    st.title("Runs")
    runs = ui.load_runs()

    c1, c2, c3, c4 = st.columns(4)
    experiments = c1.multiselect("Experiment", sorted(runs["experiment"].dropna().unique()), key="runs_f_exp")
    kinds = c2.multiselect("Kind", sorted(runs["kind"].dropna().unique()), key="runs_f_kind",
                           help="train = ulorl-train / sweep trials, eval = ulorl-eval, sweep = sweep parents")
    statuses = c3.multiselect("Status", sorted(runs["status"].dropna().unique()), key="runs_f_status")
    text = c4.text_input("Search", key="runs_f_text", placeholder="name, run id, sweep, config")

    p1, p2 = st.columns([1, 2])
    keys = frames.param_keys(runs)
    param = p1.selectbox("Filter by param", [NONE] + keys, key="runs_f_param")
    values: list[str] = []
    if param != NONE:
        options = sorted(runs[frames.param_col(param)].dropna().astype(str).unique())
        values = p2.multiselect(f"{param} in", options, key="runs_f_param_values")

    filtered = frames.filter_runs(runs, experiments, kinds, statuses, None if param == NONE else param, values, text)
    table = frames.runs_table(filtered)

    s1, s2 = st.columns([2, 1])
    columns = [c for c in table.columns if c != "run_id"]
    sort_col = s1.selectbox("Sort by", columns, index=columns.index("start_time"), key="runs_sort")
    descending = s2.toggle("Descending", value=True, key="runs_desc")
    table = table.sort_values(sort_col, ascending=not descending, na_position="last", kind="stable")

    st.caption(f"{len(table)} of {len(runs)} runs shown · store `{ui.fmt_uri(ui.tracking_uri())}`")
    event = st.dataframe(
        table, hide_index=True, key="runs_table", on_select="rerun", selection_mode="multi-row",
        column_config={
            "start_time": st.column_config.DatetimeColumn("start", format="YYYY-MM-DD HH:mm:ss"),
            "duration_s": st.column_config.NumberColumn("duration (s)", format="%.1f"),
        },
    )
    st.download_button("Download CSV", table.to_csv(index=False).encode(), file_name="ulorl_runs.csv",
                       mime="text/csv", key="runs_csv")

    st.subheader("Selection")
    st.caption("The selected runs are what the Curves, Benchmarks and Run detail pages show first.")
    checked = list(table.iloc[list(event.selection.rows)]["run_id"]) if event and event.selection.rows else []
    b1, b2, b3 = st.columns(3)
    b1.button("Select all shown", key="runs_select_shown",
              on_click=lambda: st.session_state.update({"_select_runs": list(table["run_id"])}))
    b2.button(f"Select checked rows ({len(checked)})", key="runs_select_checked", disabled=not checked,
              on_click=lambda: st.session_state.update({"_select_runs": checked}))
    b3.button("Clear selection", key="runs_select_clear",
              on_click=lambda: st.session_state.update({"_select_runs": [], ui.SELECTION_KEY: []}))
    ui.select_runs("Selected runs", runs, page="runs")


if __name__ == "__main__":
    render()
