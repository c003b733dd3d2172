"""``ulorl-eval`` end to end on a real tiny Qwen3 (random weights saved to tmp, and the shipped
embedded model), the real hf engine, reward scorer and MLflow sqlite store."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ulorl.cli.eval import build_parser, load_eval_model, main as eval_main
from ulorl.models.loading import embedded_model_dir
from ulorl.report.store import RunStore
from ulorl.report.tables import build_table2
from ulorl.tracking import schema
from ulorl.tracking.run import get_or_create_experiment



@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ulorl.models.tiny import build_tiny_model
    from ulorl.models.tokenizer import build_tokenizer

    d = tmp_path_factory.mktemp("tiny") / "model"
    tok = build_tokenizer()
    build_tiny_model(tok, seed=0).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    rc = eval_main(argv + ["--json", "--threads", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    return json.loads(out)  # exactly one JSON object on stdout


def test_eval_checkpoint_of_a_run_nested_and_logged(tiny_dir: Path, tmp_path: Path, capsys) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = get_or_create_experiment(client, "ulorl", uri)
    train = client.create_run(exp, run_name="tiny-train", tags={schema.KIND_TAG: "train"}).info.run_id
    client.log_artifacts(train, str(tiny_dir), "checkpoints/final")

    out = _run_json(["--benchmark", "heldout", "--k", "2", "--num-problems", "8", "--max-new-tokens", "24",
                     "--model", f"runs:/{train}/checkpoints/final", "--parent-run-id", train,
                     "--tracking-uri", uri], capsys)
    assert out["num_problems"] == 8 and out["k"] == 2 and out["model_label"] == "tiny-train/final"
    assert set(out["pass_at"]) == {"1", "2"}
    run = client.get_run(out["run_id"])
    assert run.info.status == "FINISHED" and run.info.experiment_id == exp
    t = run.data.tags
    assert t[schema.PARENT_TAG] == train and t[schema.KIND_TAG] == "eval" and t[schema.BENCHMARK_TAG] == "heldout"
    assert t["ulorl.k"] == "2" and t[schema.MODEL_TAG] == f"runs:/{train}/checkpoints/final"
    m = run.data.metrics
    for name in ("avg_at_k", "pass_at_k", "pass_at_1", "pass_at_2", "ci_low", "ci_high", "response_len_mean",
                 "truncation_rate"):
        assert m[f"eval/heldout/{name}"] == pytest.approx(out["metrics"][f"eval/heldout/{name}"])
    assert 0 < m["eval/heldout/response_len_mean"] <= 24
    assert run.data.params["eval.temperature"] == "0.85" and run.data.params["eval.top_p"] == "0.95"
    assert run.data.params["eval.top_k"] == "20"
    csv_path = client.download_artifacts(out["run_id"], "eval/heldout_per_problem.csv", str(tmp_path / "dl"))
    rows = list(csv.DictReader(open(csv_path)))
    assert len(rows) == 8 and all(r["k"] == "2" for r in rows)
    assert sum(int(r["num_correct"]) for r in rows) / 16 == pytest.approx(m["eval/heldout/avg_at_k"])
    # the tables pick the run up as a Table 2 row
    t2 = build_table2(RunStore.open(uri), {})
    row = next(r for r in t2.rows if r[0].text == "tiny-train/final")
    assert out["run_id"] in row[t2.columns.index("Held-out")].run_ids


def test_eval_jsonl_benchmark_from_data_dir(tiny_dir: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """A benchmark name read from --data-dir (a two-row folder written here), and the packaged
    BeyondAIME when no data directory is given."""
    (tmp_path / "aime2025.jsonl").write_text("".join(
        json.dumps({"id": f"a{i}", "problem": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n" for i in range(3)))
    out = _run_json(["--benchmark", "aime2025", "--data-dir", str(tmp_path), "--k", "1", "--num-problems", "2",
                     "--max-new-tokens", "4", "--model", str(tiny_dir), "--no-mlflow"], capsys)
    assert out["benchmark"] == "aime2025" and out["num_problems"] == 2 and out["run_id"] is None
    assert out["metrics"]["eval/aime2025/truncation_rate"] == 1.0  # 4 tokens never finish a solution
    monkeypatch.delenv("ULORL_DATA_DIR", raising=False)
    out = _run_json(["--benchmark", "beyondaime", "--k", "1", "--num-problems", "2",
                     "--max-new-tokens", "4", "--model", str(tiny_dir), "--no-mlflow"], capsys)
    assert out["benchmark"] == "beyondaime" and out["num_problems"] == 2
    assert out["avg_at_k"] == 0.0


def test_yarn_rope_scaling_lands_in_model_config(tiny_dir: Path) -> None:
    args = build_parser().parse_args(["--benchmark", "heldout", "--k", "1", "--model", str(tiny_dir),
                                      "--yarn-factor", "1.5", "--yarn-original-max-pos", "512"])
    from ulorl.cli.eval import rope_scaling_of

    rs = rope_scaling_of(args)
    assert rs == {"rope_type": "yarn", "factor": 1.5, "original_max_position_embeddings": 512}
    model, _, label = load_eval_model(args, "sqlite:///unused.db", rs)
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or cfg.rope_scaling
    assert rope["rope_type"] == "yarn" and rope["factor"] == 1.5 and rope["original_max_position_embeddings"] == 512
    assert label == "model"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--benchmark", "nope/missing.jsonl", "--k", "2"], "missing.jsonl"),
        (["--benchmark", "aime2025", "--k", "2", "--data-dir", "/nonexistent-dir"], "aime2025"),
        (["--benchmark", "heldout", "--k", "0"], "--k"),
        (["--benchmark", "heldout", "--k", "2", "--top-k", "0"], "--top-k"),
        (["--benchmark", "heldout", "--k", "2", "--yarn-original-max-pos", "9"], "--yarn-factor"),
    ],
)
def test_cli_errors_name_the_bad_flag(argv: list[str], message: str, tmp_path: Path, capsys) -> None:
    rc = eval_main(argv + ["--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", "--no-mlflow"])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "ulorl-eval: error:" in err


def test_cli_unknown_parent_run(tmp_path: Path, capsys) -> None:
    rc = eval_main(["--benchmark", "heldout", "--k", "1", "--parent-run-id", "0123abcd",
                    "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    assert rc == 2 and "--parent-run-id 0123abcd" in capsys.readouterr().err


def test_eval_embedded_model_on_heldout(tmp_path: Path, capsys) -> None:
    """The shipped warm-started model, k=2 on 8 held-out problems, logged to MLflow."""
    assert (embedded_model_dir() / "config.json").is_file(), "embedded model asset missing (ulorl-data warmstart)"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = _run_json(["--benchmark", "heldout", "--k", "2", "--num-problems", "8", "--tracking-uri", uri], capsys)
    assert out["model"] == "embedded" and out["model_label"] == "embedded" and out["max_new_tokens"] == 512
    run = MlflowClient(tracking_uri=uri).get_run(out["run_id"])
    assert run.data.metrics["eval/heldout/avg_at_k"] == pytest.approx(out["avg_at_k"])
    assert run.data.tags[schema.MODEL_TAG] == "embedded"
    # a warm-started model solves some held-out problems and finishes (EOS) most responses
    assert out["avg_at_k"] > 0.0 and out["truncation_rate"] < 0.5
