"""``ulorl-bench weight-sync --engine vllm --json`` in a real process: vLLM logs its INFO lines to stdout
(and its engine core is a child process), yet stdout holds exactly one JSON document; the bench's bucket
defaults to the config's ``rollout.weight_sync_bucket_mb``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ulorl.config import RolloutConfig

ROOT = Path(__file__).resolve().parents[2]


def test_weight_sync_vllm_json_is_one_document_and_vllm_logs_go_to_stderr():
    out = subprocess.run([sys.executable, "-m", "ulorl.cli.bench", "weight-sync", "--engine", "vllm", "--size-mb", "16",
                          "--json"], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "platform")})
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.count("\n") == 1, out.stdout[:3000]     # one line: the document, nothing else
    doc = json.loads(out.stdout)
    assert doc["engine"] == "vllm" and doc["bucket_mb"] == RolloutConfig().weight_sync_bucket_mb
    assert [r["path"] for r in doc["results"]] == ["bucketed", "monolithic"]
    assert doc["results"][0]["within_bound"] is True
    assert "INFO" in out.stderr                                # vLLM's own log, moved to stderr
