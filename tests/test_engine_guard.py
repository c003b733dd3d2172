"""Import guard of the vLLM engine (default suite, no vLLM needed).

The vLLM modules must import on a machine without the extra; building the engine (directly or
through ``make_engine`` with ``rollout.engine=vllm``) must fail with ``MissingExtraError`` naming
the extra. vLLM is made unimportable with ``sys.modules["vllm"] = None`` (Python's own way to
block an import), so the test means the same in an environment that has vLLM.
"""

from __future__ import annotations

import importlib
import sys

import pytest

from ulorl.config import RolloutConfig
from ulorl.rollout.engines import MissingExtraError, make_engine


@pytest.fixture
def no_vllm(monkeypatch):
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "vllm", None)


def test_vllm_modules_import_without_vllm(no_vllm, monkeypatch):
    for mod in ("ulorl.rollout.engines.vllm", "ulorl.rollout.engines.vllm_ext"):
        monkeypatch.delitem(sys.modules, mod, raising=False)   # restored after: later tests keep the classes they imported
        importlib.import_module(mod)
    assert sys.modules["vllm"] is None          # nothing tried to replace the blocked import


def test_constructing_the_engine_names_the_extra(no_vllm, tmp_path):
    from ulorl.rollout.engines.vllm import VLLMEngine

    with pytest.raises(MissingExtraError, match=r"ulorl\[gpu\]") as err:
        VLLMEngine(str(tmp_path), eos_token_id=1)
    assert "vllm" in str(err.value)


def test_make_engine_with_vllm_fails_before_any_work(no_vllm):
    cfg = RolloutConfig(engine="vllm")
    with pytest.raises(MissingExtraError, match=r"ulorl\[gpu\]"):
        make_engine(cfg, model=None, tokenizer=None)
