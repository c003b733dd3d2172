"""The dashboard's MLflow reads, against a real SQLite store written with the MLflow client
(values chosen by hand in tests/dashboard_stores.py)."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from dashboard_stores import SAMPLE_RECORDS, SPEED_OBJECTIVE, build_written_store, cached_store, fresh_db
from ulorl.dashboard import frames, store


@pytest.fixture(scope="session")
def written(tmp_path_factory):
    return cached_store(tmp_path_factory, "written", build_written_store)


@pytest.fixture(scope="session")
def client(written):
    return MlflowClient(tracking_uri=written["uri"])


@pytest.fixture(scope="session")
def runs(client):
    return store.load_runs(client)


def test_load_runs_kinds_parents_best_and_steps(runs, written):
    assert runs["kind"].value_counts().to_dict() == {"train": 7, "eval": 2, "sweep": 1}
    trials = runs[runs["parent_run_id"] == written["sweep"]]
    assert len(trials) == 5
    assert set(trials["parent"]) == {"segments-sweep"} and set(trials["sweep"]) == {"segments"}
    assert runs.set_index("run_id").at[written["sweep"], "sweep"] == "segments"   # its own tag
    quick = runs[runs["config"] == "quickstart"]
    assert quick["sweep"].isna().all()
    s4 = runs.set_index("run_id").loc[written["trials"]["4-compact"]]
    assert s4["best.train/reward_mean"] == SPEED_OBJECTIVE[(4, "compact")]      # max of 0.1, 0.2, 0.45
    assert s4["best.eval/heldout/avg_at_k"] == SPEED_OBJECTIVE[(4, "compact")]
    assert s4["steps"] == 3 and s4["params.rollout.segments"] == "4" and s4["status"] == "FINISHED"
    assert s4["duration_s"] == 10.0
    ev = runs.set_index("run_id").loc[written["eval_base"]]
    assert ev["model_label"] == "base" and ev["benchmark"] == "aime2025"


def test_histories_long_frame(client, written):
    rid = written["mpt_dynamic"]
    h = store.histories(client, [rid], ["train/entropy", "missing/metric"])
    assert list(h.columns) == ["run_id", "metric", "step", "value", "timestamp"]
    assert list(h["step"]) == [1, 2, 3] and list(h["value"]) == [0.30, 0.22, 0.21]
    assert store.histories(client, [rid], ["missing/metric"]).empty


def test_samples_checkpoints_and_text_artifacts(client, written):
    rid = written["mpt_dynamic"]
    assert store.list_sample_files(client, rid) == [(2, "samples/step_000002.jsonl")]
    assert store.read_jsonl_artifact(client, rid, "samples/step_000002.jsonl") == SAMPLE_RECORDS
    ck = store.list_checkpoints(client, rid)
    assert ck.to_dict("records") == [{"name": "final", "path": "checkpoints/final", "files": 2, "size_mb": 0.002}]
    assert store.read_text_artifact(client, rid, "config/resolved.yaml") == "name: quickstart\n"
    assert store.read_text_artifact(client, rid, "nope.txt") is None
    other = written["mpt_off"]
    assert store.list_sample_files(client, other) == [] and store.list_checkpoints(client, other).empty


def test_speedup_from_store_matches_hand_values(client, runs, written):
    members = runs[runs["parent_run_id"] == written["sweep"]]
    hist = store.histories(client, members["run_id"], ["time/step_s", "rollout/finished"])
    t = frames.speedup_table(frames.rollout_stats(hist), members).set_index(["batching", "segments"])
    assert t.loc[("compact", 2), "step_speedup"] == 2.0 and t.loc[("compact", 4), "step_speedup"] == 4.0
    assert t.loc[("compact", 4), "throughput_x"] == 4.0 and t.loc[("static", 4), "step_speedup"] == 2.0
    assert frames.sweep_groups(members).unique().tolist() == ["segments"]


def test_missing_and_empty_stores(tmp_path):
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    assert not store.store_exists(missing)
    assert not (tmp_path / "none.db").exists()
    uri = fresh_db(tmp_path / "empty")
    c = MlflowClient(tracking_uri=uri)
    c.create_experiment("ulorl")
    assert store.store_exists(uri)
    assert store.load_runs(c).empty
