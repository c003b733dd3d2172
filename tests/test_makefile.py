"""The set-up's commands, read with ``make -n`` (nothing is installed): CPU torch first from
TORCH_INDEX_URL with a fallback to the default index, torch pinned by a constraints file for the
package install, and a test target that needs no root with BROWSER=0."""

from __future__ import annotations

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


def test_lint_target_runs_ruff_and_mypy_and_ci_lints_before_the_tests():
    text = _dry("lint", "VENV=/tmp/ulorl-make-n-venv")
    assert "/tmp/ulorl-make-n-venv/bin/ruff check platform" in text
    assert "/tmp/ulorl-make-n-venv/bin/mypy platform/ulorl" in text
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci.index("make lint") < ci.index("make test")   # set -e: a dirty lint stops CI before the tests


def test_composition_target_runs_the_composition_test_in_the_vllm_venv():
    text = (ROOT / "Makefile").read_text()
    target = text.split("\ntest-composition:", 1)[1].split("\n\n", 1)[0]
    assert target.startswith(" setup-vllm")                       # builds the side venv first
    assert "$(VENV)-vllm/bin/pytest" in target and "-m slow" in target and "tests/vllm/test_composition.py" in target
    assert "test-composition" in text.split(".PHONY:", 1)[1].split("\n", 1)[0]
