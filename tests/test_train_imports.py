"""The train package has no import cycle and hides none behind function-level imports."""

from __future__ import annotations

from import_graph import import_graph as _graph
from import_graph import reaches as _reaches


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
