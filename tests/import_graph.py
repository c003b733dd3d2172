"""The module import graph of platform/ulorl, read from the sources (no import is executed); shared
by the import-cycle tests."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "platform"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def ulorl_imports(tree: ast.AST) -> tuple[set[str], list[tuple[int, str]]]:
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


def import_graph() -> tuple[dict[str, set[str]], dict[str, list[tuple[int, str]]]]:
    """(module -> the ulorl modules it imports at module level; module -> its function-level imports)."""
    files = {module_name(p): p for p in (ROOT / "ulorl").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    nested: dict[str, list[tuple[int, str]]] = {}
    for mod, path in files.items():
        top, inner = ulorl_imports(ast.parse(path.read_text()))
        graph[mod] = {n for n in top if n in files and n != mod}
        nested[mod] = inner
    return graph, nested


def reaches(graph: dict[str, set[str]], src: str, dst: str) -> bool:
    seen, stack = set(), [src]
    while stack:
        m = stack.pop()
        if m == dst:
            return True
        if m not in seen:
            seen.add(m)
            stack.extend(graph.get(m, ()))
    return False
