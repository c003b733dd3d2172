"""Run detail's "Train / inference mismatch" panel and the Curves section (ulorl.dashboard.mismatch_panel): the
frames by hand, and the pages through Streamlit's AppTest on a store written with the real MLflow client."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from dashboard_stores import new_store
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from streamlit.testing.v1 import AppTest

from ulorl.dashboard import PAGES_DIR
from ulorl.dashboard.mismatch_panel import split_chart, split_frame, split_table
from ulorl.tracking import schema

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
M = schema.mismatch_metric

# Two updates of one run with max_response_len 16 (buckets of 2 tokens). Step 1 measured 4 tokens of
# segment 0 (positions 0-1 and 2-3), step 2 measured 2 tokens of segment 0 and 6 of segment 1.
VALUES: dict[str, list[float]] = {
    M("tokens"): [4, 8], M("abs_mean"): [0.01, 0.02], M("abs_max"): [0.05, 0.03], M("k3_kl"): [1e-4, 3e-4],
    M("ratio_out_frac"): [0.0, 0.125], M("coverage"): [1.0, 0.5], M("seq_logratio_min"): [-0.2, -0.4],
    M("tokens", segment=0): [4, 2], M("abs_mean", segment=0): [0.01, 0.05], M("abs_max", segment=0): [0.05, 0.06],
    M("k3_kl", segment=0): [1e-4, 2e-4], M("ratio_out_frac", segment=0): [0.0, 0.5],
    M("tokens", bucket=0): [2, 8], M("abs_mean", bucket=0): [0.02, 0.01], M("abs_max", bucket=0): [0.05, 0.02],
    M("k3_kl", bucket=0): [2e-4, 1e-4], M("ratio_out_frac", bucket=0): [0.0, 0.0],
    schema.CORRECTION_PREFIX + "rejected_frac": [0.0, 0.25], schema.CORRECTION_PREFIX + "weight_mean": [1.0, 0.9],
}
SEG1 = {M("tokens", segment=1): 6, M("abs_mean", segment=1): 0.01, M("abs_max", segment=1): 0.03,
        M("k3_kl", segment=1): 3e-4, M("ratio_out_frac", segment=1): 0.0}   # step 2 only


def _hist() -> pd.DataFrame:
    rows = [{"run_id": "r", "metric": k, "step": i + 1, "value": float(v), "timestamp": 0}
            for k, vals in VALUES.items() for i, v in enumerate(vals)]
    rows += [{"run_id": "r", "metric": k, "step": 2, "value": float(v), "timestamp": 0} for k, v in SEG1.items()]
    return pd.DataFrame(rows, columns=["run_id", "metric", "step", "value", "timestamp"])


def test_split_table_folds_the_updates_by_hand():
    table = split_table(_hist(), max_response_len=16).set_index("split")
    assert list(table.index) == ["segment 0", "segment 1", "tokens 0-2"]
    # segment 0: 4 + 2 tokens; mean |delta| weighted by tokens (4 * 0.01 + 2 * 0.05) / 6; max of the max
    assert table.loc["segment 0", "tokens"] == 6
    assert table.loc["segment 0", "mean |delta|"] == pytest.approx((4 * 0.01 + 2 * 0.05) / 6)
    assert table.loc["segment 0", "max |delta|"] == pytest.approx(0.06)
    assert table.loc["segment 0", "ratio outside [0.5, 2]"] == pytest.approx(2 * 0.5 / 6)
    assert table.loc["segment 1", "tokens"] == 6 and table.loc["segment 1", "k3 KL"] == pytest.approx(3e-4)
    assert table.loc["tokens 0-2", "mean |delta|"] == pytest.approx((2 * 0.02 + 8 * 0.01) / 10)
    frame = split_frame(_hist())
    assert set(frame["split"]) == {"segment", "position"}
    assert len(frame[(frame["split"] == "segment") & (frame["stat"] == "abs_mean")]) == 3   # seg 0 x 2, seg 1 x 1
    assert split_chart(frame).to_dict()["spec"]["mark"]["type"] == "line"
    assert split_table(_hist().iloc[:0], 16).empty


def test_detail_page_shows_the_panel_and_curves_the_section(monkeypatch, tmp_path_factory):
    uri = new_store(tmp_path_factory, "mismatch")
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("ulorl")
    rid = client.create_run(exp, run_name="mismatched", tags={schema.KIND_TAG: "train"}).info.run_id
    t0 = 1_700_000_000_000
    metrics = [Metric(k, float(v), t0 + i, i + 1) for k, vals in VALUES.items() for i, v in enumerate(vals)]
    metrics += [Metric(k, float(v), t0 + 1, 2) for k, v in SEG1.items()]
    client.log_batch(rid, metrics=metrics, params=[Param("rollout.max_response_len", "16")])
    client.set_terminated(rid)
    bare = client.create_run(exp, run_name="no-mismatch", tags={schema.KIND_TAG: "train"}).info.run_id
    client.log_metric(bare, "train/entropy", 0.2, step=1)
    client.set_terminated(bare)

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    at.query_params["run"] = rid
    at.switch_page(str(PAGES_DIR / "detail.py")).run()
    assert not at.exception, [e.value for e in at.exception]
    tables = [d.value for d in at.dataframe if {"split", "mean |delta|", "tokens"} <= set(d.value.columns)]
    assert len(tables) == 1 and tables[0].set_index("split").loc["segment 0", "tokens"] == 6
    assert "tokens 0-2" in set(tables[0]["split"])                   # the bucket span from rollout.max_response_len
    at.radio(key=f"detail_mismatch_stat_{rid}").set_value("k3_kl").run()
    assert not at.exception
    at.selectbox(key="detail_run").set_value(bare).run()
    assert not at.exception
    assert any("logged no mismatch" in c.value for c in at.caption)

    at.switch_page(str(PAGES_DIR / "curves.py")).run()
    at.multiselect(key="_select_curves").set_value([rid]).run()
    assert not at.exception, [e.value for e in at.exception]
    assert "mismatch/abs_mean" in at.selectbox(key="curves_metric").options
    at.selectbox(key="curves_metric").set_value("mismatch/abs_mean").run()
    assert not at.exception
    # the main chart and the mismatch small multiples (this run has no masking or pool metrics)
    assert len(at.get("vega_lite_chart")) == 2
