"""Every dashboard page through Streamlit's AppTest: empty stores, a hand-valued store, and a
store of REAL short training / eval runs (tests/dashboard_stores.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient
from streamlit.testing.v1 import AppTest

from dashboard_stores import SPEEDUP_S4_VS_S1, build_real_store, build_written_store, cached_store, new_store
from ulorl.dashboard import PAGES_DIR

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
TIMEOUT = 120  # AppTest's default is 3 s; the first MLflow query of a session opens the DB
PAGES = ("runs", "curves", "speedup", "benchmarks", "sweep", "detail")
TITLES = {"runs": "Runs", "curves": "Curves", "speedup": "Speedup", "benchmarks": "Benchmarks",
          "sweep": "Sweep", "detail": "Run detail"}


def open_app(monkeypatch: pytest.MonkeyPatch, uri: str, page: str = "runs") -> AppTest:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
    if page != "runs":
        at.switch_page(str(PAGES_DIR / f"{page}.py")).run()
    return at


def go(at: AppTest, page: str) -> AppTest:
    return at.switch_page(str(PAGES_DIR / f"{page}.py")).run()


def assert_clean(at: AppTest, page: str) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == [TITLES[page]]


def charts(at: AppTest) -> list:
    return at.get("vega_lite_chart")


def frame(at: AppTest, *columns: str) -> pd.DataFrame:
    """The first dataframe on the page with all of ``columns`` (display-only tables carry no key)."""
    for df in at.dataframe:
        if set(columns) <= set(df.value.columns):
            return df.value
    raise AssertionError(f"no dataframe with columns {columns}")


def run_id_by_name(uri: str, name: str) -> str:
    runs = MlflowClient(tracking_uri=uri).search_runs(
        [e.experiment_id for e in MlflowClient(tracking_uri=uri).search_experiments()],
        filter_string=f"attributes.run_name = '{name}'")
    assert len(runs) == 1, name
    return runs[0].info.run_id


@pytest.fixture(scope="session")
def written(tmp_path_factory):
    return cached_store(tmp_path_factory, "written", build_written_store)


@pytest.fixture(scope="session")
def real(tmp_path_factory):
    return cached_store(tmp_path_factory, "real", build_real_store)


# ----------------------------------------------------------------------------- empty stores


@pytest.mark.parametrize("page", PAGES)
def test_missing_store_shows_empty_state(monkeypatch, tmp_path, page):
    db = tmp_path / "mlflow.db"
    at = open_app(monkeypatch, f"sqlite:///{db}", page)
    assert_clean(at, page)
    assert any("ulorl-train" in i.value for i in at.info), [i.value for i in at.info]
    assert not db.exists(), "the dashboard must not create a store"


@pytest.fixture(scope="session")
def no_runs_uri(tmp_path_factory) -> str:
    uri = new_store(tmp_path_factory, "no_runs")
    MlflowClient(tracking_uri=uri).create_experiment("ulorl")
    return uri


@pytest.mark.parametrize("page", PAGES)
def test_store_without_runs_shows_empty_state(monkeypatch, no_runs_uri, page):
    at = open_app(monkeypatch, no_runs_uri, page)
    assert_clean(at, page)
    assert any("no runs" in i.value for i in at.info)


def test_store_with_only_eval_runs_explains_what_is_missing(monkeypatch, tmp_path_factory):
    """A store whose runs do not suit a page names the command that creates the right ones."""
    uri = new_store(tmp_path_factory, "eval_only")
    c = MlflowClient(tracking_uri=uri)
    run = c.create_run(c.create_experiment("ulorl"), tags={"ulorl.kind": "eval"})
    c.set_terminated(run.info.run_id)
    for page, command in (("curves", "ulorl-train"), ("speedup", "sweeps/segments.yaml"), ("sweep", "ulorl-sweep"),
                          ("benchmarks", "ulorl-eval")):
        at = open_app(monkeypatch, uri, page)
        assert_clean(at, page)
        assert any(command in i.value for i in at.info), (page, [i.value for i in at.info])


# ----------------------------------------------------------------------------- hand-valued store


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_with_runs(monkeypatch, written, page):
    at = open_app(monkeypatch, written["uri"], page)
    assert_clean(at, page)
    if page == "runs":
        assert len(at.dataframe[0].value) == 10
        assert at.get("download_button")
    elif page == "detail":
        assert at.dataframe
    else:
        assert charts(at), f"no chart on {page}"


def test_runs_filters_change_rows(monkeypatch, written):
    at = open_app(monkeypatch, written["uri"])
    assert len(at.dataframe[0].value) == 10
    at.multiselect(key="runs_f_kind").set_value(["eval"]).run()
    assert sorted(at.dataframe[0].value["run"]) == ["eval-base", "eval-tuned"]
    at.multiselect(key="runs_f_kind").set_value(["train"]).run()
    assert len(at.dataframe[0].value) == 7
    at.selectbox(key="runs_f_param").set_value("rollout.batching").run()
    at.multiselect(key="runs_f_param_values").set_value(["static"]).run()
    assert sorted(at.dataframe[0].value["run"]) == ["S1-static", "S4-static"]
    at.text_input(key="runs_f_text").input("s4").run()
    assert list(at.dataframe[0].value["run"]) == ["S4-static"]
    assert not at.exception


def test_runs_sort_and_csv(monkeypatch, written):
    at = open_app(monkeypatch, written["uri"])
    at.multiselect(key="runs_f_kind").set_value(["train"]).run()
    at.selectbox(key="runs_sort").set_value("segments").run()
    at.toggle(key="runs_desc").set_value(False).run()
    segs = list(at.dataframe[0].value["segments"])
    assert segs == sorted(segs) and segs[0] == 1
    csv = at.get("download_button")[0]
    assert csv.label == "Download CSV"


def test_selection_is_shared_with_curves_and_detail(monkeypatch, written):
    at = open_app(monkeypatch, written["uri"])
    rid = written["mpt_dynamic"]
    at.multiselect(key="_select_runs").set_value([rid]).run()
    go(at, "curves")
    assert_clean(at, "curves")
    assert at.multiselect(key="_select_curves").value == [rid]
    data = frame(at, "run_id", "raw", "value")
    assert set(data["run_id"]) == {rid} and list(data["raw"]) == [0.30, 0.22, 0.21]   # train/entropy
    go(at, "detail")
    assert at.selectbox(key="detail_run").value == rid


def test_curves_controls(monkeypatch, written):
    at = open_app(monkeypatch, written["uri"], "curves")
    at.multiselect(key="_select_curves").set_value([written["mpt_dynamic"], written["mpt_off"]]).run()
    at.slider(key="curves_smooth").set_value(0.5).run()
    smoothed = frame(at, "run_id", "raw", "value")
    dyn = smoothed[smoothed["run_id"] == written["mpt_dynamic"]]
    assert list(dyn["value"]) == pytest.approx([0.30, 0.26, 0.235])                   # EMA 0.5 by hand
    at.checkbox(key="curves_log").check().run()
    at.selectbox(key="curves_group").set_value("algo.mpt.mode").run()
    at.radio(key="curves_x").set_value("wall").run()
    at.selectbox(key="curves_metric").set_value("pool/unfinished").run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(charts(at)) == 2                                                       # main + masking/pools


def test_speedup_table_is_relative_to_s1(monkeypatch, written):
    at = open_app(monkeypatch, written["uri"], "speedup")
    assert at.selectbox(key="speedup_group").value == "segments"
    assert at.radio(key="speedup_window").value == "steady"
    # steady window = steps > S: S=1 compact keeps steps 2, 3 -> times [2, 4], median 3; S=2 step 3 -> 1.0;
    # S=4 (3 steps) has none and is named in a warning
    t = frame(at, "batching", "step_speedup").set_index(["batching", "segments"])
    assert t.loc[("compact", 1), "median_step_s"] == 3.0 and t.loc[("compact", 2), "step_speedup"] == 3.0
    assert ("compact", 4) not in t.index and any("no step in the window" in w.value for w in at.warning)
    assert any("Window: steady state" in c.value for c in at.caption)
    at.radio(key="speedup_window").set_value("all").run()
    t = frame(at, "batching", "step_speedup").set_index(["batching", "segments"])
    assert t.loc[("compact", 2), "step_speedup"] == 2.0
    assert t.loc[("compact", 4), "throughput_x"] == 4.0
    assert t.loc[("static", 4), "step_speedup"] == 2.0
    assert list(frame(at, "time_per_step_s")["time_per_step_s"]) == [1240.0, 774.0, 601.0]


def test_benchmarks_deltas_against_baseline(monkeypatch, written):
    at = open_app(monkeypatch, written["uri"], "benchmarks")
    at.multiselect(key="_select_benchmarks").set_value([written["eval_base"], written["eval_tuned"]]).run()
    at.selectbox(key="bench_baseline").set_value(written["eval_base"]).run()
    t = frame(at, "label", "delta_avg").set_index("label")
    assert t.loc["tuned", "delta_avg"] == pytest.approx(15.0) and t.loc["tuned", "delta_pass"] == pytest.approx(10.0)
    assert t.loc["base", "avg_at_k"] == pytest.approx(40.0)
    paper = frame(at, "model", "AIME-2025")
    assert paper.set_index("model").loc["UloRL-A3B-128k", "AIME-2025"] == 82.8


def test_sweep_page_importance_and_history(monkeypatch, written):
    at = open_app(monkeypatch, written["uri"], "sweep")
    assert at.selectbox(key="sweep_group").value == written["sweep"]
    imp = frame(at, "param", "spearman").set_index("param")
    # objective = best heldout avg@k: S1 .30/.25, S2 .35, S4 .45/.40 -> rho(segments) by hand:
    # ranks segments [1.5, 3, 4.5, 1.5, 4.5], objective [2, 3, 5, 1, 4]: centred products sum
    # to 9, squares to 9 and 10 -> 9 / sqrt(90)
    assert imp.loc["rollout.segments", "spearman"] == pytest.approx(9 / 90 ** 0.5)
    # 5 finished trials < 8: importance numbers in tables only, no bars; charts: parallel + history
    assert len(charts(at)) == 2
    assert any("Importance bars are hidden: 5 finished search trial(s)" in i.value for i in at.info)
    optuna_imp = frame(at, "param", "importance")                      # the parent's own study was read
    assert set(optuna_imp["param"]) == {"rollout.segments", "rollout.batching"}
    assert at.text_input(key=f"sweep_optuna_storage_{written['sweep']}").value.endswith("/sweep/optuna.db")
    assert at.multiselect(key=f"sweep_params_{written['sweep']}").value == ["rollout.segments", "rollout.batching"]
    assert at.selectbox(key=f"sweep_objective_{written['sweep']}").value == "metrics.eval/heldout/avg_at_k"


def test_detail_page_follows_run_query_param(monkeypatch, written):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", written["uri"])
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
    at.query_params["run"] = written["mpt_off"]
    go(at, "detail")
    assert_clean(at, "detail")
    assert at.selectbox(key="detail_run").value == written["mpt_off"]
    at.selectbox(key="detail_run").set_value(written["eval_base"]).run()
    assert at.query_params["run"] == written["eval_base"]


def test_detail_page_renders_samples_and_checkpoints(monkeypatch, written):
    at = open_app(monkeypatch, written["uri"], "detail")
    at.selectbox(key="detail_run").set_value(written["mpt_dynamic"]).run()
    assert not at.exception
    html = "".join(h.proto.body for h in at.get("html"))
    assert html.count('class="ulorl-tok"') == 4 + 2 and html.count("line-through") >= 2
    assert frame(at, "name", "size_mb")["name"].tolist() == ["final"]
    params = frame(at, "param", "value").set_index("param")["value"]
    assert params["algo.mpt.mode"] == "dynamic"
    at.radio(key="detail_reward").set_value("reward 0").run()
    assert "".join(h.proto.body for h in at.get("html")).count('class="ulorl-tok"') == 2


def test_sidebar_switches_store(monkeypatch, written, tmp_path):
    at = open_app(monkeypatch, f"sqlite:///{tmp_path / 'none.db'}")
    assert not at.dataframe and at.info
    at.text_input(key="_uri_input").input(written["uri"]).run()
    assert_clean(at, "runs")
    assert len(at.dataframe[0].value) == 10


# ----------------------------------------------------------------------------- real runs


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_with_real_runs(monkeypatch, real, page):
    at = open_app(monkeypatch, real["uri"], page)
    assert_clean(at, page)
    if page == "runs":
        kinds = at.dataframe[0].value["kind"].value_counts().to_dict()
        assert kinds.get("train") == 2 + 9 and kinds.get("eval", 0) >= 1 and kinds.get("sweep") == 2  # 2 real + 4 + 5 trials
    elif page in ("curves", "speedup", "benchmarks"):
        assert charts(at), f"no chart on {page}"


def test_real_runs_filters_and_samples(monkeypatch, real):
    at = open_app(monkeypatch, real["uri"])
    n = len(at.dataframe[0].value)
    at.selectbox(key="runs_f_param").set_value("algo.mpt.mode").run()
    at.multiselect(key="runs_f_param_values").set_value(["off"]).run()
    rows = at.dataframe[0].value
    # the real masking-off run, the two written sweep baselines and sweep B's S = 1 reference (masking off)
    assert len(rows) == 4 < n and set(rows["mask_mode"]) == {"off"} and real["train_off"] in set(rows["run_id"])
    go(at, "detail")
    at.selectbox(key="detail_run").set_value(real["train_dynamic"]).run()
    assert not at.exception
    html = "".join(h.proto.body for h in at.get("html"))
    assert 'class="ulorl-tok"' in html and "policy v" in html
    assert "final" in frame(at, "name", "size_mb")["name"].tolist()
    go(at, "curves")
    at.multiselect(key="_select_curves").set_value([real["train_dynamic"], real["train_off"]]).run()
    at.selectbox(key="curves_group").set_value("algo.mpt.mode").run()
    assert not at.exception and charts(at)
    data = frame(at, "run_id", "raw", "value")
    assert isinstance(data, pd.DataFrame) and set(data["run_id"]) == {real["train_dynamic"], real["train_off"]}



# ----------------------------------------------------------------------------- shared names


def _shared(real: dict) -> list[str]:
    """Every training run of the real store: all named ``quickstart``."""
    return [real["train_dynamic"], real["train_off"]] + real["sweep_A_trials"] + real["sweep_B_trials"]


def test_runs_with_one_name_stay_apart_on_curves(monkeypatch, real):
    names = {r.info.run_name for r in MlflowClient(tracking_uri=real["uri"]).search_runs(
        [e.experiment_id for e in MlflowClient(tracking_uri=real["uri"]).search_experiments()],
        filter_string="tags.`ulorl.kind` = 'train'")}
    assert names == {"quickstart"}, names                                   # the store really shares names
    at = open_app(monkeypatch, real["uri"], "curves")
    chosen = _shared(real)
    at.multiselect(key="_select_curves").set_value(chosen).run()
    data = frame(at, "run_id", "raw", "value")
    labels = data.groupby("run_id")["run"].unique()
    assert set(labels.index) == set(chosen)                                 # one series per run id
    assert all(len(v) == 1 for v in labels) and len({v[0] for v in labels}) == len(chosen)  # distinct labels
    # short labels: the two plain runs by name and id, sweep trials by role and swept values
    assert labels[real["train_dynamic"]][0] == f"quickstart ({real['train_dynamic'][:8]})"
    assert labels[real["sweep_B_trials"][0]][0] == "search tau=0.9 sigma=0.08"
    assert labels[real["sweep_B_trials"][3]][0] == "reference non_segmented"
    assert labels[real["sweep_B_trials"][-1]][0] == f"baseline masking_off ({real['sweep_B_trials'][-1][:8]})"
    assert all(len(v[0]) <= 40 for v in labels)
    assert set(data.groupby("run_id")["name"].first()) == {"quickstart"}     # the full name, for hover
    runs_table = open_app(monkeypatch, real["uri"]).dataframe[0].value
    train_labels = runs_table.loc[runs_table["kind"] == "train", "run"]
    assert train_labels.is_unique and len(train_labels) == 11


def test_benchmarks_one_bar_per_run_and_paired_difference(monkeypatch, real):
    at = open_app(monkeypatch, real["uri"], "benchmarks")
    kids = real["sweep_B_trials"]
    at.multiselect(key="_select_benchmarks").set_value(kids).run()
    # the sweep's baseline (tag ulorl.trial_role=baseline) is the default baseline
    assert at.selectbox(key="bench_baseline").value == kids[-1]
    t = frame(at, "label", "diff")
    assert t["label"].is_unique and len(t) == 5                             # one row (bar) per run
    by_label = t.set_index("label")
    # sweep B trial 0 [1, 1, .5, .5] vs baseline [.5, .5, .5, 0]: per-problem differences
    # [.5, .5, 0, .5] -> mean 37.5 % points; resamples of them lie in [0, 50]
    first = by_label.loc["search tau=0.9 sigma=0.08"]
    assert first["diff"] == pytest.approx(37.5) and 0.0 <= first["diff_low"] <= 37.5 <= first["diff_high"] <= 50.0
    assert first["paired_problems"] == 4
    assert pd.isna(by_label.loc[f"baseline masking_off ({kids[-1][:8]})", "diff"])    # the baseline itself
    assert len(charts(at)) == 2                                             # bars + difference chart


def test_speedup_page_compares_the_sweeps_s4_with_its_s1_reference(monkeypatch, real):
    """The sweep group (preferred over the loose runs of a config) holds S = 4 trials and the S = 1
    reference: the page states the ratio, and why it is below 1 with the command of the other regime."""
    at = open_app(monkeypatch, real["uri"], "speedup")
    assert_clean(at, "speedup")
    assert at.selectbox(key="speedup_group").value == "mpt_threshold"
    t = frame(at, "batching", "step_speedup").set_index(["batching", "segments"])
    assert t.loc[("compact", 4), "runs"] == 8 and t.loc[("compact", 1), "runs"] == 1
    assert t.loc[("compact", 4), "step_speedup"] == pytest.approx(SPEEDUP_S4_VS_S1)      # 0.8 / 1.15
    assert t.loc[("compact", 4), "trained_x"] == pytest.approx(((16 / 1.1 + 16 / 1.2) / 2) / 20)
    text = " ".join(m.value for m in at.markdown)
    assert "**S = 4 vs S = 1** (compact batching" in text and "**0.70x** wall time per step" in text
    assert "shown: wall time" in text
    assert any("compaction on a CPU" in i.value and "ulorl-sim paper" in i.value for i in at.info)


def test_sweep_page_separates_runs_of_one_sweep_name(monkeypatch, real):
    at = open_app(monkeypatch, real["uri"], "sweep")
    box = at.selectbox(key="sweep_group")
    assert box.value == real["sweep_B"]                                    # newest parent first
    assert real["sweep_A"] in box.options or any(real["sweep_A"][:8] in o for o in box.options)
    trials = frame(at, "run", "run_id", "status")
    assert set(trials["run_id"]) == set(real["sweep_B_trials"])            # this sweep's 5 trials only
    assert trials["run"].is_unique
    study = frame(at, "param", "importance")                                # parent B's own Optuna study
    assert set(study["param"]) == {"algo.mpt.tau", "algo.mpt.sigma"}
    assert any("from this sweep run's study: 3 trials, best 0.75" in c.value for c in at.caption)
    assert any("Importance bars are hidden: 3 finished search trial(s)" in i.value for i in at.info)
    at.selectbox(key="sweep_group").set_value(real["sweep_A"]).run()
    assert not at.exception
    assert set(frame(at, "run", "run_id", "status")["run_id"]) == set(real["sweep_A_trials"])
    assert any("from this sweep run's study: 3 trials, best 0.5" in c.value for c in at.caption)
