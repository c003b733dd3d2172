"""The one reader of per-problem scores (``ulorl.tracking.read``) on a real sqlite MLflow store: which
CSV each caller's settings pick (the last periodic eval, a given step, an eval run's whole-run CSV
first), and what a run without scores or with an unreadable file gives."""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlparse

import pytest
from mlflow.exceptions import MlflowException
from mlflow_store import StoreBase, migrated_empty_db

from ulorl.tracking import schema
from ulorl.tracking.read import PerProblemReader, parse_per_problem_csv


def _csv(scores: dict[str, int], k: int = 4) -> str:
    return "problem_id,num_correct,k\n" + "".join(f"{p},{c},{k}\n" for p, c in scores.items())


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> StoreBase:
    root = tmp_path_factory.mktemp("read")
    return StoreBase(root, migrated_empty_db(tmp_path_factory.mktemp("template")))


def test_csv_reads_accuracy_from_counts_or_the_accuracy_column():
    assert parse_per_problem_csv(_csv({"a": 1, "b": 4})) == {"a": 0.25, "b": 1.0}
    assert parse_per_problem_csv("problem_id,accuracy\nx,0.5\n") == {"x": 0.5}
    assert parse_per_problem_csv("") == {}


def test_the_last_step_a_given_step_and_the_whole_run_csv(store: StoreBase):
    c = store.client
    rid = c.create_run(store.exp).info.run_id
    c.log_text(rid, _csv({"p": 1}), schema.per_problem_artifact("heldout", 20))
    c.log_text(rid, _csv({"p": 3}), schema.per_problem_artifact("heldout", 100))
    c.log_text(rid, _csv({"p": 2}), schema.per_problem_artifact("heldout", 9))
    c.log_text(rid, _csv({"q": 4}), schema.per_problem_artifact("heldout_select", 300))
    c.log_text(rid, _csv({"w": 2}), schema.per_problem_artifact("heldout"))
    reader = PerProblemReader(c)
    assert sorted(reader.periodic(rid)) == [("heldout", 9), ("heldout", 20), ("heldout", 100),
                                            ("heldout_select", 300)]
    assert reader.scores(rid) == {"p": 0.75}                          # step 100 > 20 > 9, not the file order
    assert reader.scores(rid, step=20) == {"p": 0.25}
    assert reader.scores(rid, step=21) == {}                          # no eval at that step
    assert reader.scores(rid, "heldout_select") == {"q": 1.0}
    assert reader.scores(rid, whole_run=True) == {"w": 0.5}           # an eval run's own CSV first
    assert reader.scores(rid, step=20, whole_run=True) == {"p": 0.25}  # a step asks for the periodic one
    assert reader.scores(rid, "aime2025", whole_run=True) == {}
    assert reader.csv(rid, "heldout", 9) == _csv({"p": 2})


def test_a_run_without_artifacts_has_no_scores(store: StoreBase):
    rid = store.client.create_run(store.exp).info.run_id
    reader = PerProblemReader(store.client)
    assert reader.files(rid) == [] and reader.scores(rid) == {} and reader.scores(rid, whole_run=True) == {}


def test_the_listing_is_read_once_and_an_unreadable_file_raises_unless_not_strict(store: StoreBase):
    c = store.client
    rid = c.create_run(store.exp).info.run_id
    c.log_text(rid, _csv({"p": 2}), schema.per_problem_artifact("heldout", 5))
    reader = PerProblemReader(c)
    assert reader.scores(rid) == {"p": 0.5}
    c.log_text(rid, _csv({"p": 4}), schema.per_problem_artifact("heldout", 6))
    assert reader.scores(rid) == {"p": 0.5}                            # this reader's listing: step 5 only
    assert PerProblemReader(c).scores(rid) == {"p": 1.0}               # a new reader sees step 6
    shutil.rmtree(Path(urlparse(c.get_run(rid).info.artifact_uri).path) / "eval")
    with pytest.raises(MlflowException):
        reader.scores(rid)
    assert reader.scores(rid, strict=False) == {}
