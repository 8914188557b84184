"""The reference system's behaviour on Ray (`worker_wait_timeout=0`): with no worker node, a
job fails as its steps are prepared, with the reason, and nothing is retried. One bounded
multi-node cluster for the module; the other moments are the engine's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from choreography_ray.jobs import JobStatus, StartJobError, StartJobFailed

from .conftest import ROOT
from .placement_jobs import Spread, SpreadJob


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[object]:
    from choreography_ray.jobs import JobsOptions
    from choreography_ray.testing import MultiNodeCluster, NodeSpec

    storage = f"sqlite:///{tmp_path_factory.mktemp('no-worker') / 'jobs.db'}"
    with MultiNodeCluster(
        storage,
        nodes=[NodeSpec("controller", by_label=True)],
        allow_no_worker=True,
        modules=["tests.runtime.placement_jobs"],
        options=JobsOptions(worker_wait_timeout=0),
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    ) as running:
        yield running


def test_with_no_worker_node_a_job_fails_at_preparation_with_the_reason(cluster, tmp_path) -> None:
    with pytest.raises(StartJobFailed) as raised:
        cluster.jobs.start(SpreadJob, Spread(directory=str(tmp_path), steps=2), job_id="lonely")

    assert raised.value.code == StartJobError.UNKNOWN
    assert "no worker host is running in this cluster" in str(raised.value)
    state = cluster.jobs.get("lonely")
    assert state.status == JobStatus.FAILED
    assert any(
        "no worker host is running" in message
        for message in state.status_changes[-1].exception_messages
    )
    assert cluster.jobs.step_counts("lonely").total == 0  # no step was prepared
