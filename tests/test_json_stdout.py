"""``--json`` modes: exactly one JSON document on stdout, library output on stderr.

The mechanism is checked in a real process (a logger bound to stdout the way vLLM and DeepSpeed bind
theirs, prints, raw fd-1 writes, C stdio and a child process); then every command that has ``--json`` is
run with its cheapest arguments under fd-level capture (``zero3-memory``: a slow real process). Commands
whose cheapest run takes minutes have their ``--json`` checked by their own tests: ``ulorl-bench rollout``
(test_bench_rollout), ``memory`` (test_memory_bench), ``gpu_check`` (test_gpu_check),
``ulorl-eval`` (test_eval_runner_cli), ``ulorl-sweep`` (test_tracking_secrets, test_multinode_ray),
``weight-sync --engine vllm`` (tests/vllm/test_vllm_json.py, side venv).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ulorl.jsonout import emit_json, json_command, wants_json

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "experiments" / "quickstart.yaml"

NOISY = r'''
import ctypes, logging, os, subprocess, sys
from ulorl.jsonout import emit_json, json_command

handler = logging.StreamHandler(sys.stdout)          # bound at import time, as vLLM's and DeepSpeed's are
log = logging.getLogger("noisy.lib")
log.addHandler(handler)
log.setLevel(logging.INFO)

@json_command
def main(argv=None):
    log.info("LIB-LOG-LINE")
    print("STRAY-PRINT")
    os.write(1, b"RAW-FD1\n")
    ctypes.CDLL(None).printf(b"C-PRINTF\n")           # left in C's stdio buffer: flushed before fd 1 returns
    subprocess.run([sys.executable, "-c", "print('CHILD-PROCESS')"], check=True)
    emit_json({"answer": 42})
    log.info("LOG-AFTER-EMIT")
    print("PRINT-AFTER-EMIT")
    return 0

sys.exit(main())
'''


def test_every_kind_of_stray_output_goes_to_stderr_and_stdout_is_one_document():
    for flag, one_doc in (("--json", True), ("", False)):
        out = subprocess.run([sys.executable, "-c", NOISY] + ([flag] if flag else []), capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        noise = ("LIB-LOG-LINE", "STRAY-PRINT", "RAW-FD1", "C-PRINTF", "CHILD-PROCESS", "LOG-AFTER-EMIT",
                 "PRINT-AFTER-EMIT")
        if one_doc:
            assert out.stdout == '{"answer": 42}\n'
            assert json.loads(out.stdout) == {"answer": 42}
            assert all(n in out.stderr for n in noise), out.stderr
        else:  # without --json nothing is redirected
            assert all(n in out.stdout for n in noise) and '{"answer": 42}' in out.stdout


def test_a_second_document_is_refused_and_stdout_is_restored(capsys):
    @json_command
    def twice(argv=None):
        emit_json({"a": 1})
        emit_json({"b": 2})

    before = sys.stdout
    with pytest.raises(RuntimeError, match="exactly one JSON document"):
        twice(["--json"])
    assert sys.stdout is before
    assert json.loads(capsys.readouterr().out) == {"a": 1}


def test_wants_json_accepts_what_argparse_accepts():
    assert wants_json(["x", "--json"]) and wants_json(["--jso"]) and wants_json(["--js"])
    assert not wants_json(["--j"]) and not wants_json(["--judge-model", "m"]) and not wants_json(["--jsonl"])
    assert not wants_json([])


def _one_document(capfd: pytest.CaptureFixture[str]) -> dict:
    out = capfd.readouterr().out
    assert out.endswith("\n") and out.count("\n") == 1, out[:2000]   # one line: one document, nothing else
    return json.loads(out)


def test_sim_data_verifier_clean_json_are_one_document(tmp_path, capfd):
    from ulorl.cli import bench, clean, data, sim

    assert sim.main(["paper", "--json", "--steps", "10"]) == 0
    assert _one_document(capfd)["command"] == "paper"
    assert data.main(["sample", "--n", "2", "--json"]) == 0
    assert len(_one_document(capfd)["items"]) == 2
    labelled = tmp_path / "l.jsonl"
    labelled.write_text(json.dumps({"response": r"\boxed{12}", "answer": "12", "label": True}) + "\n")
    assert bench.main(["verifier", str(labelled), "--json"]) == 0
    assert _one_document(capfd)["n"] == 1
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps({"problem": "What is 2+2?", "answer": "4"}) + "\n")
    assert clean.main([str(raw), "--out", str(tmp_path / "c.jsonl"), "--json"]) == 0
    assert _one_document(capfd)["rows_out"] == 1


def test_dashboard_sweep_dry_run_and_vllm_env_json_are_one_document(tmp_path, capfd):
    from ulorl.cli import dashboard, sweep
    from ulorl.scale import vllm_env

    assert dashboard.main(["--dry-run", "--json", "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--port", "0"]) == 0
    assert _one_document(capfd)["dry_run"] is True
    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: s\nbase: {QUICK}\nspace:\n  algo.mpt.tau: {{grid: [0.9, 0.99]}}\n"
                    "search: {algorithm: grid}\nnum_samples: 1\n")
    assert sweep.main([str(spec), "--dry-run", "--json"]) == 0
    doc = _one_document(capfd)
    assert doc["sweep"] == "s" and len(doc["trials"]) == 2
    assert vllm_env.main(["--check", "--venv", str(tmp_path / "no-venv"), "--json"]) == 1
    assert _one_document(capfd)["ok"] is False


def test_tables_json_is_one_document(tmp_path, capfd):
    from ulorl.cli import tables
    from ulorl.tracking import prepare_store

    prepare_store(f"sqlite:///{tmp_path}/empty.db")   # an empty store (a missing one is refused)
    assert tables.main(["--tracking-uri", f"sqlite:///{tmp_path}/empty.db", "--out", str(tmp_path / "o"),
                        "--json"]) == 0
    assert "tables" in _one_document(capfd)


def test_weight_sync_hf_json_is_one_document_and_bucket_default_is_the_configs(capfd):
    from ulorl.cli import bench
    from ulorl.config import RolloutConfig

    parser = bench.build_parser()
    assert parser.parse_args(["weight-sync"]).bucket_mb == RolloutConfig().weight_sync_bucket_mb
    assert bench.main(["weight-sync", "--engine", "hf", "--size-mb", "4", "--bucket-mb", "1", "--json"]) == 0
    doc = _one_document(capfd)
    assert doc["engine"] == "hf" and [r["path"] for r in doc["results"]] == ["in-process"]


@pytest.mark.slow
def test_zero3_memory_json_is_one_document_with_deepspeed_logs_on_stderr():
    """A real process with real DeepSpeed ranks (child processes; ~145 s under load on 2 cores)."""
    out = subprocess.run([sys.executable, "-m", "ulorl.cli.bench", "zero3-memory", "--size-mb", "2", "--ranks", "1",
                          "--paths", "partitioned", "--bucket-mb", "1", "--json"], capture_output=True, text=True,
                         timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT / "platform"), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("\n") == 1
    doc = json.loads(out.stdout)
    assert doc["ranks"] == 1 and "partitioned" in json.dumps(doc)
    assert "[ulorl-bench] path partitioned" in out.stderr   # progress on stderr
