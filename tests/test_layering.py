"""Imports go one way: runtime -> recovery, placement -> engine -> jobs, and author code never
imports the runtime.

Declaring a job must touch neither Ray nor a storage driver, so `jobs/` and `engine/` import
nothing of Ray, and `jobs/` nothing of storage, engine or runtime.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "choreography_ray"

FORBIDDEN = {
    "jobs": {
        "ray",
        "choreography_ray.storage",
        "choreography_ray.engine",
        "choreography_ray.runtime",
        "choreography_ray.recovery",
        "choreography_ray.placement",
        "sqlalchemy",
        "pymongo",
        "psycopg",
    },
    "engine": {
        "ray",
        "choreography_ray.runtime",
        "choreography_ray.recovery",
        "choreography_ray.placement",
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
    },
    # Recovery and placement decide over small ports; the runtime wires Ray in behind them.
    "recovery": {"ray", "choreography_ray.runtime", "sqlalchemy", "pymongo", "psycopg"},
    "placement": {"ray", "choreography_ray.runtime", "sqlalchemy", "pymongo", "psycopg"},
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
