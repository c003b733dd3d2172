"""Sweep: parallel coordinates over params and objective, parameter importance (Spearman, and
Optuna's when a study storage is given), optimization history."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import streamlit as st

from ulorl.dashboard import charts, frames, ui

OPTUNA_ENV = "ULORL_OPTUNA_STORAGE"
OBJECTIVE_PREFERENCE = (
    "best.eval/heldout/avg_at_k", "metrics.eval/heldout/avg_at_k", "best.train/reward_mean",
    "metrics.train/reward_mean",
)


def objective_columns(trials: pd.DataFrame, declared: Optional[str] = None) -> list[str]:
    """Metric columns with a value in at least one trial: the sweep's declared metric first,
    then the preferred objectives, then the rest."""
    cols = [c for c in trials.columns if c.startswith(("metrics.", "best.")) and trials[c].notna().any()]
    pref = ((f"metrics.{declared}", f"best.{declared}") if declared else ()) + OBJECTIVE_PREFERENCE
    first = list(dict.fromkeys(c for c in pref if c in cols))
    return first + sorted(c for c in cols if c not in first)


def sweep_parent(runs: pd.DataFrame, group: str) -> Optional[pd.Series]:
    """The sweep parent run of a group (kind sweep, ulorl.sweep tag or name == group), if any."""
    parents = runs[(runs["kind"] == "sweep")
                   & ((runs.get("sweep_tag") == group) | (runs["run_name"] == group))]
    return parents.iloc[0] if len(parents) else None


def parent_hints(parent: Optional[pd.Series]) -> dict[str, Any]:
    """What ``ulorl-sweep`` records on its parent run beyond the schema (all optional):
    params ``space.<key>`` (searched keys), ``sweep.metric`` / ``sweep.mode``, and tag
    ``ulorl.sweep_dir`` whose ``optuna.db`` holds the Optuna study named like the sweep."""
    if parent is None:
        return {}
    hints: dict[str, Any] = {
        "space": [c[len("params.space."):] for c, v in parent.items() if c.startswith("params.space.") and pd.notna(v)],
    }
    metric, mode = parent.get("params.sweep.metric"), parent.get("params.sweep.mode")
    if isinstance(metric, str) and metric and not metric.startswith("["):
        hints["metric"] = metric
    if mode in ("max", "min"):
        hints["mode"] = mode
    sweep_dir = parent.get("tags.ulorl.sweep_dir")
    if isinstance(sweep_dir, str) and (Path(sweep_dir) / "optuna.db").is_file():
        hints["optuna_storage"] = f"sqlite:///{Path(sweep_dir) / 'optuna.db'}"
        hints["study"] = parent.get("sweep_tag")
    return hints


@st.cache_data(ttl=60, show_spinner="Reading the Optuna study ...")
def optuna_importance(storage: str, study_name: str) -> pd.DataFrame:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=storage)
    imp = optuna.importance.get_param_importances(study)
    return pd.DataFrame({"param": list(imp), "importance": list(imp.values())})


@st.cache_data(ttl=60, show_spinner=False)
def optuna_studies(storage: str) -> list[str]:
    import optuna

    return [s.study_name for s in optuna.get_all_study_summaries(storage=storage)]


def render() -> None:
    st.title("Sweep")
    runs = ui.load_runs()
    train = ui.of_kind(runs, "train")
    if train.empty:
        ui.empty_state("No sweep trials in this store yet.", ui.SWEEP_HINT)
    groups = frames.sweep_groups(train)
    sizes = groups.value_counts()
    options = sorted(sizes[sizes >= 2].index, key=lambda g: (g.startswith("config: "), g))
    if not options:
        ui.empty_state("No sweep (or experiment config) with two or more training runs yet.", ui.SWEEP_HINT)
    group = st.selectbox("Sweep (or experiment config for runs outside a sweep)", options, key="sweep_group")
    trials = train[groups == group]
    hints = parent_hints(sweep_parent(runs, group))

    objectives = objective_columns(trials, hints.get("metric"))
    if not objectives:
        ui.empty_state(f"The trials of `{group}` logged no metrics yet.", ui.SWEEP_HINT)
    c1, c2 = st.columns([3, 1])
    objective = c1.selectbox("Objective", objectives, key=f"sweep_objective_{group}",
                             format_func=lambda c: c.replace("metrics.", "final ").replace("best.", "best "))
    mode = c2.radio("Direction", ["max", "min"], key=f"sweep_mode_{group}", horizontal=True,
                    index=1 if hints.get("mode") == "min" else 0)
    keys = frames.param_keys(trials)
    searched = [k for k in hints.get("space", []) if k in keys]
    default = searched or frames.varying_params(trials)[:8]
    params = st.multiselect("Parameters", keys, default=default, key=f"sweep_params_{group}")
    title = objective.split(".", 1)[-1]

    st.subheader("Parallel coordinates")
    long = frames.parallel_frame(trials, params, objective)
    if long.empty or not params:
        st.info("Choose parameters that vary across the trials (none vary yet)." if not params
                else f"No trial logged `{title}` yet.")
    else:
        st.altair_chart(charts.parallel_chart(long, title), width="stretch", key="sweep_parallel")
        st.caption("Each line is a trial; every axis is scaled to [0, 1] over the trials "
                   "(categories evenly spaced); hover for raw values.")

    st.subheader("Parameter importance")
    left, right = st.columns(2)
    with left:
        imp = frames.param_importance(trials, params, objective)
        if imp["spearman"].notna().any():
            st.altair_chart(charts.importance_chart(imp), width="stretch", key="sweep_importance")
        else:
            st.info("Spearman correlation needs at least 3 trials with a varying parameter and objective.")
        st.dataframe(imp, hide_index=True, key="sweep_importance_table")
    with right:
        storage = st.text_input("Optuna storage URL (optional)",
                                value=hints.get("optuna_storage") or os.environ.get(OPTUNA_ENV, ""),
                                key=f"sweep_optuna_storage_{group}", placeholder="sqlite:////abs/path/optuna.db")
        if storage:
            try:
                studies = optuna_studies(storage)
                if not studies:
                    st.info("No studies in that storage.")
                else:
                    study = hints.get("study")
                    name = st.selectbox("Study", studies, key=f"sweep_study_{group}",
                                        index=studies.index(study) if study in studies else 0)
                    oimp = optuna_importance(storage, name)
                    st.altair_chart(charts.importance_chart(oimp, "importance", "Optuna importance"),
                                    width="stretch", key="sweep_optuna_chart")
            except Exception as exc:  # a wrong URL or a study too small for importance
                st.warning(f"Optuna importance unavailable: {type(exc).__name__}: {exc}")
        else:
            st.caption(f"Give an Optuna storage URL (or set ${OPTUNA_ENV}) to add Optuna's fANOVA importance.")

    st.subheader("Optimization history")
    hist = frames.optimization_history(trials, objective, mode)
    if hist.empty:
        st.info(f"No trial logged `{title}` yet.")
    else:
        st.altair_chart(charts.history_chart(hist, title), width="stretch", key="sweep_history")
    with st.expander("Trials"):
        cols = ["run_name", "status"] + [frames.param_col(p) for p in params] + [objective]
        st.dataframe(trials[[c for c in cols if c in trials]], hide_index=True, key="sweep_trials")


if __name__ == "__main__":
    render()
