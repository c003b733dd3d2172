"""No import cycle anywhere in platform/ulorl, and no function-level import that hides one
(the train package's own rules are in test_train_imports.py)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "platform"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST) -> tuple[set[str], list[tuple[int, str]]]:
    """(ulorl imports at module level, TYPE_CHECKING blocks included; [(line, name)] inside functions)."""
    top: set[str] = set()
    nested: list[tuple[int, str]] = []

    def names(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            return [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        return []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            for n in names(child):
                if n.startswith("ulorl"):
                    (nested.append((child.lineno, n)) if in_function else top.add(n))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return top, nested


def _graph() -> tuple[dict[str, set[str]], dict[str, list[tuple[int, str]]]]:
    files = {_module_name(p): p for p in (ROOT / "ulorl").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    nested: dict[str, list[tuple[int, str]]] = {}
    for mod, path in files.items():
        top, inner = _imports(ast.parse(path.read_text()))
        graph[mod] = {n for n in top if n in files and n != mod}
        nested[mod] = [(line, n) for line, n in inner if n in files]
    return graph, nested


def _reaches(graph: dict[str, set[str]], src: str, dst: str) -> bool:
    seen, stack = set(), [src]
    while stack:
        m = stack.pop()
        if m == dst:
            return True
        if m not in seen:
            seen.add(m)
            stack.extend(graph.get(m, ()))
    return False


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
    dodges = [(m, line, n) for m, inner in nested.items() for line, n in inner if _reaches(graph, n, m)]
    assert not dodges, f"function-level imports that would close an import cycle at module level: {dodges}"
