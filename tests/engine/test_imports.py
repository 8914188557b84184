"""Engine modules import one another one way: no circle, not even one for type hints only.

A circle (the step run and the worker once imported each other) hides which module depends on
which; a part that needs its user declares a port (`run.RunHost`) instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "choreography_ray" / "engine"


def _engine_imports(path: Path) -> set[str]:
    """Sibling modules `path` imports (`from .x import …`, `from . import x`), type-only
    imports included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph`, as the modules along it, or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done or module not in graph:
            return None
        for imported in sorted(graph[module]):
            found = visit(imported, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module, [])
        if found:
            return found
    return None


def test_engine_modules_import_one_another_without_a_circle():
    graph = {path.stem: _engine_imports(path) for path in ENGINE.glob("*.py")}
    assert graph["run"] and "worker" not in graph["run"]
    assert _circle(graph) is None, " -> ".join(_circle(graph) or [])


def test_the_circle_finder_finds_a_circle():
    assert _circle({"run": {"writer", "worker"}, "worker": {"run"}, "writer": set()}) == [
        "run",
        "worker",
        "run",
    ]
