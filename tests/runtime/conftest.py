"""One Ray instance per test module: started once, every host and Ray process stopped after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def local_ray(*, dashboard: bool = False) -> Iterator[None]:
    """A local Ray of two CPUs (with its dashboard only when a test opens it: it costs a
    second or two of start-up), its hosts stopped and Ray shut down after."""
    import ray

    from choreography_ray.runtime import stop_hosts

    ray.init(
        num_cpus=2,
        include_dashboard=dashboard,
        logging_level="WARNING",
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    namespaces: list[str] = []
    try:
        yield
    finally:
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry.get("name", "").startswith("choreography:"):
                namespaces.append(entry["namespace"])
        for namespace in set(namespaces):
            stop_hosts(namespace)
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    with local_ray():
        yield
