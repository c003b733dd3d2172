"""The reward extraction mode is part of every result: config, eval runs, and tables that never
put two modes in one column."""

from __future__ import annotations

import pytest
from reward_fakes import TextScriptedEngine, byte_tokenizer

from ulorl.config import RewardConfig
from ulorl.data.types import PromptItem
from ulorl.eval.runner import EVAL_SAMPLING, eval_tags, evaluate
from ulorl.report.store import RunInfo, RunStore
from ulorl.report.tables import NA, build_table2, one_mode_per_column
from ulorl.reward import RewardScorer
from ulorl.tracking import schema


def test_config_default_and_scorer_from_config():
    assert RewardConfig().extraction == "boxed"  # training: no box -> 0
    assert RewardScorer.from_config(RewardConfig(extraction="boxed_or_final")).extraction == "boxed_or_final"
    with pytest.raises(ValueError, match="extraction"):
        RewardConfig(extraction="final")


@pytest.mark.parametrize("mode, correct", [("boxed", [1, 0]), ("boxed_or_final", [1, 1])])
def test_evaluate_records_mode_and_uses_its_extraction(mode, correct):
    tok = byte_tokenizer()
    replies = {"What is 5+7?": r"so \boxed{12}", "What is 2+3?": "so the answer is 5."}
    engine = TextScriptedEngine(tok, lambda prompt, req: next(v for k, v in replies.items() if k in prompt))
    items = [PromptItem("p0", "What is 5+7?", "12"), PromptItem("p1", "What is 2+3?", "5")]
    with RewardScorer(timeout_s=30, extraction=mode) as scorer:
        res = evaluate(engine, tok, items, k=1, sampling=EVAL_SAMPLING, max_new_tokens=64, scorer=scorer,
                       bench_name="t", progress=False)
    assert res.correct[:, 0].tolist() == correct
    assert res.extraction == mode and res.summary()["extraction"] == mode
    assert res.rows[1]["predictions"] == ("5" if mode == "boxed_or_final" else "")
    assert eval_tags("t", 1, "m", "m", mode)[schema.EXTRACTION_TAG] == mode


def _eval(run_id: str, label: str, bench: str, avg: float, mode: str | None, t: int) -> RunInfo:
    tags = {schema.KIND_TAG: "eval", schema.BENCHMARK_TAG: bench, schema.MODEL_LABEL_TAG: label, "ulorl.k": "4"}
    if mode:
        tags[schema.EXTRACTION_TAG] = mode
    return RunInfo(run_id, "0", run_id, "FINISHED", t, tags=tags, params={},
                   metrics={schema.eval_metric(bench, "avg_at_k"): avg})


def test_table2_keeps_one_mode_per_column():
    runs = [
        _eval("r1", "m1", "aime2025", 0.5, "boxed_or_final", 1),
        _eval("r2", "m2", "aime2025", 0.4, "boxed_or_final", 2),
        _eval("r3", "m3", "aime2025", 0.3, None, 3),  # a run from before the mode existed: boxed
        _eval("r4", "m1", "beyondaime", 0.2, "boxed", 4),
    ]
    t = build_table2(RunStore(None, runs), {})  # type: ignore[arg-type]
    col = t.columns.index("AIME-2025")
    by_label = {row[0].text: row for row in t.rows if row[1].text == "ours"}
    assert by_label["m1"][col].text == "50.0" and by_label["m2"][col].text == "40.0"
    assert by_label["m3"][col].text == NA and "reward.extraction=boxed" in by_label["m3"][col].note
    avg = t.columns.index("AVG")
    assert by_label["m1"][avg].text == NA  # AIME (boxed_or_final) and BeyondAIME (boxed) are not averaged
    assert any("AIME-2025=boxed_or_final" in n and "BeyondAIME=boxed" in n for n in t.notes)


def test_one_mode_per_column_helper():
    from ulorl.report.tables import Cell

    rows = [[Cell("1", 1.0, ("a",), mode="boxed")], [Cell("2", 2.0, ("b",), mode="boxed")],
            [Cell("3", 3.0, ("c",), mode="boxed_or_final")], [Cell("not run")]]
    assert one_mode_per_column(rows, range(1)) == {0: "boxed"}
    assert [r[0].text for r in rows] == ["1", "2", NA, "not run"]


def test_dashboard_benchmark_table_shows_mode_and_no_cross_mode_deltas():
    import math

    import pandas as pd

    from ulorl.dashboard import frames

    runs = pd.DataFrame([
        {"run_id": "b", "run_name": "b", "kind": "eval", "model_label": "base", "tags.ulorl.k": "4",
         f"tags.{schema.EXTRACTION_TAG}": "boxed_or_final", "metrics.eval/aime2025/avg_at_k": 0.40,
         "metrics.eval/aime2025/pass_at_k": 0.6},
        {"run_id": "s", "run_name": "s", "kind": "eval", "model_label": "same", "tags.ulorl.k": "4",
         f"params.{schema.EXTRACTION_PARAM}": "boxed_or_final", "metrics.eval/aime2025/avg_at_k": 0.55,
         "metrics.eval/aime2025/pass_at_k": 0.7},
        {"run_id": "o", "run_name": "o", "kind": "eval", "model_label": "old", "tags.ulorl.k": "4",
         "metrics.eval/aime2025/avg_at_k": 0.50, "metrics.eval/aime2025/pass_at_k": 0.7},
    ])
    table = frames.benchmark_table(runs)
    assert dict(zip(table["run_id"], table["extraction"])) == {"b": "boxed_or_final", "s": "boxed_or_final", "o": "boxed"}
    d = frames.benchmark_deltas(table, "b").set_index("run_id")
    assert math.isclose(d.loc["s", "delta_avg"], 0.15)
    assert math.isnan(d.loc["o", "delta_avg"])  # scored with another mode: no delta
