"""No import cycle anywhere in platform/ulorl, and no function-level import that hides one
(the train package's own rules are in test_train_imports.py)."""

from __future__ import annotations

from import_graph import import_graph as _graph
from import_graph import reaches as _reaches


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Modules that reach themselves."""
    return sorted(m for m in graph if any(_reaches(graph, d, m) for d in graph[m]))


def test_cycle_finder_sees_a_hand_made_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c"]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_level_import_cycle_in_ulorl():
    graph, _ = _graph()
    assert len(graph) > 100   # the walk found the package
    assert _cycles(graph) == []


def test_no_function_level_import_hides_a_cycle_in_ulorl():
    graph, nested = _graph()
    dodges = [(m, line, n) for m, inner in nested.items() for line, n in inner if n in graph and _reaches(graph, n, m)]
    assert not dodges, f"function-level imports that would close an import cycle at module level: {dodges}"
