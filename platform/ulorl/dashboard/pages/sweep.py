"""Sweep: parallel coordinates over params and objective, parameter importance (Spearman, and
Optuna's when a study storage is given), optimization history."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import streamlit as st

from ulorl.dashboard import charts, frames, ui
from ulorl.tracking import schema

OPTUNA_ENV = "ULORL_OPTUNA_STORAGE"
# Below this many finished search trials importance numbers are mostly noise (ties, 4-point
# rank correlations): the page says so instead of drawing bars.
MIN_TRIALS_FOR_IMPORTANCE = 8
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


def sweep_options(runs: pd.DataFrame, train: pd.DataFrame) -> list[str]:
    """What the page can show, newest first: sweep parent run ids (each run of a sweep is its own
    entry, even when several share the sweep's name), then ``config: <yaml stem>`` groups of two
    or more training runs outside any sweep."""
    parents = runs[runs["kind"] == "sweep"]
    if "start_time" in parents:
        parents = parents.sort_values("start_time", ascending=False, kind="stable")
    with_trials = set(train["parent_run_id"].dropna())
    out = [r for r in parents["run_id"] if r in with_trials]
    loose = train[~train["parent_run_id"].isin(list(parents["run_id"]))]
    groups = frames.sweep_groups(loose.assign(sweep=None))
    sizes = groups.value_counts()
    out += sorted(g for g in sizes[sizes >= 2].index)
    return out


def option_label(runs: pd.DataFrame, train: pd.DataFrame, option: str) -> str:
    """``mpt_threshold · 2026-12-01 10:12 · 8ffbe956 (4 trials)`` for a parent run; groups as is."""
    row = runs[runs["run_id"] == option]
    if row.empty:
        return option
    r = row.iloc[0]
    name = r.get("sweep_tag") if isinstance(r.get("sweep_tag"), str) and r.get("sweep_tag") else r["run_name"]
    start = r.get("start_time")
    when = start.strftime("%Y-%m-%d %H:%M:%S") if isinstance(start, pd.Timestamp) else "?"
    n = int((train["parent_run_id"] == option).sum())
    return f"{name} · {when} · {option[:8]} ({n} trials)"


def trials_of(runs: pd.DataFrame, train: pd.DataFrame, option: str) -> tuple[pd.DataFrame, Optional[pd.Series]]:
    """(training runs of the chosen sweep run or config group, the sweep parent row or None)."""
    row = runs[runs["run_id"] == option]
    if not row.empty:
        return train[train["parent_run_id"] == option], row.iloc[0]
    parents = set(runs.loc[runs["kind"] == "sweep", "run_id"])
    loose = train[~train["parent_run_id"].isin(list(parents))]
    return loose[frames.sweep_groups(loose.assign(sweep=None)) == option], None


def search_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials proposed by the searcher: baseline and re-run trials (tag ``ulorl.trial_role``) left out."""
    col = f"tags.{schema.ROLE_TAG}"
    if col not in trials:
        return trials
    return trials[trials[col].isna() | (trials[col] == "search")]


def trial_status(trials: pd.DataFrame) -> pd.Series:
    """Each trial's status as the ranking shows it: ``PRUNED (<rule>, step N)`` for a trial the sweep's
    scheduler stopped early (tags ``ulorl.pruned*``; its run is KILLED), the run's status otherwise."""
    flag, reason, step = (f"tags.{t}" for t in (schema.PRUNED_TAG, schema.PRUNED_REASON_TAG, schema.PRUNED_STEP_TAG))
    if flag not in trials:
        return trials["status"]
    pruned = trials[flag] == "true"
    why = trials.get(reason, pd.Series("", index=trials.index)).fillna("").astype(str)
    at = trials.get(step, pd.Series("", index=trials.index)).fillna("").astype(str)
    return trials["status"].where(~pruned, "PRUNED (" + why + ", step " + at + ")")


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
def optuna_summary(storage: str, study_name: str) -> tuple[int, Optional[float]]:
    """(completed trials, best value) of a single-objective study."""
    import optuna

    study = optuna.load_study(study_name=study_name, storage=storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = study.best_value if done and len(study.directions) == 1 else None
    return len(done), best


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
    options = sweep_options(runs, train)
    if not options:
        ui.empty_state("No sweep (or experiment config) with two or more training runs yet.", ui.SWEEP_HINT)
    option = st.selectbox("Sweep run (newest first; or experiment config for runs outside a sweep)", options,
                          key="sweep_group", format_func=lambda o: option_label(runs, train, o))
    trials, parent = trials_of(runs, train, option)
    hints = parent_hints(parent)
    group = option

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
    searched_trials = search_trials(trials)
    finished = searched_trials[(searched_trials["status"] == "FINISHED") & searched_trials[objective].notna()]
    enough = len(finished) >= MIN_TRIALS_FOR_IMPORTANCE
    if not enough:
        st.info(f"Importance bars are hidden: {len(finished)} finished search trial(s), fewer than "
                f"{MIN_TRIALS_FOR_IMPORTANCE}. With so few (often tied) trials a rank correlation or fANOVA "
                "score looks like a signal without being one (the numbers below are for reference only); "
                "compare trials against the baseline on the Benchmarks page (difference vs baseline) or in "
                "the sweep's `sweep/ranking.csv`.")
    left, right = st.columns(2)
    with left:
        imp = frames.param_importance(finished, params, objective)
        if enough and imp["spearman"].notna().any():
            st.altair_chart(charts.importance_chart(imp), width="stretch", key="sweep_importance")
        elif enough:
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
                    n_trials, best = optuna_summary(storage, name)
                    own = " from this sweep run's study" if hints.get("optuna_storage") == storage else ""
                    st.caption(f"Optuna study `{name}`{own}: {n_trials} trials, best {best:.4g}"
                               if best is not None else f"Optuna study `{name}`{own}: {n_trials} trials")
                    oimp = optuna_importance(storage, name)
                    if enough:
                        st.altair_chart(charts.importance_chart(oimp, "importance", "Optuna importance"),
                                        width="stretch", key="sweep_optuna_chart")
                    st.dataframe(oimp, hide_index=True, key="sweep_optuna_table")
            except Exception as exc:  # a wrong URL or a study too small for importance
                st.warning(f"Optuna importance unavailable: {type(exc).__name__}: {exc}")
        else:
            st.caption(f"Give an Optuna storage URL (or set ${OPTUNA_ENV}) to add Optuna's fANOVA importance.")

    st.subheader("Optimization history (search trials)")
    hist = frames.optimization_history(search_trials(trials), objective, mode)
    if hist.empty:
        st.info(f"No trial logged `{title}` yet.")
    else:
        st.altair_chart(charts.history_chart(hist, title), width="stretch", key="sweep_history")
    status = trial_status(trials)
    pruned = status[status.str.startswith("PRUNED")]
    if not pruned.empty:
        st.caption(f"{len(pruned)} search trial(s) pruned by the sweep's scheduler (status PRUNED in the table "
                   "below: rule and last step; their objective is the value when stopped, the ranking lists "
                   "them after the finished trials and never picks one as best).")
    with st.expander("Trials", expanded=not pruned.empty):
        trials = trials.assign(run=frames.label_series(trials), status=status)
        role = f"tags.{schema.ROLE_TAG}"
        cols = (["run", "run_id", "status"] + ([role] if role in trials else [])
                + [frames.param_col(p) for p in params] + [objective])
        st.dataframe(trials[[c for c in cols if c in trials]], hide_index=True, key="sweep_trials")


if __name__ == "__main__":
    render()
