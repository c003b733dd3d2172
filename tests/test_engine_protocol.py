"""The ``Engine`` protocol declares every member the scheduler, trainer, weight sync and placement
use; ``EngineBase`` gives the defaults of an engine without the optional capabilities. mypy checks
that HFEngine, VLLMEngine (``make_engine``'s return type) and RemoteEngine (``Trainer``'s
``engine_factory`` type) satisfy it; these tests check the defaults and that nothing probes an
engine, or a training backend (its optional capabilities are typed ``TrainBackend`` members too)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from fakes import ScriptedEngine

from ulorl.rollout.types import Engine, EngineBase
from ulorl.scale.placement import EngineActor

ROOT = Path(__file__).resolve().parents[1]


class _DictEngine(EngineBase):
    """Only the required members: ``update_weights`` records what it was given."""

    eos_token_id = 0

    def __init__(self) -> None:
        self.loads: list[tuple[dict[str, Any], int]] = []

    def generate(self, requests, sampling):  # noqa: ANN001, ANN201
        return []

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.loads.append((dict(state_dict), version))
        self.policy_version = version


def test_engine_base_defaults_describe_an_engine_without_capabilities() -> None:
    eng = _DictEngine()
    assert isinstance(eng, Engine)
    assert (eng.max_model_len, eng.last_stats, eng.streams_weights, eng.colocate, eng.asleep) == (
        None, None, False, False, False)
    assert (eng.weight_transfer, eng.tensor_parallel_size, eng.policy_version) == ("stream", 1, 0)
    eng.update_weights_streamed(iter([("a", 1), ("b", 2)]), 3)        # the stream as one dict
    eng.update_weights_from(lambda: iter([("a", 5)]), 4)              # one fresh stream
    assert eng.loads == [({"a": 1, "b": 2}, 3), ({"a": 5}, 4)] and eng.policy_version == 4
    eng.wake()
    eng.close()
    with pytest.raises(RuntimeError, match="not colocated"):
        eng.sleep()


def test_engine_base_refuses_to_wake_an_engine_whose_weights_were_discarded() -> None:
    eng = _DictEngine()
    eng.asleep = True
    with pytest.raises(RuntimeError, match="push the weights"):
        eng.wake()


def test_an_engine_without_update_weights_names_itself() -> None:
    class Half(EngineBase):
        pass

    with pytest.raises(NotImplementedError, match="Half must implement update_weights"):
        Half().update_weights_streamed(iter([("a", 1)]), 1)


def test_request_context_is_prompt_then_prefix_and_refuses_bad_requests_by_id() -> None:
    from ulorl.rollout.types import GenerationRequest, request_context

    assert request_context(GenerationRequest(0, [1, 2], [3], 5), max_model_len=8) == [1, 2, 3]   # 3 + 5 = 8: fits
    assert request_context(GenerationRequest(0, [1], [], 10**6)) == [1]                          # no limit
    with pytest.raises(ValueError,
                       match=r"request 7: context 3 \+ max_new_tokens 6 exceeds the engine's max_model_len 8"):
        request_context(GenerationRequest(7, [1, 2], [3], 6), max_model_len=8)
    with pytest.raises(ValueError, match=r"request 4: empty prompt_ids \+ prefix_ids"):
        request_context(GenerationRequest(4, [], [], 3))
    with pytest.raises(ValueError, match="request 5: max_new_tokens must be >= 0, got -1"):
        request_context(GenerationRequest(5, [1], [], -1))


def _actor_over(engine: Engine) -> EngineActor:
    return EngineActor.over(engine)     # no Ray, no model: the actor's methods over a given engine


def test_engine_actor_describes_an_engine_from_its_typed_members() -> None:
    eng = ScriptedEngine()
    eng.max_model_len = 99
    assert _actor_over(eng).describe() == {
        "policy_version": 0, "updates": 0, "updating": False, "max_model_len": 99, "colocate": False,
        "weight_transfer": "stream", "tensor_parallel_size": 1, "model": None}


def test_engine_actor_streams_buckets_into_a_state_dict_engine() -> None:
    eng = _DictEngine()
    actor = _actor_over(eng)
    actor.begin_update(7)
    actor.push_bucket([("a", 1), ("b", 2)])
    actor.push_bucket([("c", 3)])
    assert actor.finish_update() == 3
    assert eng.loads == [({"a": 1, "b": 2, "c": 3}, 7)] and actor.describe()["updates"] == 1


def test_engine_actor_refuses_to_generate_while_an_update_is_in_flight() -> None:
    """vLLM's engine client is not thread-safe and reloads layers in place: a generate between
    begin_update and finish_update (seen: a caller beside the trainer) aborted the actor."""
    from ulorl.rollout.types import GenerationRequest, SamplingParams
    from ulorl.scale.placement import UPDATE_IN_FLIGHT

    eng = _DictEngine()
    actor = _actor_over(eng)
    actor.begin_update(1)
    actor.push_bucket([("a", 1)])
    with pytest.raises(RuntimeError) as err:
        actor.generate([GenerationRequest(0, [1, 2], [], 4)], SamplingParams())
    assert str(err.value) == UPDATE_IN_FLIGHT
    assert actor.finish_update() == 1 and not actor.describe()["updating"]


def test_native_transfer_on_a_non_vllm_engine_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="needs rollout.engine=vllm; this actor runs ScriptedEngine"):
        _actor_over(ScriptedEngine()).start_weight_update()


ENGINE_NAMES = ("engine", "eng", "_engine")
BACKEND_NAMES = ("backend", "_backend")


def _probes(tree: ast.AST, names: tuple[str, ...]) -> list[int]:
    """Lines of ``getattr(X, ...)`` / ``hasattr(X, ...)`` where X is a name or attribute in ``names``."""
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and node.args):
            target = node.args[0]
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name in names:
                lines.append(node.lineno)
    return lines


def test_the_probe_finder_sees_a_probe() -> None:
    assert _probes(ast.parse("x = getattr(self.engine, 'colocate', False)"), ENGINE_NAMES) == [1]
    assert _probes(ast.parse("x = self.engine.colocate"), ENGINE_NAMES) == []
    assert _probes(ast.parse("if hasattr(eng, 'close'):\n    eng.close()"), ENGINE_NAMES) == [1]
    src = "s = getattr(backend, 'named_weights_for_rollout', None)\nz = getattr(self.backend, 'zero_stage', 0)"
    assert _probes(ast.parse(src), BACKEND_NAMES) == [1, 2]
    assert _probes(ast.parse("s = backend.rollout_weight_stream"), BACKEND_NAMES) == []


@pytest.mark.parametrize("names", [ENGINE_NAMES, BACKEND_NAMES], ids=["engine", "backend"])
def test_no_getattr_on_an_engine_or_backend_in_product_code(names: tuple[str, ...]) -> None:
    found = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / "platform" / "ulorl").rglob("*.py"))
             if (lines := _probes(ast.parse(p.read_text()), names))}
    assert found == {}
