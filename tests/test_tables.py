"""ulorl-tables on real MLflow sqlite stores built with the real client, following the tracking
schema exactly (tags, flattened params, per-step metrics) -- empty, partial and populated."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest
from mlflow.entities import Metric, Param
from mlflow_store import StoreBase, migrated_empty_db, store_uri_from_template

from ulorl.cli.tables import main as tables_main
from ulorl.report import paper
from ulorl.report.figures import build_figures
from ulorl.report.store import RunStore
from ulorl.report.tables import NOT_RUN, build_table1, build_table2, build_table3, find_hints, tex_escape, write_all
from ulorl.tracking import schema

HINTS = {"table1": "HINT-T1", "table2": "HINT-T2", "table3": "HINT-T3", "fig2": "HINT-F2", "fig4": "HINT-F4",
         "fig5": "HINT-F5"}
EXPECTED_FILES = [f"table{i}.{e}" for i in (1, 2, 3) for e in ("md", "tex", "csv")] + \
    [f"fig{i}.png" for i in (2, 4, 5)] + ["cells.csv"]


# ----------------------------------------------------------------------------- store builders


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return migrated_empty_db(tmp_path_factory.mktemp("template"))


class Store(StoreBase):
    """Writes schema-conformant runs with the real MLflow client into a sqlite store."""

    def train_run(self, paper_ref: str, params: dict, metrics: dict[str, list[float]], name: str = "train",
                  status: str = "FINISHED", eval_points: dict[int, float] | None = None) -> str:
        base = {"rollout.segments": 4, "rollout.max_response_len": 256, "rollout.batching": "compact",
                "algo.is_mode": "pois", "algo.mpt.mode": "dynamic", "algo.mpt.tau": 0.99, "algo.mpt.sigma": 0.2,
                "model.name_or_path": "embedded", "train.seed": 0}
        base.update(params)
        tags = {schema.KIND_TAG: "train", schema.EXPERIMENT_TAG: "tiny", schema.PAPER_REF_TAG: paper_ref}
        run = self.client.create_run(self.exp, run_name=name, tags=tags)
        rid = run.info.run_id
        self.client.log_batch(rid, params=[Param(k, str(v)) for k, v in base.items()])
        ts = int(time.time() * 1000)
        ms = [Metric(k, float(v), ts, step) for k, vals in metrics.items() for step, v in enumerate(vals, start=1)]
        ms += [Metric(schema.eval_metric("heldout", "avg_at_k"), v, ts, s) for s, v in (eval_points or {}).items()]
        if ms:
            self.client.log_batch(rid, metrics=ms)
        self.client.set_terminated(rid, status=status)
        return rid

    def eval_run(self, bench: str, avg: float, model: str = "embedded", label: str | None = None, k: int = 4,
                 parent: str | None = None) -> str:
        tags = {schema.KIND_TAG: "eval", schema.BENCHMARK_TAG: bench, "ulorl.k": str(k), schema.MODEL_TAG: model}
        if label:
            tags[schema.MODEL_LABEL_TAG] = label
        if parent:
            tags[schema.PARENT_TAG] = parent
        rid = self.client.create_run(self.exp, run_name=f"eval-{bench}", tags=tags).info.run_id
        m = {"avg_at_k": avg, "pass_at_k": min(1.0, 2 * avg), "ci_low": avg - 0.1, "ci_high": avg + 0.1,
             "response_len_mean": 40.0, "truncation_rate": 0.0}
        ts = int(time.time() * 1000)
        self.client.log_batch(rid, metrics=[Metric(schema.eval_metric(bench, k_), v, ts, 0) for k_, v in m.items()])
        self.client.set_terminated(rid)
        return rid


def _cells(out: Path) -> list[dict[str, str]]:
    with (out / "cells.csv").open() as f:
        return list(csv.DictReader(f))


def _row(table, *labels: str) -> dict[str, str]:
    for row in table.rows:
        if [c.text for c in row[: len(labels)]] == list(labels):
            return {col: c for col, c in zip(table.columns, row)}
    raise AssertionError(f"no row {labels} in {table.key}: {[[c.text for c in r[:3]] for r in table.rows]}")


# ----------------------------------------------------------------------------- tests


def test_empty_store_writes_every_file_with_not_run(tmp_path: Path, empty_db: Path) -> None:
    st = Store(tmp_path, empty_db)
    out = tmp_path / "out"
    summary = write_all(RunStore.open(st.uri), out, HINTS)
    assert sorted(p.name for p in out.iterdir()) == sorted(EXPECTED_FILES)
    for f in ("fig2.png", "fig4.png", "fig5.png"):
        assert (out / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    t1 = (out / "table1.md").read_text()
    assert t1.count(NOT_RUN) >= 12 and "HINT-T1" in t1
    assert "1240" in t1 and "2.06x" in t1  # the paper column is always there
    assert "HINT-T2" in (out / "table2.md").read_text() and "HINT-T3" in (out / "table3.md").read_text()
    assert "\\toprule" in (out / "table1.tex").read_text() and "\\bottomrule" in (out / "table3.tex").read_text()
    cells = _cells(out)
    ours = [c for c in cells if c["text"] == NOT_RUN]
    assert ours and all(c["run_ids"] == "" and c["value"] == "" for c in ours)
    assert {c["table"] for c in ours} == {"table1", "table2", "table3", "fig2", "fig4", "fig5"}
    assert all(summary["figures"][f]["not_run"] for f in ("fig2", "fig4", "fig5"))
    # no number is invented: every cell with a value and no run is the paper's or the simulator's
    assert all(c["note"] == "paper" or c["note"].startswith("ulorl.sim.simulator")
               for c in cells if c["value"] and not c["run_ids"])


def test_partial_store_values_not_run_cells_and_run_ids(tmp_path: Path, empty_db: Path) -> None:
    st = Store(tmp_path, empty_db)
    # steady window = steps > S: s1 keeps steps 2, 3 -> [2, 4]; s2 drops its two warm-up steps -> [1.5, 2.0]
    s1 = st.train_run("table1", {"rollout.segments": 1}, {"time/step_s": [3.0, 2.0, 4.0],
                                                         "train/samples": [8.0, 8.0, 8.0]}, "s1")
    s2 = st.train_run("table1", {"rollout.segments": 2}, {"time/step_s": [0.1, 0.1, 1.5, 2.0],
                                                         "train/samples": [2.0, 4.0, 8.0, 6.0]}, "s2")
    ev = st.eval_run("heldout", 0.375, model="runs:/abc/checkpoints/final", label="tiny-rl")
    store = RunStore.open(st.uri)

    t1 = build_table1(store, HINTS)
    r1, r2, r4 = (_row(t1, str(s), "compact") for s in (1, 2, 4))
    assert r1["Time/step (s)"].value == pytest.approx(3.0) and r1["Time/step (s)"].run_ids == (s1,)
    assert r2["Time/step (s)"].value == pytest.approx(1.75) and r2["Time/step (s)"].run_ids == (s2,)
    assert r1["Trained samples/s"].value == pytest.approx(16 / 6.0)   # (8 + 8) / (2 + 4)
    assert r2["Trained samples/s"].value == pytest.approx(14 / 3.5)   # (8 + 6) / (1.5 + 2.0)
    assert any("steady window" in n for n in t1.notes)
    assert r2["Speedup"].value == pytest.approx(3.0 / 1.75) and r2["Speedup"].text == "1.71x"
    assert set(r2["Speedup"].run_ids) == {s1, s2}
    assert r1["Speedup"].text == "1.00x"
    assert r4["Time/step (s)"].text == NOT_RUN and r4["Speedup"].text == NOT_RUN
    assert r4["Paper time/step (s)"].text == "601" and r4["Paper speedup"].text == "2.06x"
    # simulator at paper scale: S=1, 2 are its calibration points (the paper's own numbers), S=4 a prediction
    assert r1["Sim. paper-scale (s)"].text == "1240 (fit)" and r2["Sim. paper-scale (s)"].text == "774 (fit)"
    assert "prediction" in r4["Sim. paper-scale (s)"].note and r4["Sim. paper-scale (s)"].value > 0
    assert all(_row(t1, str(s), "static")["Time/step (s)"].text == NOT_RUN for s in (1, 2, 4))
    assert any("HINT-T1" in n for n in t1.notes)

    t2 = build_table2(store, HINTS)
    ours = _row(t2, "tiny-rl", "ours")
    assert ours["Held-out"].text == "37.5" and ours["Held-out"].run_ids == (ev,)
    assert ours["AIME-2025"].text == NOT_RUN and ours["AVG"].text == NOT_RUN and ours["k"].text == "4"
    assert _row(t2, "UloRL-A3B-128k", "paper")["AIME-2025"].text == "82.8"

    out = tmp_path / "out"
    write_all(store, out, HINTS)
    cells = _cells(out)
    c = next(c for c in cells if c["table"] == "table1" and c["row"] == "2 / compact" and c["column"] == "Speedup")
    assert set(c["run_ids"].split(";")) == {s1, s2} and float(c["value"]) == pytest.approx(3.0 / 1.75)
    c = next(c for c in cells if c["table"] == "table2" and c["row"] == "tiny-rl / ours" and c["column"] == "Held-out")
    assert c["run_ids"] == ev and "avg@4" in c["note"]
    assert "not run" in (out / "table3.md").read_text()


def test_table2_avg_latest_run_wins_and_table3_groups(tmp_path: Path, empty_db: Path) -> None:
    st = Store(tmp_path, empty_db)
    st.eval_run("aime2025", 0.10, label="m")
    a2 = st.eval_run("aime2025", 0.20, label="m")          # later run of the same (row, bench) wins
    b = st.eval_run("beyondaime", 0.05, label="m")
    base = st.eval_run("heldout", 0.25, model="embedded")  # standalone embedded -> Table 3 base row
    la = st.train_run("table3", {"rollout.max_response_len": 256, "rollout.segments": 2}, {}, "a",
                      eval_points={5: 0.1, 10: 0.5})
    lb = st.train_run("table3", {"rollout.max_response_len": 256, "rollout.segments": 2}, {}, "b",
                      eval_points={10: 0.3})
    lc = st.train_run("table3", {"rollout.max_response_len": 512, "rollout.segments": 4}, {}, "c",
                      eval_points={10: 0.2})
    nested = st.eval_run("heldout", 0.6, model=f"runs:/{lc}/checkpoints/final", parent=lc)
    store = RunStore.open(st.uri)

    t2 = build_table2(store, HINTS)
    m = _row(t2, "m", "ours")
    assert m["AIME-2025"].text == "20.0" and m["AIME-2025"].run_ids == (a2,) and "latest of 2" in m["AIME-2025"].note
    assert m["BeyondAIME"].text == "5.0" and m["AVG"].value == pytest.approx(12.5) and set(m["AVG"].run_ids) == {a2, b}

    t3 = build_table3(store, HINTS)
    g256 = _row(t3, "256", "2")
    assert g256["Held-out"].value == pytest.approx(40.0)  # mean of last points 0.5 and 0.3, x100
    assert set(g256["Held-out"].run_ids) == {la, lb} and g256["Runs"].text == "2"
    g512 = _row(t3, "512", "4")
    assert g512["Held-out"].value == pytest.approx(60.0) and g512["Held-out"].run_ids == (nested,)
    assert g512["AIME-2025"].text == NOT_RUN
    b_row = _row(t3, "—", "—", "base (embedded, no RL)")
    assert b_row["Held-out"].text == "25.0" and b_row["Held-out"].run_ids == (base,)
    assert _row(t3, "131072", "8", "UloRL-A3B-128k")["BeyondAIME"].text == "60.2"


def test_figures_lines_labels_and_sigma(tmp_path: Path, empty_db: Path) -> None:
    st = Store(tmp_path, empty_db)
    ids = {}
    for mode, seg, ent in (("tois", 1, [0.9, 0.8]), ("sais", 4, [0.9, 1.5]), ("pois", 4, [0.9, 0.85])):
        ids[mode] = st.train_run("fig2", {"algo.is_mode": mode, "rollout.segments": seg},
                                 {"train/entropy": ent, "rollout/reward_mean": [0.2, 0.3]}, mode)
    for seed in (0, 1):
        st.train_run("fig5", {"algo.mpt.mode": "dynamic", "algo.mpt.sigma": 0.3, "train.seed": seed},
                     {"train/entropy": [0.5, 0.35, 0.31]}, f"dm{seed}")
    figs = {f.key: f for f in build_figures(RunStore.open(st.uri), HINTS)}
    f2 = figs["fig2"]
    assert sorted(ln.label for ln in f2.lines) == ["POIS", "SAIS", "TOIS"]
    sais = next(ln for ln in f2.lines if ln.label == "SAIS")
    assert sais.run_id == ids["sais"] and sais.series["train/entropy"] == ([1, 2], [0.9, 1.5])
    assert sais.series["rollout/reward_mean"][1] == [0.2, 0.3]
    assert f2.panels == ["max response len 256"]
    f5 = figs["fig5"]
    assert sorted(ln.label for ln in f5.lines) == ["DMMPT (seed=0)", "DMMPT (seed=1)"]
    assert [ln.target for ln in f5.lines] == [0.3, 0.3]
    assert figs["fig4"].lines == []
    out = tmp_path / "out"
    summary = write_all(RunStore.open(st.uri), out, HINTS)
    assert summary["figures"]["fig4"]["not_run"] and not summary["figures"]["fig5"]["not_run"]
    assert (out / "fig2.png").stat().st_size > 10_000
    rec = [c for c in _cells(out) if c["table"] == "fig2" and c["column"] == "train/entropy"]
    assert {c["run_ids"] for c in rec} == set(ids.values())


def test_cli_json_one_object(tmp_path: Path, empty_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    st = Store(tmp_path, empty_db)
    st.train_run("table1", {"rollout.segments": 1, "rollout.batching": "static"}, {"time/step_s": [2.0, 2.0]})
    rc = tables_main(["--tracking-uri", st.uri, "--out", str(tmp_path / "o"), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)  # exactly one JSON object on stdout
    assert out["tables"]["table1"]["runs"] == 1 and out["tables"]["table1"]["not_run"] > 0
    assert len(out["files"]) == len(EXPECTED_FILES) + 2  # + claims.md, claims.json
    assert {c["claim"] for c in out["claims"]} >= {"fig4_entropy", "table3_heldout", "headline"}


def test_find_hints_reads_repo_sweeps(tmp_path: Path) -> None:
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "tiny_fig5.yaml").write_text("tracking:\n  paper_ref: fig5\n")
    (tmp_path / "sweeps" / "seg.yaml").write_text("overrides:\n  tracking.paper_ref: table1\n")
    (tmp_path / "sweeps" / "dm.yaml").write_text("base: experiments/tiny_fig5.yaml\n")
    h = find_hints([tmp_path])
    assert h["table1"] == "ulorl-sweep sweeps/seg.yaml"
    assert h["fig5"] == "ulorl-sweep sweeps/dm.yaml"
    assert h["table3"].startswith("ulorl-sweep sweeps/")  # default


def test_tex_escape() -> None:
    assert tex_escape("a_b <p|q> 50% — {x}") == r"a\_b \textless{}p\textbar{}q\textgreater{} 50\% --- \{x\}"


def test_paper_numbers() -> None:
    assert [(r.segments, r.time_per_step_s, r.speedup) for r in paper.TABLE1] == [(1, 1240, 1.0), (2, 774, 1.6), (4, 601, 2.06)]
    for r in paper.TABLE2 + paper.TABLE3:
        assert abs((r.aime2025 + r.beyondaime) / 2 - r.avg) <= 0.051, r


def test_tables_pick_up_real_training_runs(tmp_path: Path, empty_db: Path) -> None:
    """Two real 2-step trainings (``ulorl.train.trainer.train`` on the quickstart experiment with a
    random tiny Qwen3 saved to tmp, so the test needs no warm-start asset), tagged table1 and
    fig5, land in Table 1 and Figure 5 with their run ids."""
    from ulorl.config import load_experiment
    from ulorl.models.tiny import build_tiny_model
    from ulorl.models.tokenizer import build_tokenizer
    from ulorl.train.trainer import train

    model_dir = tmp_path / "tiny"
    tok = build_tokenizer()
    build_tiny_model(tok, seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    uri = store_uri_from_template(tmp_path, empty_db)
    quickstart = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml"
    common = [f"model.name_or_path={model_dir}", "train.max_steps=3", "rollout.max_response_len=64",
              "rollout.prompts_per_step=2", "rollout.group_size=4", "eval.every=0", f"tracking.uri={uri}", "algo.dynamic_sampling=false",
              f"train.output_dir={tmp_path / 'runs'}", "train.threads=1"]
    r1 = train(load_experiment(quickstart, common + ["rollout.segments=2", "tracking.paper_ref=table1"]), progress=False)
    r2 = train(load_experiment(quickstart, common + ["rollout.segments=1", "algo.mpt.mode=dynamic",
                                                     "algo.mpt.sigma=0.3", "tracking.paper_ref=fig5"]), progress=False)
    store = RunStore.open(uri)
    t1 = build_table1(store, HINTS)
    row = _row(t1, "2", "compact")
    steps, times = store.history(r1.run_id, "time/step_s")
    assert steps == [1, 2, 3] and row["Time/step (s)"].run_ids == (r1.run_id,)
    assert row["Time/step (s)"].value == pytest.approx(times[2])  # S = 2: steady window is step 3 only
    assert _row(t1, "1", "compact")["Time/step (s)"].text == NOT_RUN
    figs = {f.key: f for f in build_figures(store, HINTS)}
    (line,) = figs["fig5"].lines
    assert line.run_id == r2.run_id and line.target == 0.3 and line.label == "DMMPT"
    # entropy is logged at the steps that updated the model (train/skipped == 0): the line has exactly those
    skipped = dict(zip(*store.history(r2.run_id, "train/skipped")))
    assert sorted(skipped) == [1, 2, 3]
    assert line.series.get("train/entropy", ([], []))[0] == [s for s, v in sorted(skipped.items()) if v == 0]
    summary = write_all(store, tmp_path / "out", HINTS)
    assert summary["tables"]["table1"]["runs"] == 1 and not summary["figures"]["fig5"]["not_run"]
    assert figs["fig2"].lines == [] and summary["figures"]["fig2"]["not_run"]


def test_trailing_mean_and_window_are_hand_checked():
    from ulorl.report.figures import smoothing_window, trailing_mean

    assert trailing_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert trailing_mean([2.0, 4.0], 5) == [2.0, 3.0]
    assert smoothing_window(39) == 1 and smoothing_window(40) == 5 and smoothing_window(200) == 10


def test_table3_compares_heldout_at_equal_trained_samples(tmp_path: Path, empty_db: Path) -> None:
    st = Store(tmp_path, empty_db)
    # S=1 trains 8 samples per step, S=4 only 4: after 10 steps 80 vs 40 samples.
    fast = st.train_run("table3", {"rollout.max_response_len": 128, "rollout.segments": 1},
                        {"train/samples": [8.0] * 10}, "fast", eval_points={5: 0.30, 10: 0.70})
    slow = st.train_run("table3", {"rollout.max_response_len": 512, "rollout.segments": 4},
                        {"train/samples": [4.0] * 10}, "slow", eval_points={5: 0.20, 10: 0.40})
    store = RunStore.open(st.uri)

    t3 = build_table3(store, HINTS)
    # budget = min(80 at fast's last eval, 40 at slow's) = 40: fast at step 5 (40 samples), slow at step 10
    f, s = _row(t3, "128", "1")["Held-out"], _row(t3, "512", "4")["Held-out"]
    assert f.value == pytest.approx(30.0) and f.run_ids == (fast,) and "step 5 (40 trained samples)" in f.note
    assert s.value == pytest.approx(40.0) and s.run_ids == (slow,) and "step 10 (40 trained samples)" in s.note
    assert any("equal trained samples" in n and "40 trained samples" in n for n in t3.notes)

    by_steps = build_table3(store, HINTS, equal_samples=False)  # the old comparison: last points
    assert _row(by_steps, "128", "1")["Held-out"].value == pytest.approx(70.0)


def test_table3_run_without_a_point_within_the_budget_is_not_averaged(tmp_path: Path, empty_db: Path) -> None:
    st = Store(tmp_path, empty_db)
    st.train_run("table3", {"rollout.max_response_len": 256, "rollout.segments": 2},
                 {"train/samples": [4.0] * 10}, "a", eval_points={10: 0.5})              # 40 samples at its eval
    late = st.train_run("table3", {"rollout.max_response_len": 256, "rollout.segments": 2},
                        {"train/samples": [8.0] * 10}, "b", eval_points={10: 0.9})       # first eval at 80 > 40
    cell = _row(build_table3(RunStore.open(st.uri), HINTS), "256", "2")["Held-out"]
    assert cell.text == "n/a" and cell.value is None and late in cell.run_ids
    assert "1 of 2 runs have no comparable point" in cell.note
