"""The set-up's commands, read with ``make -n`` (nothing is installed): CPU torch first from
TORCH_INDEX_URL with a fallback to the default index, torch pinned by a constraints file for the
package install, and a test target that needs no root with BROWSER=0. CI (``.ci/run``, run against a
stub Makefile): every phase in order, a failed, a hung or a never-started phase fails CI and is named."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _dry(*args: str) -> str:
    out = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_cpu_index_first_then_default_index_then_constrained_install():
    text = _dry("setup", "VENV=/tmp/ulorl-make-n-venv")
    cpu = text.index('--index-url "https://download.pytorch.org/whl/cpu" "torch==2.13.0"')
    fallback = text.index('pip install -q "torch==2.13.0"')
    pin = text.index("> /tmp/ulorl-make-n-venv/torch-constraints.txt")
    package = text.index('pip install -q -c /tmp/ulorl-make-n-venv/torch-constraints.txt -e ".[dev]"')
    assert cpu < fallback < pin < package


def test_torch_index_and_version_are_settable():
    text = _dry("setup", "TORCH_INDEX_URL=https://mirror.example/cpu", "TORCH_VERSION=2.12.1")
    assert '--index-url "https://mirror.example/cpu" "torch==2.12.1"' in text
    assert 'if [ -n "" ]' in _dry("setup", "TORCH_INDEX_URL=")   # empty: straight to the default index


def test_test_target_without_browser_needs_no_apt():
    with_browser = _dry("test")
    assert "apt-get install" in with_browser
    without = _dry("test", "BROWSER=0")
    assert "apt-get" not in without and "--ignore=tests/browser" in without


def test_lint_target_runs_ruff_and_mypy():
    text = _dry("lint", "VENV=/tmp/ulorl-make-n-venv")
    assert "/tmp/ulorl-make-n-venv/bin/ruff check platform" in text
    assert "/tmp/ulorl-make-n-venv/bin/mypy platform/ulorl" in text


CI_PHASES = ["lint", "test", "composition", "vllm", "slow"]
CI_TARGETS = {"lint": "lint", "test": "test", "composition": "test-composition", "vllm": "test-vllm",
              "slow": "test-slow"}


def test_ci_runs_every_phase_in_order_of_importance_with_the_makefile_targets():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    phases = [ln.split()[1:] for ln in lines if ln.startswith("phase ")]
    assert [p[0] for p in phases] == CI_PHASES
    assert all(p[2:] == ["make", CI_TARGETS[p[0]]] for p in phases), phases
    background = [ln.split()[1:] for ln in lines if ln.startswith("background ")]
    assert background == [["browser", "make", "setup-browser"], ["vllm-venv", "make", "setup-vllm"]]
    order = [ln.split()[0] + " " + ln.split()[1] for ln in lines if ln.split()[:1] in (["phase"], ["await"])]
    assert order.index("await browser") < order.index("phase test")          # apt done before make test needs it
    assert order.index("await vllm-venv") < order.index("phase composition")  # the side venv before its first user
    _dry(*CI_TARGETS.values(), "setup-browser", "setup-vllm")                   # each one is a target


def _stub_ci(tmp_path: Path, recipes: dict[str, str], **env: str) -> subprocess.CompletedProcess:
    """.ci/run in a copy of the repository whose Makefile has ``recipes`` (target -> shell line)."""
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", repo / ".ci" / "run")
    targets = ["setup-browser", "lint", "setup-vllm", *CI_TARGETS.values()]
    (repo / "Makefile").write_text("".join(f"{t}:\n\t{recipes.get(t, 'echo ran ' + t)}\n" for t in targets))
    return subprocess.run(["bash", str(repo / ".ci" / "run")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def _table(stdout: str) -> dict[str, str]:
    rows = stdout.split("\nphase ", 1)[1].splitlines()[1:]
    return {r[:30].strip(): r[40:].strip() for r in rows if not r.startswith("== ")}


def test_ci_passes_only_when_every_phase_ran_and_passed(tmp_path):
    out = _stub_ci(tmp_path, {})
    assert out.returncode == 0, out.stdout + out.stderr
    assert _table(out.stdout) == {**{p: "pass" for p in CI_PHASES}, "browser (background)": "pass (overlapped)",
                                  "vllm-venv (background)": "pass (overlapped)"}
    assert out.stdout.rstrip().endswith("== CI PASSED: every phase ran and passed")
    assert all(f"ran {t}" in out.stdout for t in CI_TARGETS.values())


def test_a_failed_a_hung_and_a_phase_never_started_each_fail_ci_and_are_named(tmp_path):
    # composition fails; vllm hangs until the overall budget is spent (it is stopped, with its process group);
    # slow never starts
    pid_file = tmp_path / "vllm.pid"
    out = _stub_ci(tmp_path, {"test-composition": "exit 3", "test-vllm": f"echo $$$$ > {pid_file}; sleep 300"},
                   CI_BUDGET_S="6", CI_MIN_PHASE_S="1")
    assert out.returncode == 1
    table = _table(out.stdout)
    assert table["lint"] == table["test"] == "pass"
    assert table["composition"].startswith("FAIL (exit 2)")
    assert table["vllm"].startswith("TIMEOUT after ") and "(hung?)" in table["vllm"]
    assert table["slow"] == "NOT RUN (CI time spent)"
    assert "== vllm STOPPED after" in out.stdout and "sleep 300" in out.stdout   # what was still running
    assert out.stdout.rstrip().endswith("== CI FAILED")
    with pytest.raises(ProcessLookupError):      # the hung phase's shell is gone
        os.kill(int(pid_file.read_text()), 0)


def test_composition_target_runs_the_composition_test_in_the_vllm_venv():
    text = (ROOT / "Makefile").read_text()
    target = text.split("\ntest-composition:", 1)[1].split("\n\n", 1)[0]
    assert target.startswith(" setup-vllm")                       # builds the side venv first
    assert "$(VENV)-vllm/bin/pytest" in target and "-m slow" in target and "tests/vllm/test_composition.py" in target
    assert "test-composition" in text.split(".PHONY:", 1)[1].split("\n", 1)[0]
