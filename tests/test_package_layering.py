"""Which top-level folders of platform/ulorl may import which, read from the sources (no import runs).

- ``bench/`` holds the measurement tools: only ``cli/`` (``ulorl-bench``) and ``bench/`` itself import it,
  so a training, sweep, eval or dashboard run never loads a benchmark.
- ``train/``, ``rollout/`` and ``algo/`` import nothing from ``scale/``, ``report/``, ``sim/`` or ``bench/``.
- ``scale.layout`` is the placement arithmetic: no ``ray`` import anywhere in it (module or function
  level), and nothing it imports at module level from ulorl imports ``ray`` at module level either.
"""

from __future__ import annotations

import ast
import subprocess
import sys

from import_graph import ROOT
from import_graph import import_graph as _graph


def _folder(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def _tree(module: str) -> ast.Module:
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT / module.replace(".", "/") / "__init__.py"
    return ast.parse(path.read_text())


def _all_imports(module: str) -> set[str]:
    """Every module name an ``import`` / ``from ... import`` of ``module`` names, at any level."""
    out: set[str] = set()
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _edges() -> list[tuple[str, str]]:
    """(importer, imported ulorl module) for module- and function-level imports."""
    graph, nested = _graph()
    edges = [(m, d) for m, deps in graph.items() for d in deps]
    for m, inner in nested.items():
        for _, name in inner:
            while name and name not in graph:
                name = name.rpartition(".")[0]
            if name and name != m:
                edges.append((m, name))
    return edges


def _is_ray(name: str) -> bool:
    return name == "ray" or name.startswith("ray.")


def test_ray_finder_sees_every_import_form():
    tree = "import os\nimport ray\ndef f():\n    from ray.util import placement_group\n"
    names = set()
    for node in ast.walk(ast.parse(tree)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    assert sorted(n for n in names if _is_ray(n)) == ["ray", "ray.util"]
    assert not _is_ray("rayon") and not _is_ray("ulorl.scale.placement")


def test_bench_is_imported_only_by_cli_and_bench():
    edges = _edges()
    assert any(_folder(d) == "bench" for _, d in edges)   # the walk sees the bench package
    outside = sorted({(m, d) for m, d in edges if _folder(d) == "bench" and _folder(m) not in ("bench", "cli")})
    assert not outside, f"production code importing a measurement tool: {outside}"


def test_train_rollout_algo_import_nothing_from_scale_report_sim_or_bench():
    bad = sorted({(m, d) for m, d in _edges()
                  if _folder(m) in ("train", "rollout", "algo") and _folder(d) in ("scale", "report", "sim", "bench")})
    assert not bad, f"imports against the layering: {bad}"


def test_placement_arithmetic_imports_no_ray():
    own = sorted(n for n in _all_imports("ulorl.scale.layout") if _is_ray(n))
    assert not own, f"ulorl.scale.layout imports {own}"
    graph, _ = _graph()
    seen, stack = set(), ["ulorl.scale.layout"]
    while stack:
        m = stack.pop()
        if m not in seen:
            seen.add(m)
            stack.extend(graph[m])
    top_level_ray = {}
    for m in seen - {"ulorl.scale.layout"}:
        tree = _tree(m)
        names = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module]
        if any(_is_ray(n) for n in names):
            top_level_ray[m] = names
    assert not top_level_ray, f"modules ulorl.scale.layout loads that import ray: {sorted(top_level_ray)}"


def test_importing_the_placement_arithmetic_loads_no_ray():
    code = ("import sys, ulorl.scale.layout, ulorl.cli.plan; "
            "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if m.startswith('ray'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def _folder_cycle(edges: list[tuple[str, str]]) -> list[str]:
    """A cycle of top-level folders (``a -> b -> ... -> a``), or [] when the folder graph is acyclic."""
    graph: dict[str, set[str]] = {}
    for m, d in edges:
        a, b = _folder(m) or m, _folder(d) or d
        if a != b:
            graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        path.pop()
        return []

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return []


def test_folder_cycle_finder():
    assert _folder_cycle([("ulorl.a.x", "ulorl.b.y"), ("ulorl.b.y", "ulorl.c.z")]) == []
    assert _folder_cycle([("ulorl.a.x", "ulorl.b.y"), ("ulorl.b.z", "ulorl.a.w")]) == ["a", "b", "a"]


def test_folders_form_floors_no_import_runs_back_up():
    """The folder graph is acyclic: every folder sits on a floor above all it imports (no two-way tie)."""
    cycle = _folder_cycle(_edges())
    assert not cycle, f"folders importing each other in a circle: {' -> '.join(cycle)}"
