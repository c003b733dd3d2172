"""``ulorl-train experiments/quickstart_choice.yaml`` end to end (shrunk): what MLflow holds.

One run on the shipped warm-started model (``embedded:choice``, as the experiment file names it),
one on a random-init model of the same architecture (the data side, ``embedded:choice`` prompts and
held-out split, needs no shipped weights).
"""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from ulorl.cli.train import main as train_main
from ulorl.models.tiny import build_tiny_model
from ulorl.models.tokenizer import build_tokenizer
from ulorl.tracking import schema

ROOT = Path(__file__).resolve().parents[1]
QUICK_CHOICE = ROOT / "experiments" / "quickstart_choice.yaml"


def _run_and_check(tmp_path: Path, model: str, *extra: str) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    argv = [str(QUICK_CHOICE), *extra,
           "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_response_len=64", "rollout.segments=2",
           "train.threads=1", "train.max_steps=2", "train.checkpoint_every=2", "eval.every=2", "eval.num_problems=4",
           "eval.k=1", f"tracking.uri={uri}", "--run-dir", str(tmp_path / "run"), "--no-progress"]
    assert train_main(argv) == 0  # the `ulorl-train` entry point, in process (no interpreter start-up)
    client = MlflowClient(uri)
    runs = [run for exp in client.search_experiments() for run in client.search_runs([exp.experiment_id])]
    train_runs = [run for run in runs if run.data.tags.get(schema.KIND_TAG) == "train"]
    assert len(train_runs) == 1
    run = train_runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags[schema.EXPERIMENT_TAG] == "quickstart_choice"
    assert run.data.params["model.name_or_path"] == model
    assert run.data.params["data.train"] == "embedded:choice"
    steps = {m.step for m in client.get_metric_history(run.info.run_id, schema.SKIPPED_METRIC)}
    assert steps == {1, 2}
    # held-out evaluation of an embedded profile logs under the common "heldout" name (sweep objective)
    assert {m.step for m in client.get_metric_history(run.info.run_id, "eval/heldout/avg_at_k")} == {2}


def test_quickstart_choice_data_side_end_to_end(tmp_path: Path) -> None:
    tok = build_tokenizer()
    folder = tmp_path / "random_model"
    build_tiny_model(tok, seed=0).save_pretrained(folder)
    tok.save_pretrained(folder)
    _run_and_check(tmp_path, str(folder), f"model.name_or_path={folder}")


def test_quickstart_choice_as_shipped_end_to_end(tmp_path: Path) -> None:
    _run_and_check(tmp_path, "embedded:choice")
