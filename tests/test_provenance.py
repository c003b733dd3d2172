"""Where and when each run was made: the provenance tags a run records (ulorl.tracking.provenance), the
results rows that carry them, and the pre-registration check of ulorl-tables (ulorl.report.preregistration)
against a real git history."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ulorl.report import preregistration as PR
from ulorl.report.backfill import backfilled
from ulorl.tracking import provenance as P
from ulorl.tracking.run import RunTracker

ROOT = Path(__file__).resolve().parents[1]


def git(repo: Path, *args: str, when: str = "2026-01-01T00:00:00Z") -> str:
    env = {**os.environ, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when, "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def is_our_commit(sha: str) -> bool:
    """A full commit id of this checkout's history (HEAD when the run started; others may commit since)."""
    ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", sha, "HEAD"], cwd=ROOT)
    return len(sha) == 40 and ancestor.returncode == 0


def ms(iso: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A git repository whose sweeps/entropy/x.yaml names seeds 0-5 (committed 10:00) and then 0-19
    (committed 12:00)."""
    r = tmp_path / "repo"
    (r / "sweeps" / "entropy").mkdir(parents=True)
    git(r, "init", "-q")
    spec = r / "sweeps" / "entropy" / "x.yaml"
    spec.write_text(yaml.safe_dump({"name": "entropy_x", "repeats": 6}))
    git(r, "add", "sweeps/entropy/x.yaml")
    git(r, "commit", "-qm", "six seeds", when="2026-01-01T10:00:00Z")
    spec.write_text(yaml.safe_dump({"name": "entropy_x", "repeats": 20}))
    git(r, "commit", "-qam", "twenty seeds", when="2026-01-01T12:00:00Z")
    return r


def row(sweep: str, seeds: list[int], first_start: int | None) -> SimpleNamespace:
    return SimpleNamespace(run_ids=["r"], sweep=sweep, seed_offsets=seeds, first_start=first_start, spec="",
                           claim="c")


def test_spec_committed_before_the_first_run_is_pre_registered(repo: Path) -> None:
    p = PR.preregistration_of(row("entropy_x", [0, 1, 2, 3, 4, 5], ms("2026-01-01T10:30:00Z")), repo)
    assert p is not None and p.status == PR.YES, p
    assert p.spec == "sweeps/entropy/x.yaml" and p.committed_ms == ms("2026-01-01T10:00:00Z")


def test_seeds_added_to_the_spec_after_their_runs_started_are_not(repo: Path) -> None:
    # seeds 6-19 are first named by the 12:00 commit; their first run started at 11:00
    p = PR.preregistration_of(row("entropy_x", list(range(20)), ms("2026-01-01T11:00:00Z")), repo)
    assert p is not None and p.status == PR.NO and "60 min after" in p.why, p
    # a run before the file's first commit
    p = PR.preregistration_of(row("entropy_x", [0, 1], ms("2026-01-01T09:59:00Z")), repo)
    assert p is not None and p.status == PR.NO, p
    # seeds no version of the file names
    p = PR.preregistration_of(row("entropy_x", [0, 25], ms("2026-01-01T13:00:00Z")), repo)
    assert p is not None and p.status == PR.NO and "no commit" in p.why, p


def test_no_start_time_or_no_git_history_is_unknown(repo: Path, tmp_path: Path) -> None:
    p = PR.preregistration_of(row("entropy_x", [0], None), repo)
    assert p is not None and p.status == PR.UNKNOWN and "start time" in p.why
    p = PR.preregistration_of(row("entropy_missing", [0], ms("2026-01-02T00:00:00Z")), repo)
    assert p is not None and p.status == PR.UNKNOWN
    assert PR.preregistration_of(SimpleNamespace(run_ids=[]), repo) is None


def test_planned_offsets_of_a_sweep_yaml() -> None:
    assert PR.planned_offsets({"repeats": 2}) == {0, 1}
    assert PR.planned_offsets({"baseline": {"seeds": 4}}) == {0, 1, 2, 3}
    assert PR.planned_offsets({"baseline": {"name": "b"}, "references": [{"name": "s"}]}) == {0, 1}
    assert PR.planned_offsets({"seed_offsets": "20-22", "repeats": 9}) == {20, 21, 22}
    assert PR.spec_for_sweep("choice_is_mode") == "sweeps/choice/is_mode.yaml"
    assert PR.spec_for_sweep("mpt_threshold") == "sweeps/mpt_threshold.yaml"


def test_blas_and_row_provenance_from_tags() -> None:
    assert P.blas_build("  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release") == "mkl"
    assert P.blas_build("no settings") == P.UNKNOWN
    old = P.row_provenance({P.GIT_COMMIT_TAG: "abc"}, start_ms=ms("2026-01-01T10:00:00Z"), wall_s=90.0)
    assert old["commit"] == "abc" and old["started"] == "2026-01-01T10:00:00Z"
    assert old["ended"] == "2026-01-01T10:01:30Z" and old["ended_from"] == "start + time/wall_s"
    assert old["dirty"] == old["spec_sha256"] == old["blas"] == P.UNKNOWN
    assert P.row_provenance({})["started"] == P.row_provenance({})["ended"] == P.UNKNOWN


def test_backfill_keeps_a_recorded_provenance_and_derives_the_rest() -> None:
    rec = {"format": 1, "run_id": "a", "start_time": ms("2026-01-01T10:00:00Z"), "tags": {}, "metrics": {}}
    out = backfilled(rec, ("f" * 40, ms("2026-01-02T00:00:00Z")))
    assert out["provenance"]["started"] == "2026-01-01T10:00:00Z" and out["provenance"]["ended"] == P.UNKNOWN
    assert out["provenance"]["first_committed"] == "f" * 40 + " 2026-01-02T00:00:00Z"
    assert backfilled(out, None) is out
    assert backfilled({"run_id": "b", "label": "off seed+0"}, None)["provenance"]["started"] == P.UNKNOWN


def test_a_run_records_commit_spec_hash_times_and_machine(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\n")
    uri = f"sqlite:///{tmp_path}/m.db"
    parent = RunTracker.start(uri, "e", "parent", {}, {"ulorl.kind": "sweep"}, spec=spec)
    child = RunTracker.start(uri, "e", "child", {"a": 1}, {"ulorl.kind": "train"}, parent_run_id=parent.run_id)
    child.end()
    tags = MlflowClient(uri).get_run(child.run_id).data.tags
    assert tags[P.SPEC_HASH_TAG] == hashlib.sha256(b"name: s\n").hexdigest()   # taken over from the parent
    assert tags[P.SPEC_TAG].endswith("s.yaml")
    assert is_our_commit(tags[P.GIT_COMMIT_TAG]) and tags[P.GIT_DIRTY_TAG] in ("true", "false")
    assert tags[P.STARTED_TAG] <= tags[P.ENDED_TAG] and tags[P.ENDED_TAG].endswith("Z")
    for key in ("ulorl.hw.cpu", "ulorl.hw.threads", P.BLAS_TAG, "ulorl.version.torch", "ulorl.hw.host"):
        assert tags[key] and tags[key] != P.UNKNOWN, key


@pytest.mark.slow
def test_a_real_training_run_records_its_provenance(tmp_path: Path) -> None:
    """ulorl-train on the shipped quickstart experiment, 2 tiny steps: its MLflow run holds the provenance."""
    import sys

    uri = f"sqlite:///{tmp_path}/m.db"
    exp = ROOT / "experiments" / "quickstart.yaml"
    cmd = [sys.executable, "-m", "ulorl.cli.train", str(exp), "--tracking-uri", uri, "--run-dir", str(tmp_path / "r"),
           "--no-progress", "train.max_steps=2", "rollout.prompts_per_step=2", "rollout.group_size=2",
           "rollout.max_response_len=64", "eval.every=0", "train.threads=1"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    c = MlflowClient(uri)
    run = c.search_runs([c.get_experiment_by_name("ulorl").experiment_id])[0]
    tags = run.data.tags
    assert run.info.status == "FINISHED"
    assert tags[P.SPEC_TAG] == "experiments/quickstart.yaml"
    assert tags[P.SPEC_HASH_TAG] == hashlib.sha256(exp.read_bytes()).hexdigest()
    assert is_our_commit(tags[P.GIT_COMMIT_TAG]) and tags[P.GIT_DIRTY_TAG] in ("true", "false")
    assert tags[P.STARTED_TAG] <= tags[P.ENDED_TAG]
    assert tags["ulorl.hw.threads"] == "1" and tags[P.BLAS_TAG] != P.UNKNOWN and tags["ulorl.hw.cpu"]


def test_committed_preregistration_block_is_what_git_and_the_results_files_give() -> None:
    """paper_claims.md's pre-registration block (ulorl-tables --results experiments/results --docs ...):
    regime_eval's seeds were not fixed in a commit before its runs started; the headline's were."""
    from ulorl.report import claims as C
    from ulorl.report.results import ResultsStore

    text = (ROOT / "platform/ulorl/docs/paper_claims.md").read_text()
    block = text.split(C.PREREG_BEGIN + "\n", 1)[1].split(C.PREREG_END, 1)[0]
    results = C.evaluate_claims(ResultsStore.open(ROOT / "experiments" / "results"))
    assert block == PR.preregistration_markdown(results, ROOT)
    rows = {(line.split(" | ")[0].strip("| "), line.split(" | ")[1].split(" ")[0]): line
            for line in block.splitlines()[2:]}
    assert "**no**: committed 27 min after the first run started" in rows[("fig4_entropy", "entropy_regime_eval")]
    assert "**yes**" in rows[("headline", "choice_mpt_threshold")]
