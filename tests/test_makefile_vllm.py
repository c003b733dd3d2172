"""`make test-vllm` (CI's vllm phase) selects every test under tests/vllm, the four slow ones included, and
leaves the composition test to its own phase: the recipe's pytest arguments read from the Makefile, the marks
read from the test files' decorators, selected with pytest's own mark-expression evaluator."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

from _pytest.mark.expression import Expression

ROOT = Path(__file__).resolve().parents[1]
SLOW_VLLM_TESTS = {
    "test_vllm_engine.py::test_engine_from_in_memory_model",
    "test_vllm_scale.py::test_tensor_parallel_2_equals_tp_1",
    "test_vllm_scale.py::test_yarn_context_beyond_40960_on_vllm_and_hf",
    "test_vllm_tp_actor.py::test_tp2_vllm_cpu_engine_in_a_placed_actor_generates_and_takes_a_streamed_update",
}


def _recipe_args(target: str) -> list[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    m = re.search(rf"^{re.escape(target)}:.*\n\t(.+)$", text, flags=re.M)
    assert m, f"no recipe for {target}"
    return shlex.split(m.group(1).split("pytest", 1)[1].replace("$(PYTEST_ARGS)", ""))


def _marked_tests() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in sorted((ROOT / "tests" / "vllm").glob("test_*.py")):
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                marks = set()
                for d in node.decorator_list:
                    src = ast.unparse(d)
                    if src.startswith("pytest.mark."):
                        marks.add(src.removeprefix("pytest.mark.").split("(")[0])
                out[f"{f.name}::{node.name}"] = marks
    return out


def test_make_test_vllm_runs_the_slow_vllm_tests_but_not_the_composition():
    args = _recipe_args("test-vllm")
    expr = Expression.compile(args[args.index("-m") + 1])
    ignored = {Path(a.split("=", 1)[1]).name for a in args if a.startswith("--ignore=")}
    selected = {name for name, marks in _marked_tests().items()
                if name.split("::")[0] not in ignored and expr.evaluate(lambda m, marks=marks: m in marks)}
    assert SLOW_VLLM_TESTS <= selected
    assert not any(n.startswith("test_composition.py") for n in selected)
    assert "test_vllm_engine.py::test_engine_from_in_memory_model" in selected
