"""Shared page helpers: the tracking URI, run loading with empty states, the run selection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import pandas as pd
import streamlit as st

from ulorl.dashboard import cache, store
from ulorl.tracking import resolve_tracking_uri

URI_KEY = "tracking_uri"          # session key: the store the pages read
SELECTION_KEY = "selected_runs"   # session key: run ids chosen on any page, shared by all pages

TRAIN_HINT = "ulorl-train experiments/quickstart.yaml"
EVAL_HINT = ("ulorl-eval --benchmark heldout --k 4 --model runs:/<train run id>/checkpoints/final "
             "--parent-run-id <train run id>")
SWEEP_HINT = "ulorl-sweep sweeps/mpt_threshold.yaml    # any spec under sweeps/"
SEGMENTS_HINT = ("ulorl-sweep sweeps/segments.yaml    # or: ulorl-train experiments/quickstart.yaml "
                 "rollout.segments=1 (then 2, 4 ...)")


def tracking_uri() -> str:
    uri = st.session_state.get(URI_KEY)
    return uri or resolve_tracking_uri()


def empty_state(what: str, command: str, stop: bool = True) -> None:
    """An info box naming the command that creates the missing runs; stops the page."""
    st.info(f"{what}\n\nCreate some with:\n\n```\n{command}\n```\n\nTracking URI: `{tracking_uri()}`", icon="ℹ️")
    if stop:
        st.stop()


def load_runs() -> pd.DataFrame:
    """All runs of the store, or an empty state / error box and ``st.stop()``."""
    uri = tracking_uri()
    if not store.store_exists(uri):
        path = store.sqlite_path(uri)
        folder = "" if path is None or path.parent.is_dir() else f" (its folder `{path.parent}` does not exist either)"
        empty_state(f"No MLflow store at `{path}` yet{folder}.",
                    f"{'mkdir -p ' + str(path.parent) + ' && ' if folder and path else ''}"
                    f"{TRAIN_HINT} --tracking-uri {uri}")
    try:
        runs = cache.runs(uri)
    except Exception as exc:  # an unreachable server or a broken DB: say so, no traceback
        st.error(f"Could not read the MLflow store at `{uri}`: {type(exc).__name__}: {exc}")
        st.stop()
    if runs.empty:
        empty_state("The store has no runs yet.", TRAIN_HINT)
    return runs


def of_kind(runs: pd.DataFrame, *kinds: str) -> pd.DataFrame:
    return runs[runs["kind"].isin(kinds)]


def run_names(runs: pd.DataFrame) -> dict[str, str]:
    """run_id -> display name ``name (id8)``, unique even when names repeat."""
    return {r: f"{n} ({r[:8]})" for r, n in zip(runs["run_id"], runs["run_name"])}


def selection() -> list[str]:
    return list(st.session_state.get(SELECTION_KEY, []))


def select_runs(label: str, options: pd.DataFrame, page: str, default: Optional[Sequence[str]] = None,
                help: Optional[str] = None) -> list[str]:
    """A multiselect over ``options`` runs that starts from (and writes back) the shared selection.

    The first time it renders on a page it shows the shared selection restricted to ``options``
    (or ``default`` when that is empty); what the user picks becomes the shared selection.
    """
    key = f"_select_{page}"
    valid = list(options["run_id"])
    names = run_names(options)
    if key in st.session_state:
        st.session_state[key] = [r for r in st.session_state[key] if r in names]
    else:
        shared = [r for r in selection() if r in names]
        st.session_state[key] = shared or [r for r in (default or []) if r in names]
    chosen = st.multiselect(label, valid, key=key, format_func=lambda r: names.get(r, r), help=help)
    # Runs this page cannot show stay selected for the pages that can.
    kept = [r for r in selection() if r not in names]
    st.session_state[SELECTION_KEY] = kept + list(chosen)
    return list(chosen)


def fmt_uri(uri: str) -> str:
    path = store.sqlite_path(uri)
    return str(path) if path else uri
