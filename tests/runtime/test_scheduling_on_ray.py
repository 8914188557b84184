"""Scheduling controls on a real multi-node Ray cluster: two controller hosts and one worker
node that performs one step at a time (one cluster for the module)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from choreography_ray.jobs import JobsOptions, JobStatus

from .conftest import ROOT
from .scheduling_jobs import Timed, TimedJob, starts

AGING = 600.0
"""Points a minute: 10 a second, so the low job's wait behind priority 10 is about a second."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[object]:
    from choreography_ray.testing import MultiNodeCluster

    storage = f"sqlite:///{tmp_path_factory.mktemp('scheduling') / 'jobs.db'}"
    options = JobsOptions(max_parallel_steps=1, priority_aging=AGING)
    with MultiNodeCluster(
        storage,
        nodes=("controller", "controller", "worker"),
        modules=["tests.runtime.scheduling_jobs"],
        options=options,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    ) as running:
        yield running


def test_the_higher_priority_finishes_first_and_the_lower_still_progresses(cluster, tmp_path):
    """A low job starts first and queues all its steps on the one worker slot; a job of
    priority 10 follows. The high job's steps go first, yet the low job's wait ages it past
    10 points about every second, so some of its steps run while the high job has steps
    queued: it is not starved."""
    jobs = cluster.jobs
    low = jobs.start(TimedJob, Timed(directory=str(tmp_path), tag="low", steps=30))
    high = jobs.start(TimedJob, Timed(directory=str(tmp_path), tag="high", steps=60), priority=10)
    assert jobs.wait(high, timeout=120).status == JobStatus.COMPLETED_SUCCESSFULLY
    assert jobs.wait(low, timeout=120).status == JobStatus.COMPLETED_SUCCESSFULLY
    order = starts(tmp_path)
    last_high = len(order) - 1 - order[::-1].index("high")
    low_during_high = order[order.index("high") : last_high].count("low")
    assert order.count("low") - order[: last_high + 1].count("low") > 0  # high ended first
    assert low_during_high >= 1  # aged past the high job's priority while it ran
    assert low_during_high < order.count("low") / 2  # but the high job went first
    assert jobs.get(high).priority == 10 and jobs.get(low).priority == 0
