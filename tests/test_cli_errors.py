"""Errors a user meets first: a mistyped or invalid command-line override (named as the override,
with a "did you mean"), a sqlite tracking URI whose folder does not exist, a run or sweep name that would
leave its folder, a YAML file that is not UTF-8 or is a folder, a tracking URI MLflow cannot open, and the
weak answers made clear (--num-cpus 0, an unknown distribution, the dashboard beyond loopback, a step batch
no node holds, ulorl-tables on a missing store). Each: the message, the exit code, nothing created."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from ulorl.cli import sweep as sweep_cli
from ulorl.cli import train as train_cli
from ulorl.config import ConfigError, load_experiment
from ulorl.tracking import require_store_folder

QUICK = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml"


def test_mistyped_override_key_suggests_the_key():
    with pytest.raises(ConfigError) as err:
        load_experiment(QUICK, ["algo.mpt.taux=0.9"])
    text = str(err.value)
    assert "command-line override(s) algo.mpt.taux=0.9" in text
    assert "algo.mpt.taux: unknown key (did you mean algo.mpt.tau?)" in text


def test_model_level_error_from_an_override_blames_the_override_without_root_prefix():
    with pytest.raises(ConfigError) as err:
        load_experiment(QUICK, ["algo.is_mode=tois"])
    text = str(err.value)
    assert text.startswith("invalid experiment config in the command-line override(s) algo.is_mode=tois")
    assert "<root>" not in text and "Value error," not in text
    assert "requires rollout.segments=1" in text


def test_an_invalid_file_is_still_blamed_on_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(QUICK.read_text().replace("tau: 0.99", "tau: 1.5"))
    with pytest.raises(ConfigError) as err:
        load_experiment(bad, ["train.max_steps=2"])
    assert f"in {bad}" in str(err.value) and "algo.mpt.tau" in str(err.value)


def test_missing_sqlite_folder_is_refused(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'missing' / 'x.db'}"
    with pytest.raises(FileNotFoundError, match="missing does not exist"):
        require_store_folder(uri)
    require_store_folder(f"sqlite:///{tmp_path / 'x.db'}")        # an existing folder is fine
    rc = train_cli.main([str(QUICK), "--tracking-uri", uri, "train.max_steps=1", "--no-progress"])
    assert rc == 2 and "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()


def test_missing_extra_is_reported_with_the_install_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)    # vLLM not installed, whatever this venv holds
    rc = train_cli.main([str(QUICK), "rollout.engine=vllm", f"train.output_dir={tmp_path / 'runs'}",
                         "--tracking-uri", f"sqlite:///{tmp_path / 'x.db'}", "--no-progress"])
    assert rc == 2
    assert "pip install 'ulorl[gpu]'" in capsys.readouterr().err


def test_missing_extra_is_caught_by_its_type_not_its_name(tmp_path, monkeypatch, capsys):
    from ulorl.rollout.engines import MissingExtraError
    from ulorl.train import trainer

    class JudgeExtraMissing(MissingExtraError):   # a subclass: another class name, the same meaning
        pass

    def fail_with(exc: Exception):
        def run(self):
            raise exc
        return run

    args = [str(QUICK), f"train.output_dir={tmp_path / 'runs'}", "--tracking-uri", f"sqlite:///{tmp_path / 'x.db'}",
            "--no-progress"]
    monkeypatch.setattr(trainer.Trainer, "run", fail_with(JudgeExtraMissing("pip install 'ulorl[judge]'")))
    assert train_cli.main(args) == 2
    assert "ulorl-train: pip install 'ulorl[judge]'" in capsys.readouterr().err
    monkeypatch.setattr(trainer.Trainer, "run", fail_with(RuntimeError("MissingExtraError")))
    with pytest.raises(RuntimeError, match="MissingExtraError"):   # any other RuntimeError propagates
        train_cli.main(args)


# ----------------------------------------------------------------------------- names stay in their folder
def _name_error(name: str, why: str, where: str = "the run's folder under train.output_dir") -> str:
    return (f"  name: must be one folder name, as it names {where}: this one {why}; use letters, digits, '-', '_' "
            f"and '.' (e.g. my_run)")


@pytest.mark.parametrize("name, why", [("../escape", "contains '/'"), ("/abs/path", "contains '/'"),
                                       ("..", "is '..', which names no folder of its own")])
def test_a_run_name_that_would_leave_its_folder_is_refused_at_load(tmp_path, capsys, name, why):
    runs = tmp_path / "out" / "runs"
    over = [f"name={name}", f"train.output_dir={runs}"]
    rc = train_cli.main([str(QUICK), *over, "--tracking-uri", f"sqlite:///{tmp_path / 'x.db'}", "--no-progress"])
    assert rc == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (f"ulorl-train: invalid experiment config in the command-line override(s) {' '.join(over)} "
                        f"(on {QUICK}):")
    assert lines[1] == _name_error(name, why) + f" (got {name!r})"
    assert sorted(p.name for p in tmp_path.iterdir()) == []      # no run folder, no store, nothing outside
    exp = tmp_path / "exp.yaml"                                   # the same name in the file: the file is named
    exp.write_text(QUICK.read_text().replace("\nname: quickstart\n", f"\nname: {json.dumps(name)}\n"))
    assert train_cli.main([str(exp), "--dry-run"]) == 2
    assert capsys.readouterr().err.splitlines()[:2] == [f"ulorl-train: invalid experiment config in {exp}:",
                                                        _name_error(name, why) + f" (got {name!r})"]


def test_a_sweep_name_that_would_leave_its_folder_is_refused_at_load(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: ../../x\nbase: {QUICK}\nspace:\n  algo.mpt.tau: {{grid: [0.9]}}\n"
                    "search: {algorithm: grid}\n")
    rc = sweep_cli.main([str(spec), "--output-dir", str(tmp_path / "out"), "--tracking-uri",
                         f"sqlite:///{tmp_path / 'x.db'}"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == (
        f"ulorl-sweep: invalid sweep spec in {spec}:\n"
        + _name_error("../../x", "contains '/'", "the sweep's folder <output-dir>/sweeps/<name>"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


# ----------------------------------------------------------------------------- files that are not what they say
def test_a_non_utf8_experiment_or_sweep_yaml_is_named_with_line_and_fix(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"# caf\xe9\n" + QUICK.read_bytes())
    fix = f"YAML files must be UTF-8: convert it, e.g. iconv -f latin1 -t utf-8 {bad} > {tmp_path / 'bad.utf8.yaml'}"
    assert train_cli.main([str(bad), "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == f"ulorl-train: {bad}:1: not UTF-8 text (byte 0xe9); {fix}"
    spec = tmp_path / "s.yaml"
    spec.write_bytes(f"name: s\nbase: {QUICK}\n".encode() + b"# r\xe9sum\xe9\nspace: {}\n")
    assert sweep_cli.main([str(spec), "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ulorl-sweep: {spec}:3: not UTF-8 text (byte 0xe9); YAML files must be UTF-8: convert it, e.g. iconv -f "
        f"latin1 -t utf-8 {spec} > {tmp_path / 's.utf8.yaml'}")
    spec.write_text(f"name: s\nbase: {bad}\nspace:\n  algo.mpt.tau: {{grid: [0.9]}}\nsearch: {{algorithm: grid}}\n")
    assert sweep_cli.main([str(spec), "--dry-run"]) == 2          # a non-UTF-8 base: the base file is named
    assert capsys.readouterr().err.strip() == f"ulorl-sweep: {spec}: base: {bad}:1: not UTF-8 text (byte 0xe9); {fix}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "s.yaml"]


def test_an_experiment_or_sweep_path_that_is_a_folder_says_so(tmp_path, capsys):
    folder = tmp_path / "experiments"
    folder.mkdir()
    for n in ("b.yaml", "a.yaml"):
        (folder / n).write_text("train: {max_steps: 1}\n")
    assert train_cli.main([str(folder), "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ulorl-train: experiment {folder} is a folder, not a file: give one YAML file; it holds a.yaml, b.yaml")
    assert sweep_cli.main([str(folder), "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ulorl-sweep: sweep {folder} is a folder, not a file: give one YAML file; it holds a.yaml, b.yaml")


# ----------------------------------------------------------------------------- a tracking URI MLflow cannot open
FTP = ("ftp://host/x: MLflow has no tracking store for the scheme 'ftp'; use sqlite:///PATH/mlflow.db (a file), "
       "http(s)://HOST:PORT (a tracking server), postgresql://, mysql:// or mssql:// (a database)")


def test_a_tracking_uri_mlflow_cannot_open_is_refused_before_any_work(tmp_path, capsys):
    from ulorl.cli import dashboard, tables
    from ulorl.cli import eval as eval_cli

    runs = tmp_path / "runs"
    t0 = time.perf_counter()
    rc = train_cli.main([str(QUICK), f"train.output_dir={runs}", "--tracking-uri", "ftp://host/x", "--no-progress"])
    assert rc == 2 and capsys.readouterr().err.strip() == f"ulorl-train: --tracking-uri {FTP}"
    rc = train_cli.main([str(QUICK), f"train.output_dir={runs}", "tracking.uri=ftp://host/x", "--no-progress"])
    assert rc == 2 and capsys.readouterr().err.strip() == f"ulorl-train: tracking.uri {FTP}"
    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: s\nbase: {QUICK}\nspace:\n  algo.mpt.tau: {{grid: [0.9]}}\nsearch: {{algorithm: grid}}\n")
    assert sweep_cli.main([str(spec), "--tracking-uri", "ftp://host/x", "--output-dir", str(runs)]) == 2
    assert capsys.readouterr().err.strip() == f"ulorl-sweep: --tracking-uri {FTP}"
    assert tables.main(["--tracking-uri", "ftp://host/x", "--out", str(runs)]) == 2
    assert capsys.readouterr().err.strip() == f"ulorl-tables: error: --tracking-uri {FTP}"
    assert eval_cli.main(["--benchmark", "heldout", "--k", "1", "--tracking-uri", "ftp://host/x"]) == 2
    assert capsys.readouterr().err.strip() == f"ulorl-eval: error: --tracking-uri {FTP}"
    assert dashboard.main(["--dry-run", "--port", "0", "--tracking-uri", "ftp://host/x"]) == 2
    assert capsys.readouterr().err.strip() == f"ulorl-dashboard: --tracking-uri {FTP}"
    assert time.perf_counter() - t0 < 30          # refused up front: no model was loaded by any of them
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


# ----------------------------------------------------------------------------- weak answers made clear
def test_num_cpus_zero_is_refused(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: s\nbase: {QUICK}\nspace:\n  algo.mpt.tau: {{grid: [0.9]}}\nsearch: {{algorithm: grid}}\n")
    for n in ("0", "-2"):
        rc = sweep_cli.main([str(spec), "--num-cpus", n, "--output-dir", str(tmp_path / "out"),
                             "--tracking-uri", f"sqlite:///{tmp_path / 'x.db'}"])
        assert rc == 2
        assert capsys.readouterr().err.strip() == (
            f"ulorl-sweep: --num-cpus must be at least 1, got {n}; leave it out to give Ray every CPU of this "
            f"machine ({os.cpu_count()})")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


def test_an_unknown_distribution_lists_the_valid_ones(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    valid = ("use one of choice, grid, uniform, loguniform, randint, e.g. {choice: [0.9, 0.99]}, {grid: [1, 2]}, "
             "{uniform: [0.1, 0.6]}, {loguniform: [1e-6, 1e-4]}, {randint: [1, 8]}")
    for body, said in (("{normal: [0.9, 1.0]}", "unknown distribution 'normal'"),
                       ("[0.9, 0.99]", "expected a distribution, got [0.9, 0.99]")):
        spec.write_text(f"name: s\nbase: {QUICK}\nspace:\n  algo.mpt.tau: {body}\n")
        assert sweep_cli.main([str(spec), "--dry-run"]) == 2
        assert capsys.readouterr().err.strip() == (
            f"ulorl-sweep: invalid sweep spec in {spec}:\n  space.algo.mpt.tau: {said}; {valid}")


def test_dashboard_beyond_loopback_warns_that_the_store_is_served_without_auth(tmp_path, capsys):
    from ulorl.cli import dashboard

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    assert dashboard.main(["--dry-run", "--address", "0.0.0.0", "--port", "8599", "--tracking-uri", uri]) == 0
    err = capsys.readouterr().err
    assert (f"ulorl-dashboard: warning: --address 0.0.0.0 serves the MLflow store {uri} (every run, its params, "
            "metrics and sampled text) without authentication to anyone who can reach this machine on port 8599; to "
            "look from another machine, keep the default 127.0.0.1 and tunnel: ssh -L 8599:127.0.0.1:8599 "
            "<this host>") in err.splitlines()
    assert dashboard.main(["--dry-run", "--port", "8599", "--tracking-uri", uri]) == 0
    assert "warning" not in capsys.readouterr().err                  # loopback: nothing to warn about


def test_dry_run_flags_a_step_batch_no_node_can_hold(capsys):
    def plan(*over: str) -> dict:
        assert train_cli.main([str(QUICK), *over, "--dry-run"]) == 0
        return json.loads(capsys.readouterr().out.split("# plan\n", 1)[1])["memory_estimate_gib"]

    huge = plan("rollout.prompts_per_step=10000000000")
    # 10^10 prompts x 8 samples x (512 + 1024 prompt tokens) x 34 bytes
    assert huge["trainer_step_batch_host"] == pytest.approx(8e10 * 1536 * 34 / 2**30, rel=1e-3)
    assert huge["trainer_fits"] is False
    assert huge["trainer_note"].endswith("lower rollout.prompts_per_step x rollout.group_size")
    fine = plan()
    assert fine["trainer_fits"] is True and "DOES NOT FIT" not in fine["trainer_note"]


def test_tables_refuses_a_missing_store_and_an_out_that_is_a_file(tmp_path, capsys):
    from ulorl.cli import tables
    from ulorl.tracking import prepare_store

    typo = tmp_path / "mlfow" / "mlflow.db"
    assert tables.main(["--tracking-uri", f"sqlite:///{typo}", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ulorl-tables: error: no MLflow store at {typo} (the folder {typo.parent} does not exist either); check "
        "--tracking-uri (or $MLFLOW_TRACKING_URI): ulorl-train and ulorl-sweep write ./mlflow.db by default")
    assert sorted(p.name for p in tmp_path.iterdir()) == []         # nothing created: no store, no folder
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    prepare_store(store)
    taken = tmp_path / "notes.txt"
    taken.write_text("mine\n")
    for out, problem in ((taken, "is a file"), (taken / "tables", f"is inside {taken}, which is a file")):
        assert tables.main(["--tracking-uri", store, "--out", str(out)]) == 2
        assert capsys.readouterr().err.strip() == (
            f"ulorl-tables: error: --out {out} {problem}; give a folder (created when missing)")
    assert taken.read_text() == "mine\n"
