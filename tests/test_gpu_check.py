"""``python -m ulorl.bench.gpu_check``: report file, exit status 2 on CPU, a missing package fails its
stage unless ``--allow-missing`` names it; on CPU (slow, one run): every stage but long_rows passes, the
long-row update stage at a small shape, stages importing only what a GPU machine without internet holds
(torch, transformers and the carried wheels), ``--json`` printing the report as one document."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ulorl.bench.gpu_check import DEFAULT_STAGES

# packages neither torch + transformers nor the carried wheels (ulorl.bench.gpu_wheels) bring
# (sympy, numpy, rich, ... come with torch / transformers)
BLOCKED = ("ray", "vllm", "pandas", "pyarrow", "optuna", "streamlit", "matplotlib", "scipy", "sklearn", "flask")

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


def _blocked_env(tmp_path: Path, blocked: tuple[str, ...] = BLOCKED) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=blocked))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer")
def test_without_cuda_exits_2_and_writes_every_stage_skipped(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ulorl.bench.gpu_check", "--out", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "no CUDA device visible" in out.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ok"] is False
    assert [s["stage"] for s in report["stages"]] == list(DEFAULT_STAGES)
    assert {s["status"] for s in report["stages"]} == {"skipped"}
    assert all(s["reason"] == "no CUDA device visible" for s in report["stages"])


def _run(args: list[str], env: dict[str, str], tmp_path: Path, timeout: int = 120) -> tuple[int, dict, str]:
    out = tmp_path / "r.json"
    out.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "ulorl.bench.gpu_check", "--device", "cpu", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)
    report = json.loads(out.read_text()) if out.is_file() else {}
    return proc.returncode, report, proc.stdout + proc.stderr


def _status(report: dict) -> dict[str, tuple[str, str]]:
    return {s["stage"]: (s["status"], s.get("reason") or s.get("error") or "") for s in report["stages"]}


def test_a_missing_package_fails_its_stage_unless_allowed(tmp_path):
    """No stage child runs here: the package check and the prerequisite check come first."""
    env = _blocked_env(tmp_path, ("deepspeed",))
    rc, report, log = _run(["--stages", "zero3,long_update"], env, tmp_path)
    status = _status(report)
    assert rc == 1 and report["ok"] is False, log[-2000:]
    for name in ("zero3", "long_update"):
        assert status[name][0] == "fail" and "deepspeed not installed" in status[name][1], status
        assert f"--allow-missing {name}" in status[name][1]
    rc, report, log = _run(["--stages", "zero3,long_update", "--allow-missing", "long_update,ray"], env, tmp_path)
    status = _status(report)
    assert rc == 1 and status["zero3"][0] == "fail", log[-2000:]   # allowing another stage does not help zero3
    assert status["long_update"] == ("skipped", "deepspeed not installed (allowed by --allow-missing)")
    rc, report, log = _run(["--stages", "zero3,long_update", "--allow-missing", "zero3,long_update"], env, tmp_path)
    assert rc == 0 and report["ok"] is True, log[-2000:]
    assert {s for s, _ in _status(report).values()} == {"skipped"}


def test_a_stage_that_cannot_run_fails_the_run(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rc, report, log = _run(["--stages", "zero2"], env, tmp_path)   # its prerequisite, model, was not run
    assert rc == 1 and _status(report)["zero2"] == ("fail", "needs stage model to pass first (not run or failed)")
    rc, report, log = _run(["--stages", "env", "--budget-s", "5"], env, tmp_path)   # no time left for it
    assert rc == 1 and "budget" in _status(report)["env"][1], log[-2000:]
    proc = subprocess.run([sys.executable, "-m", "ulorl.bench.gpu_check", "--device", "cpu", "--allow-missing", "nope"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown stage(s) ['nope']" in proc.stderr


# Every stage but long_rows on CPU, in ONE run (each stage is a fresh process importing torch, transformers and
# DeepSpeed: one run instead of one per test), with every package a GPU machine without internet may lack
# blocked, so the stages that pass need only torch, transformers and the carried wheels. long_update runs at a
# small shape (its Qwen3-4B width is for a GPU); vllm / vllm_moe / ray are blocked and allowed missing here (the
# ray stage runs unblocked below).
CPU_STAGES = ("env", "model", "hf_engine", "zero2", "zero3", "long_update", "trainer", "vllm", "vllm_moe", "ray")


@pytest.fixture(scope="module")
def blocked_cpu_run(tmp_path_factory) -> tuple[int, dict, str]:
    tmp = tmp_path_factory.mktemp("gpu_check")
    env = _blocked_env(tmp)
    probe = subprocess.run([sys.executable, "-c", "import pandas"], capture_output=True, text=True, env=env, timeout=60)
    assert probe.returncode != 0 and "blocked" in probe.stderr  # the blocker works
    out = tmp / "r.json"
    proc = subprocess.run([sys.executable, "-m", "ulorl.bench.gpu_check", "--device", "cpu", "--out", str(out),
                           "--json", "--stages", ",".join(CPU_STAGES), "--steps", "2", "--budget-s", "1100",
                           "--allow-missing", "vllm,vllm_moe,ray", "--long-update-shape", "small",
                           "--long-update-tokens", "128,256", "--long-update-layers", "1"],
                          capture_output=True, text=True, timeout=1200, env=env)
    report = json.loads(out.read_text()) if out.is_file() else {}
    # --json: the report is the one document on stdout (stage progress and library logs on stderr)
    assert proc.stdout.count("\n") == 1 and json.loads(proc.stdout) == report, proc.stdout[-2000:]
    return proc.returncode, report, proc.stdout + proc.stderr


@pytest.mark.slow  # one run of 7 stage processes: ~2 min on an idle 2-core machine (DeepSpeed's init dominates)
def test_stages_pass_on_cpu_needing_only_torch_transformers_and_carried_wheels(blocked_cpu_run):
    rc, report, log = blocked_cpu_run
    status = _status(report)
    assert rc == 0 and report["ok"], (status, log[-3000:])
    assert [s["stage"] for s in report["stages"]] == list(CPU_STAGES)
    assert {k: v[0] for k, v in status.items()} == {
        "env": "pass", "model": "pass", "hf_engine": "pass", "zero2": "pass", "zero3": "pass", "long_update": "pass",
        "trainer": "pass", "vllm": "skipped", "vllm_moe": "skipped", "ray": "skipped"}
    assert status["ray"][1] == "ray not installed (allowed by --allow-missing)"
    trainer = next(s for s in report["stages"] if s["stage"] == "trainer")
    assert trainer["steps"] == 2 and len(trainer["step_s"]) == 2


@pytest.mark.slow  # the long_update record of the run above
def test_long_update_stage_runs_the_update_path_on_cpu(blocked_cpu_run):
    _, report, log = blocked_cpu_run
    stage = next(s for s in report["stages"] if s["stage"] == "long_update")
    assert stage["status"] == "pass" and stage["layers"] == 1 and stage["shape"] == "small", log[-3000:]
    for tokens in (128, 256):
        rec = stage[f"tokens_{tokens}"]
        assert rec["train_tok_per_s"] > 0 and rec["no_grad_tok_per_s"] > 0 and rec["peak_gib"] > 0
        assert rec["grad_norm"] > 0


@pytest.mark.slow  # a Ray start in a stage process: ~15 s
def test_ray_stage_passes_on_cpu(tmp_path):
    rc, report, log = _run(["--stages", "ray"], {**os.environ, "OMP_NUM_THREADS": "1"}, tmp_path, timeout=400)
    assert rc == 0 and _status(report) == {"ray": ("pass", "")}, log[-3000:]
    (stage,) = report["stages"]
    assert stage["cuda"] is False and stage["gpu_ids"] == []


def _rows(*rows):
    from ulorl.rollout.types import GenerationResult

    return [GenerationResult(i, list(toks), list(lps), "length") for i, (toks, lps) in enumerate(rows)]


def test_greedy_agreement_holds_engines_to_a_stated_tolerance():
    """The vLLM stages' check (pure): identical rows within the log-prob tolerance pass; a row that leaves
    HF's greedy path passes only at a near tie (HF's own margin there), and a log-prob gap beyond the
    tolerance fails even when every token agrees."""
    from ulorl.bench.gpu_check import VLLM_TOLERANCE, greedy_agreement

    f32, bf16 = VLLM_TOLERANCE["float32"], VLLM_TOLERANCE["bfloat16"]
    ref = _rows(([5, 6, 7], [-0.1, -0.2, -0.3]), ([8, 9, 10], [-0.5, -0.6, -0.7]))
    same = _rows(([5, 6, 7], [-0.1004, -0.2, -0.3]), ([8, 9, 10], [-0.5, -0.6, -0.7]))
    r = greedy_agreement(ref, same, {}, f32)
    assert r["ok"] and r["identical"] == 2 and r["logprob_max_abs_diff"] == pytest.approx(4e-4)
    off = _rows(([5, 6, 7], [-0.1, -0.2, -0.3]), ([8, 9, 10], [-0.5, -0.6, -0.75]))
    r = greedy_agreement(ref, off, {}, f32)
    assert not r["ok"] and "log-prob difference 0.05" in r["why"]
    assert greedy_agreement(ref, off, {}, bf16)["ok"]                       # within bf16's 0.1
    forked = _rows(([5, 6, 7], [-0.1, -0.2, -0.3]), ([8, 4, 4], [-0.5, -0.61, -0.9]))
    assert greedy_agreement(ref, forked, {1: 0.0004}, f32)["ok"]            # a near tie at token 1 of row 1
    r = greedy_agreement(ref, forked, {1: 0.8}, f32)                        # a clear choice: a real disagreement
    assert not r["ok"] and "row 1 at token 1" in r["why"]
    assert not greedy_agreement(ref, forked, {}, f32)["ok"]                 # no margin measured: not accepted


def test_vllm_stages_compare_in_bf16_on_a_gpu_and_float32_on_a_cpu(tmp_path):
    from ulorl.bench.gpu_check import StageContext

    assert StageContext(tmp_path, "cpu", 1, "chunked").vllm_dtype == "float32"
    assert StageContext(tmp_path, "cuda", 1, "chunked").vllm_dtype == "bfloat16"
    assert StageContext(tmp_path, "cpu", 1, "chunked", vllm_dtype="bfloat16").vllm_dtype == "bfloat16"
    with pytest.raises(ValueError, match="--vllm-dtype"):
        StageContext(tmp_path, "cpu", 1, "chunked", vllm_dtype="float16")
