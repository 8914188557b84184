"""The storage package's shape: small modules and no import circles between them."""

from __future__ import annotations

import ast
from pathlib import Path

import choreography_ray.storage as storage_package

PACKAGE = Path(storage_package.__file__).parent
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    return {path.stem: path for path in PACKAGE.glob("*.py")}


def _imports(path: Path) -> set[str]:
    """Sibling modules `path` imports, including those imported only for type checking."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found & set(_modules())


def test_every_storage_module_is_under_450_lines():
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert {name: n for name, n in sizes.items() if n >= MAX_LINES} == {}


def test_storage_modules_import_each_other_without_a_circle():
    graph = {name: _imports(path) for name, path in _modules().items()}

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        for nxt in graph[start]:
            if nxt == target or (nxt not in seen and reaches(nxt, target, seen | {nxt})):
                return True
        return False

    circles = sorted(name for name in graph if reaches(name, name, {name}))
    assert circles == []
