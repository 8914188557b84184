"""Imports go one way: runtime -> recovery, placement -> engine -> jobs, and author code never
imports the runtime. `testing` sits above them all: no layer imports it.

Declaring a job must touch neither Ray nor a storage driver, so `jobs/` and `engine/` import
nothing of Ray, and `jobs/` nothing of storage, engine or runtime.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "choreography_ray"

TESTING = "choreography_ray.testing"
"""Test support: it wires the runtime and the engine together; nothing they run may need it."""

FORBIDDEN = {
    "jobs": {
        "ray",
        "choreography_ray.storage",
        "choreography_ray.engine",
        "choreography_ray.runtime",
        "choreography_ray.recovery",
        "choreography_ray.placement",
        TESTING,
        "sqlalchemy",
        "pymongo",
        "psycopg",
    },
    "engine": {
        "ray",
        "choreography_ray.runtime",
        "choreography_ray.recovery",
        "choreography_ray.placement",
        TESTING,
        "sqlalchemy",
        "pymongo",
        "psycopg",
    },
    "storage": {
        "ray",
        "choreography_ray.engine",
        "choreography_ray.runtime",
        "choreography_ray.recovery",
        "choreography_ray.placement",
        TESTING,
    },
    # Recovery and placement decide over small ports; the runtime wires Ray in behind them.
    "recovery": {"ray", "choreography_ray.runtime", TESTING, "sqlalchemy", "pymongo", "psycopg"},
    "placement": {"ray", "choreography_ray.runtime", TESTING, "sqlalchemy", "pymongo", "psycopg"},
    # The hosts run in production: a fault hook they apply lives in the runtime, and
    # `testing` names it to tests.
    "runtime": {TESTING},
    "cli": {TESTING},
    "console": {TESTING},
}


def _imports(path: Path, package: str) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    module_parts = ["choreography_ray", *path.relative_to(PACKAGE).with_suffix("").parts]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module_parts[: len(module_parts) - node.level]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.add(name)
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(package):
    offenders = []
    for path in sorted((PACKAGE / package).rglob("*.py")):
        for name in _imports(path, package):
            for banned in FORBIDDEN[package]:
                if name == banned or name.startswith(banned + "."):
                    offenders.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert offenders == []


def test_nothing_under_the_package_imports_pickle():
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if {"pickle", "cloudpickle"} & _imports(path, "")
    ]
    assert offenders == []


def _module_name(path: Path) -> str:
    parts = ["choreography_ray", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_graph() -> dict[str, set[str]]:
    """Each module of the package, with the package's modules it imports anywhere in its text
    (type-only and function-local imports included). `from .x import y` counts as importing
    `x.y` when that is a module, else `x`."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        base = name.split(".") if is_package else name.split(".")[:-1]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    stem = base[: len(base) - node.level + 1]
                    module = ".".join([*stem, node.module] if node.module else stem)
                else:
                    module = node.module or ""
                for alias in node.names:
                    found.add(
                        f"{module}.{alias.name}" if f"{module}.{alias.name}" in paths else module
                    )
        graph[name] = {m for m in found if m in paths and m != name}
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
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


def test_no_module_of_the_package_is_in_an_import_circle():
    """Not even one for type hints only: a part that needs its user declares a port
    (`engine.run_host.RunHost`, `runtime.controller_port.ControllerPort`). A package's
    `__init__` re-exporting its modules is no circle: only edges between modules count."""
    graph = _module_graph()
    inits = {
        name for name in graph if (PACKAGE / "/".join(name.split(".")[1:]) / "__init__.py").exists()
    }
    modules = {name: deps - inits for name, deps in graph.items() if name not in inits}
    assert modules["choreography_ray.runtime.controller_recovery"]  # the graph is read
    circle = _circle(modules)
    assert circle is None, " -> ".join(circle or [])


def test_the_circle_finder_finds_a_circle():
    assert _circle({"run": {"writer", "worker"}, "worker": {"run"}, "writer": set()}) == [
        "run",
        "worker",
        "run",
    ]


MAX_LINES = 450
"""Above this a module is split by concept (docs/decisions.md, "Modules over 450 lines")."""


def test_every_module_of_the_package_is_under_450_lines():
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert {name: n for name, n in sizes.items() if n >= MAX_LINES} == {}
