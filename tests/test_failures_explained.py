"""Failures that explain themselves: one message naming the file, key or path and the fix, a non-zero exit
code, and nothing in the store or run folder lost or left half-written. Non-UTF-8 data, an empty
experiment, a sweep whose space is empty (the read-only store and concurrent new stores:
test_store_safety.py; --json: test_json_stdout.py)."""

from __future__ import annotations

import json
from pathlib import Path

from ulorl.cli import clean as clean_cli
from ulorl.cli import sweep as sweep_cli
from ulorl.cli import train as train_cli

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "quickstart.yaml"
TINY = ["rollout.prompts_per_step=1", "rollout.group_size=2", "rollout.max_response_len=16", "rollout.segments=1",
        "algo.dynamic_sampling=false", "eval.every=0", "train.checkpoint_every=1", "train.threads=1"]


def _latin1_jsonl(path: Path) -> Path:
    path.write_bytes(json.dumps({"problem": "What is 1+1?", "answer": "2"}).encode() + b"\n"
                     + '{"problem": "Combien font 2+2, café?", "answer": "4"}\n'.encode("latin-1"))
    return path


# ----------------------------------------------------------------------------- non-UTF-8 data
def test_non_utf8_data_is_named_with_file_and_line_by_clean_and_train(tmp_path, capsys):
    bad = _latin1_jsonl(tmp_path / "raw.jsonl")
    want = (f"{bad}:2: not UTF-8 text (byte 0xe9 at byte 35 of the line); JSONL files must be UTF-8: convert it, "
            f"e.g. iconv -f latin1 -t utf-8 {bad} > {tmp_path / 'raw.utf8.jsonl'}")
    out = tmp_path / "clean" / "out.jsonl"
    assert clean_cli.main([str(bad), "--out", str(out), "--json"]) == 2
    cap = capsys.readouterr()
    assert cap.err.strip() == f"ulorl-clean: error: {want}" and cap.out == ""
    assert not out.parent.exists()                       # no output, no half-written report

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rc = train_cli.main([str(QUICK), f"data.train={bad}", "train.max_steps=1", *TINY, "--tracking-uri", uri,
                         "--run-dir", str(tmp_path / "run"), "--no-progress"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == f"ulorl-train: {want}"
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlflow.db").exists()   # it failed before both


# ----------------------------------------------------------------------------- empty inputs
def test_empty_experiment_yaml_is_refused(tmp_path, capsys):
    for text in ("", "# only a comment\n", "{}\n"):
        empty = tmp_path / "empty.yaml"
        empty.write_text(text)
        rc = train_cli.main([str(empty), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                             "--run-dir", str(tmp_path / "run"), "--no-progress"])
        assert rc == 2
        assert capsys.readouterr().err.strip() == (
            f"ulorl-train: {empty}: the experiment file is empty (no section, no key), so every setting would be a "
            "default; start from experiments/quickstart.yaml, or list the keys it changes (ulorl-train --explain "
            "shows them all)")
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlflow.db").exists()


def test_sweep_with_empty_space_is_refused(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    for body in ("space: {}\n", "space: {}\nsearch: {algorithm: grid}\nnum_samples: 3\n"):
        spec.write_text(f"name: s\nbase: {QUICK}\n{body}")
        rc = sweep_cli.main([str(spec), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                             "--output-dir", str(tmp_path / "out")])
        assert rc == 2
        assert capsys.readouterr().err.strip() == (
            f"ulorl-sweep: {spec}: space is empty, so every trial would run the same configuration; add a key to "
            "space (e.g. algo.mpt.tau: {choice: [0.9, 0.99]}), or with search: {algorithm: grid} list variants or "
            "set repeats > 1")
    assert not (tmp_path / "out").exists() and not (tmp_path / "mlflow.db").exists()
    # a grid that varies through variants or repeats is still a sweep
    spec.write_text(f"name: s\nbase: {QUICK}\nsearch: {{algorithm: grid}}\nrepeats: 2\n")
    assert sweep_cli.main([str(spec), "--dry-run"]) == 0
