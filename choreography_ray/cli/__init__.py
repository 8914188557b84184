"""The `choreography` command: the cluster, the demo and benchmark, and jobs, one module each."""

from __future__ import annotations

from . import cluster, console, jobs, results, runs, views  # noqa: F401 - each registers its commands
from .common import app


def main() -> None:
    app()


__all__ = ["app", "main"]
