"""``ulorl-train --dry-run`` refuses what the run refuses, with the run's own message: too few held-out
problems for ``eval.final``, a local model folder that does not exist, a tracking URI MLflow cannot open
(it used to print the plan and exit 0). Exit 2, nothing created. A hub id is not taken for a missing
folder. The run without --dry-run gives the same message (no traceback for the missing model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ulorl.cli import train as train_cli

QUICK = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml"
TINY = ["train.max_steps=1", "rollout.prompts_per_step=1", "rollout.group_size=2", "rollout.max_response_len=16",
        "rollout.segments=1", "algo.dynamic_sampling=false", "eval.every=0", "train.threads=1"]


def _run(capsys, tmp_path: Path, *extra: str, dry: bool) -> tuple[int, str]:
    argv = [str(QUICK), *TINY, f"train.output_dir={tmp_path / 'runs'}", "--no-progress", *extra]
    if "--tracking-uri" not in extra:
        argv += ["--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    rc = train_cli.main(argv + (["--dry-run"] if dry else []))
    cap = capsys.readouterr()
    return rc, cap.err.strip()


@pytest.mark.parametrize("case, extra, message", [
    ("final", ["eval.every=5", "eval.final.k=2", "eval.final.num_problems=1000"],
     "ulorl-train: eval.final.num_problems (1000): only 180 held-out problems after the first 64 (the periodic "
     "eval's) are new among 256; raise data.task.num_heldout (embedded tasks) or lower eval.final.num_problems"),
    ("model", ["model.name_or_path=./nosuch/model"],
     "ulorl-train: model.name_or_path: model path does not exist: ./nosuch/model (from {cwd}); give the folder that "
     "holds the model's config.json and weights (build or copy it there first), embedded, or a hub id"),
    ("uri", ["--tracking-uri", "ftp://host/store"],
     "ulorl-train: --tracking-uri ftp://host/store: MLflow has no tracking store for the scheme 'ftp'; use "
     "sqlite:///PATH/mlflow.db (a file), http(s)://HOST:PORT (a tracking server), postgresql://, mysql:// or "
     "mssql:// (a database)"),
])
def test_the_dry_run_refuses_what_the_run_refuses(tmp_path, capsys, case, extra, message):
    expected = message.format(cwd=Path.cwd())
    rc, err = _run(capsys, tmp_path, *extra, dry=True)
    assert (rc, err) == (2, expected)
    assert list(tmp_path.iterdir()) == []                 # no store, no run folder
    rc, err = _run(capsys, tmp_path, *extra, dry=False)   # the run: the same words
    assert (rc, err.splitlines()[-1]) == (2, expected)
    assert not (tmp_path / "runs").exists()


def test_a_hub_id_is_not_a_missing_folder_and_a_good_config_passes(tmp_path, capsys):
    from ulorl.models.loading import missing_local_model

    assert missing_local_model("Qwen/Qwen3-8B") is None          # org/name with no Qwen/ folder here: a hub id
    assert missing_local_model("embedded:choice") is None
    assert missing_local_model(str(tmp_path / "gone")).startswith(f"model path does not exist: {tmp_path / 'gone'};")
    assert missing_local_model("tests/nosuch_model") is not None  # tests/ is a folder here: a local path
    rc, err = _run(capsys, tmp_path, dry=True)
    assert (rc, err) == (0, "")
    assert list(tmp_path.iterdir()) == []
