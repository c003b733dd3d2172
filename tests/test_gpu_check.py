"""``python -m ulorl.scale.gpu_check``: report file, exit status 2 on CPU, stages importing only what
a GPU machine without internet holds (torch, transformers and the carried wheels)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ulorl.scale.gpu_check import STAGES

# packages a bare GPU machine does not have: every stage must run or skip without them
BLOCKED = ("mlflow", "ray", "vllm", "pandas", "optuna", "streamlit", "math_verify", "matplotlib", "rich")  # (sympy, numpy, ... come with torch)

# absent, as on a bare machine: importing fails, and find_spec (what optional-dependency probes
# such as transformers' ask) answers None
SITECUSTOMIZE = """
import importlib.util
import sys
BLOCKED = {blocked!r}
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{{name}} is blocked for this test", name=name)
        return None
sys.meta_path.insert(0, _Block())
_find_spec = importlib.util.find_spec
def find_spec(name, package=None):
    if name.split(".")[0] in BLOCKED:
        return None
    return _find_spec(name, package)
importlib.util.find_spec = find_spec
"""


def _blocked_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=BLOCKED))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer")
def test_without_cuda_exits_2_and_writes_every_stage_skipped(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ulorl.scale.gpu_check", "--out", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "no CUDA device visible" in out.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ok"] is False
    assert [s["stage"] for s in report["stages"]] == list(STAGES)
    assert {s["status"] for s in report["stages"]} == {"skipped"}
    assert all(s["reason"] == "no CUDA device visible" for s in report["stages"])


@pytest.mark.slow
def test_stages_need_only_torch_transformers_and_carried_wheels(tmp_path):
    env = _blocked_env(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import mlflow"], capture_output=True, text=True, env=env, timeout=60)
    assert probe.returncode != 0 and "blocked" in probe.stderr  # the blocker works
    stages = "env,model,hf_engine,zero2,trainer,vllm,vllm_moe,ray"
    out = subprocess.run([sys.executable, "-m", "ulorl.scale.gpu_check", "--device", "cpu", "--stages", stages,
                          "--steps", "1", "--budget-s", "550", "--out", str(tmp_path / "r.json")], capture_output=True, text=True,
                         timeout=600, env=env)
    report = json.loads((tmp_path / "r.json").read_text())
    status = {s["stage"]: (s["status"], s.get("reason") or s.get("error")) for s in report["stages"]}
    assert out.returncode == 0, (status, out.stderr[-3000:])
    assert {k: v[0] for k, v in status.items()} == {
        "env": "pass", "model": "pass", "hf_engine": "pass", "zero2": "pass",
        "trainer": "skipped", "vllm": "skipped", "vllm_moe": "skipped", "ray": "skipped"}
    assert status["trainer"][1] == "mlflow not installed" and status["ray"][1] == "ray not installed"
    assert status["vllm"][1] == "vllm not installed"
