"""Benchmarks: avg@k and pass@k with confidence intervals per run and benchmark, deltas against a
chosen baseline run, and the paper's Table 2 (and Table 3) rows for reference."""

from __future__ import annotations

import streamlit as st

from ulorl.dashboard import cache, charts, frames, paper_ref, ui
from ulorl.tracking import schema

NONE = "(none)"
PERCENT_COLS = ("avg_at_k", "pass_at_k", "ci_low", "ci_high", "delta_avg", "delta_pass", "diff", "diff_low",
                "diff_high")


def default_baseline(runs, run_ids: list[str]) -> int:
    """Index (in ``[NONE] + run_ids``) of the first run tagged as a sweep baseline, the seed the search
    trials ran with (offset 0) first; else 0."""
    col, seed_col = f"tags.{schema.ROLE_TAG}", f"tags.{schema.SEED_TAG}"
    if col not in runs:
        return 0
    roles = dict(zip(runs["run_id"], runs[col]))
    seeds = dict(zip(runs["run_id"], runs[seed_col])) if seed_col in runs else {}
    bases = [i + 1 for i, r in enumerate(run_ids) if roles.get(r) == "baseline"]
    first_seed = [i for i in bases if str(seeds.get(run_ids[i - 1], "0")) in ("0", "None", "nan")]
    return (first_seed or bases or [0])[0]


def render() -> None:
    st.title("Benchmarks")
    runs = ui.load_runs()
    table = frames.benchmark_table(runs)
    if table.empty:
        ui.empty_state("No benchmark results (`eval/<bench>/avg_at_k`) in this store yet: evaluate a "
                       "checkpoint, or train with periodic held-out eval (`eval.every`).", ui.EVAL_HINT)

    with_results = runs[runs["run_id"].isin(table["run_id"])]
    eval_first = list(with_results.sort_values(["kind", "start_time"], ascending=[True, False])["run_id"][:12])
    chosen = ui.select_runs("Runs", with_results, page="benchmarks", default=eval_first)
    c1, c2 = st.columns([3, 1])
    benches = sorted(table["bench"].unique())
    picked = c2.multiselect("Benchmarks", benches, default=benches, key="bench_benches")
    shown = table[table["run_id"].isin(chosen) & table["bench"].isin(picked)]
    if shown.empty:
        st.info("Select runs and benchmarks above.")
    else:
        names = ui.run_names(with_results)
        ids = list(dict.fromkeys(shown["run_id"]))
        baseline = c1.selectbox("Baseline run for deltas", [NONE] + ids, key="bench_baseline",
                                index=default_baseline(with_results, ids), format_func=lambda r: names.get(r, r))
        base_id = None if baseline == NONE else baseline
        out = frames.benchmark_deltas(shown, base_id)
        uri = ui.tracking_uri()
        scores = {(r, b): cache.per_problem(uri, r, b) for r, b in zip(out["run_id"], out["bench"])} if base_id else {}
        out = frames.paired_deltas(out, base_id, scores)
        pct = out.copy()
        for col in PERCENT_COLS:
            pct[col] = pct[col] * 100.0
        st.dataframe(pct.drop(columns=["run_id"]), hide_index=True, key="bench_table", column_config={
            col: st.column_config.NumberColumn(col.replace("_at_", "@") + " (%)", format="%.1f")
            for col in PERCENT_COLS
        })
        st.altair_chart(charts.benchmark_chart(pct), width="stretch", key="bench_chart")
        st.caption("Bars: avg@k (%); whiskers: the confidence interval logged by ulorl-eval "
                   "(`ci_low` / `ci_high`, a bootstrap over problems).")
        mixed = sorted(set(pct["bench"][frames.bench_series(pct) != pct["bench"]]))
        if mixed:
            st.warning(f"{', '.join(mixed)}: the selected runs were scored with different reward extraction modes "
                       "(`reward.extraction`); their bars are separate series, `<bench> [<mode>]`, and are not "
                       "comparable with each other.")
        if base_id:
            st.subheader("Difference vs baseline (paired on the same problems)")
            diffs = pct.dropna(subset=["diff"])
            if diffs.empty:
                st.info("No per-problem results to pair with the baseline (`eval/<bench>_per_problem*.csv`).")
            else:
                st.altair_chart(charts.difference_chart(diffs), width="stretch", key="bench_diff_chart")
                st.caption("Point: mean per-problem accuracy difference (run - baseline, % points) on the problems "
                           "both were evaluated on; bar: its 95 % paired bootstrap interval over problems. It "
                           "does not include training-seed noise: compare re-runs on other seeds too.")

    st.subheader("Paper Table 2 (avg@32, %)")
    st.dataframe(paper_ref.table2(), hide_index=True, key="bench_paper2")
    with st.expander("Paper Table 3: output length"):
        st.dataframe(paper_ref.table3(), hide_index=True, key="bench_paper3")
    st.caption(paper_ref.CITATION)


if __name__ == "__main__":
    render()
