"""Fixtures of the engine scenarios: a fresh script and an in-process cluster per test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from choreography_ray.jobs import JobsOptions
from choreography_ray.testing import InProcessCluster

from . import fixtures


@pytest.fixture
def script() -> Iterator[fixtures.Script]:
    fixtures.SCRIPT = fixtures.Script()
    yield fixtures.SCRIPT
    fixtures.SCRIPT = fixtures.Script()


@pytest.fixture
def options() -> JobsOptions:
    return JobsOptions(max_parallel_steps=8)


@pytest.fixture
def cluster(script: fixtures.Script, options: JobsOptions, run: Any) -> Iterator[InProcessCluster]:
    cluster = InProcessCluster(options=options)
    run(cluster.provider.initialize())
    yield cluster
    run(cluster.close())
