"""Cached data access for the pages: one MlflowClient per URI, query results with a TTL.

Cached functions take the tracking URI (a string) so the cache key is the store; run id lists
are passed as tuples (hashable, order kept).
"""

from __future__ import annotations

from typing import Any, Optional

import pandas as pd
import streamlit as st
from mlflow import MlflowClient

from ulorl.dashboard import store
from ulorl.tracking.read import PerProblemReader

QUERY_TTL_S = 30          # runs and metrics change while training: re-query at most every 30 s
ARTIFACT_TTL_S = 600      # artifacts of a step never change once written


@st.cache_resource(show_spinner=False)
def client(uri: str) -> MlflowClient:
    return store.open_client(uri)


@st.cache_data(ttl=QUERY_TTL_S, show_spinner="Loading runs ...")
def runs(uri: str) -> pd.DataFrame:
    return store.load_runs(client(uri))


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def histories(uri: str, run_ids: tuple[str, ...], keys: tuple[str, ...]) -> pd.DataFrame:
    return store.histories(client(uri), run_ids, keys)


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def metric_keys(uri: str, run_ids: tuple[str, ...]) -> list[str]:
    """Union of the metric keys logged by the given runs, sorted."""
    keys: set[str] = set()
    c = client(uri)
    for run_id in run_ids:
        keys.update(c.get_run(run_id).data.metrics)
    return sorted(keys)


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def checkpoints(uri: str, run_id: str) -> pd.DataFrame:
    return store.list_checkpoints(client(uri), run_id)


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def sample_files(uri: str, run_id: str) -> list[tuple[int, str]]:
    return store.list_sample_files(client(uri), run_id)


@st.cache_data(ttl=ARTIFACT_TTL_S, show_spinner="Loading samples ...")
def samples(uri: str, run_id: str, path: str) -> list[dict[str, Any]]:
    return store.read_jsonl_artifact(client(uri), run_id, path)


@st.cache_data(ttl=ARTIFACT_TTL_S, show_spinner=False)
def text_artifact(uri: str, run_id: str, path: str) -> Optional[str]:
    return store.read_text_artifact(client(uri), run_id, path)


@st.cache_data(ttl=QUERY_TTL_S, show_spinner=False)
def per_problem(uri: str, run_id: str, bench: str) -> dict[str, float]:
    """Per-problem accuracy of a run on ``bench``: an eval run's ``eval/<bench>_per_problem.csv``, else a
    training run's last periodic one; {} when neither exists or it cannot be read (a fresh reader: the
    listing is re-read once the TTL ends, so evals a running training logs since show up)."""
    return PerProblemReader(client(uri)).scores(run_id, bench, whole_run=True, strict=False)


def clear() -> None:
    st.cache_data.clear()
