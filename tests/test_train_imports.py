"""The train package has no import cycle and hides none behind function-level imports."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "platform"
TRAIN = ROOT / "ulorl" / "train"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(tree: ast.AST) -> tuple[set[str], list[tuple[int, str]]]:
    """(module-level ulorl imports, [(line, name)] of ulorl imports inside functions)."""
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
            fn = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in names(child):
                if n.startswith("ulorl"):
                    (nested.append((child.lineno, n)) if in_function else top.add(n))
            visit(child, fn)

    visit(tree, False)
    return top, nested


def _graph() -> tuple[dict[str, set[str]], dict[str, list[tuple[int, str]]]]:
    files = {_module_name(p): p for p in (ROOT / "ulorl").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    nested: dict[str, list[tuple[int, str]]] = {}
    for mod, path in files.items():
        top, inner = _imports(ast.parse(path.read_text()))
        graph[mod] = {n for n in top if n in files and n != mod}
        nested[mod] = inner
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


def test_no_function_level_import_dodges_a_cycle_in_train():
    """A function-level import in ulorl/train is allowed only for cost (lazy), never to hide a cycle:
    made module-level, none of them may close a cycle."""
    graph, nested = _graph()
    dodges = [(m, line, n) for m, inner in nested.items() if m.startswith("ulorl.train")
              for line, n in inner if n in graph and _reaches(graph, n, m)]
    assert not dodges, f"function-level imports that hide an import cycle: {dodges}"


def test_trainer_worker_and_distributed_import_ulorl_modules_only_at_module_level():
    _, nested = _graph()
    for mod in ("ulorl.train.trainer", "ulorl.train.worker", "ulorl.train.distributed",
                "ulorl.train.deepspeed_backend", "ulorl.train.transport"):
        assert not nested[mod], f"{mod}: function-level imports {nested[mod]}"


def test_no_import_cycle_through_the_train_package():
    graph, _ = _graph()
    # a cycle through a train module = a train module reachable from itself
    for start in [m for m in graph if m.startswith("ulorl.train")]:
        seen, stack = set(), list(graph[start])
        while stack:
            m = stack.pop()
            assert m != start, f"import cycle through {start}"
            if m not in seen:
                seen.add(m)
                stack.extend(graph.get(m, ()))


def test_distributed_depends_on_no_higher_train_module():
    graph, _ = _graph()
    higher = {"ulorl.train.trainer", "ulorl.train.worker", "ulorl.train.deepspeed_backend"}
    assert not (graph["ulorl.train.distributed"] & higher)
