"""Run detail's "Where long outputs go" panel (ulorl.dashboard.audit_panel): its frames by hand, and the
page through Streamlit's AppTest on a store written with the real MLflow client."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from dashboard_stores import new_store
from mlflow import MlflowClient
from mlflow.entities import Metric
from streamlit.testing.v1 import AppTest

from ulorl.dashboard import PAGES_DIR
from ulorl.dashboard.audit_panel import audit_chart, audit_frame, audit_keys, audit_table
from ulorl.tracking import schema
from ulorl.tracking.schema import audit_metric

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"

# Two steps of one run's audit: 8 samples started per step; step 1 trains 3 (lengths 10 / 40 / 64),
# step 2 filters 2 (64 / 64); one sample is truncated at the budget at each step; 5 then 8 in the pool.
VALUES: dict[str, list[float]] = {
    schema.AUDIT_STARTED: [8, 16],
    audit_metric("trained", "count"): [3, 0], audit_metric("trained", "total"): [3, 3],
    audit_metric("trained", "len_p50"): [40], audit_metric("trained", "len_p90"): [59.2],
    audit_metric("trained", "len_max"): [64], audit_metric("trained", "token_share"): [0.5, 0.3],
    audit_metric("filtered", "count"): [0, 2], audit_metric("filtered", "total"): [0, 2],
    audit_metric("filtered", "token_share"): [0.0, 0.25],
    audit_metric("truncated", "count"): [1, 1], audit_metric("truncated", "total"): [1, 2],
    audit_metric("truncated", "len_max"): [64, 64], audit_metric("truncated", "token_share"): [0.27, 0.33],
    audit_metric("stale", "count"): [0, 0], audit_metric("stale", "total"): [0, 0],
    audit_metric("lost_resume", "count"): [0, 0], audit_metric("lost_resume", "total"): [0, 0],
    audit_metric("unfinished", "count"): [5, 8], audit_metric("unfinished", "len_max"): [30, 48],
    audit_metric("unfinished", "token_share"): [0.5, 0.45],
}


def _hist(values: dict[str, list[float]]) -> pd.DataFrame:
    rows = []
    for key, vals in values.items():
        # len_* of trained exist only at step 1 (count 0 at step 2 logs no quantiles)
        for i, v in enumerate(vals):
            rows.append({"run_id": "r", "metric": key, "step": i + 1, "value": float(v), "timestamp": 0})
    return pd.DataFrame(rows, columns=["run_id", "metric", "step", "value", "timestamp"])


def test_audit_frame_and_table_by_hand():
    hist = _hist(VALUES)
    frame = audit_frame(hist)
    trained = frame[frame["fate"] == "trained"].set_index("quantile")["length"]
    assert trained.to_dict() == {"p50": 40.0, "p90": 59.2, "max": 64.0}
    assert set(frame[frame["fate"] == "still decoding (pool)"]["step"]) == {1, 2}
    table = audit_table(hist).set_index("fate")
    # samples: totals at the last step for final / completion fates, the last count for the pool
    assert table.loc["trained", "samples"] == 3 and table.loc["trained", "token share"] == pytest.approx(0.3)
    assert table.loc["filtered (dynamic sampling)", "samples"] == 2
    assert math.isnan(table.loc["filtered (dynamic sampling)", "longest"])
    assert table.loc["truncated at the length budget", "samples"] == 2
    assert table.loc["still decoding (pool)", "samples"] == 8 and table.loc["still decoding (pool)", "longest"] == 48
    assert table.loc["still decoding (pool)", "kind"] == "pool (now)"
    assert "dropped as stale" not in table.index and "lost at a resume" not in table.index   # nothing met them
    assert audit_chart(frame).to_dict()["mark"]["type"] == "line"
    assert set(VALUES) <= set(audit_keys())
    assert audit_table(_hist({})).empty and audit_frame(_hist({})).empty


def test_detail_page_shows_the_panel(monkeypatch, tmp_path_factory):
    uri = new_store(tmp_path_factory, "audit")
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("ulorl")
    rid = client.create_run(exp, run_name="audited", tags={schema.KIND_TAG: "train"}).info.run_id
    client.log_batch(rid, metrics=[Metric(k, float(v), 1_700_000_000_000 + i, i + 1)
                                   for k, vals in VALUES.items() for i, v in enumerate(vals)])
    client.set_terminated(rid)
    bare = client.create_run(exp, run_name="no-audit", tags={schema.KIND_TAG: "train"}).info.run_id
    client.log_metric(bare, "train/entropy", 0.2, step=1)
    client.set_terminated(bare)

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    at.query_params["run"] = rid
    at.switch_page(str(PAGES_DIR / "detail.py")).run()
    assert not at.exception, [e.value for e in at.exception]
    tables = [d.value for d in at.dataframe if {"fate", "samples", "token share"} <= set(d.value.columns)]
    assert len(tables) == 1 and tables[0].set_index("fate").loc["trained", "samples"] == 3
    assert at.get("vega_lite_chart"), "no length chart"
    assert any("lost at a resume: 0" in c.value for c in at.caption)
    at.selectbox(key="detail_run").set_value(bare).run()
    assert not at.exception
    assert any("logged no length audit" in c.value for c in at.caption)
