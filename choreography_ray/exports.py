"""Public names a package loads on first use (PEP 562): declaring jobs never imports Ray, and
the command line's reading path never imports the console's web server or the client."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_names(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` answering each name of `where` (name -> the
    submodule that defines it) by importing that submodule when the name is first asked for."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{module}"), name)

    return __getattr__
