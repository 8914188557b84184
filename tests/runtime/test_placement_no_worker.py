"""The reference system's three moments on Ray (`worker_wait_timeout=0`) when no worker
qualifies: as a job's steps are prepared (no worker node at all: the job fails with the reason,
nothing retried); as its prepared steps start (a director refuses them then: they count failed
with its message, the stored steps stay prepared); and as a job resumes (it stays Running and
sends its steps again every `job_watchdog_interval` until a worker qualifies). One bounded
multi-node cluster for the module: a worker node joins after the first moment."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from choreography_ray.jobs import JobStatus, JobStepStatus, StartJobError, StartJobFailed
from choreography_ray.jobs.state import JobKey, JobStepState
from choreography_ray.testing.waiting import eventually

from .conftest import ROOT
from .placement_jobs import GATES_ENV, ClosingJob, GatedJob, Spread, SpreadJob, records

WATCHDOG_SECONDS = 1


@pytest.fixture(scope="module")
def gates(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gates")


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('no-worker') / 'jobs.db'}"


@pytest.fixture(scope="module")
def cluster(storage, gates) -> Iterator[object]:
    from choreography_ray.jobs import JobsOptions
    from choreography_ray.testing import MultiNodeCluster, NodeSpec

    with MultiNodeCluster(
        storage,
        nodes=[NodeSpec("controller", by_label=True)],
        allow_no_worker=True,
        modules=["tests.runtime.placement_jobs"],
        options=JobsOptions(
            worker_wait_timeout=0,
            job_watchdog_interval=f"{WATCHDOG_SECONDS}s",
            step_director="tests.runtime.placement_jobs:GatedWorkers",
        ),
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), GATES_ENV: str(gates)}},
    ) as running:
        yield running


@pytest.fixture(scope="module")
def worker(cluster) -> object:
    """A worker node, joined after the first moment's test."""
    from choreography_ray.testing import NodeSpec

    node = cluster.add_node(NodeSpec("worker", by_label=True))
    cluster.start_hosts()
    return node


def stored_steps(storage: str, job_id: str) -> list[JobStepState]:
    from choreography_ray.storage import open_storage

    async def read() -> list[JobStepState]:
        async with open_storage(storage) as provider:
            return await provider.for_key(JobKey()).steps.get_all_for_job(job_id)

    return asyncio.run(read())


def refusals(gates: Path, job_type: str) -> int:
    noted = gates / f"{job_type}.refused"
    return len(noted.read_text().splitlines()) if noted.exists() else 0


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


def test_when_prepared_steps_start_and_no_worker_qualifies_they_count_failed(
    cluster, worker, storage, gates, tmp_path
) -> None:
    """Moment 2: the director's refusal comes once the steps are prepared (the job closes its
    gate just before they start)."""
    with pytest.raises(StartJobFailed) as raised:
        cluster.jobs.start(ClosingJob, Spread(directory=str(tmp_path), steps=2), job_id="closing")

    assert raised.value.code == StartJobError.ALL_JOB_STEPS_FAILED_STARTING
    state = cluster.jobs.get("closing")
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.failed_steps == 2
    reason = f"the gate of job type {ClosingJob.name} is closed"
    outcomes = (gates / "closing.outcomes").read_text().splitlines()
    assert [json.loads(line) for line in outcomes] == [[reason], [reason]]
    steps = stored_steps(storage, "closing")
    assert len(steps) == 2
    assert all(s.is_prepared and s.status == JobStepStatus.UNKNOWN for s in steps)
    assert records(tmp_path) == {}  # none ran


def test_a_resumed_job_with_no_worker_stays_running_and_starts_once_one_qualifies(
    cluster, worker, gates, tmp_path
) -> None:
    """Moment 3: stopped while its steps wait (for a file made at the end), resumed while no
    worker qualifies."""
    release = tmp_path / "release"
    job_id = cluster.jobs.start(
        GatedJob, Spread(directory=str(tmp_path), steps=2, hold=0.01, release=str(release))
    )
    cluster.jobs.stop(job_id)
    eventually(
        lambda: cluster.jobs.get(job_id).status == JobStatus.STOPPED, "the job stops", within=30
    )
    (gates / GatedJob.name).touch()  # from now on no worker qualifies

    cluster.jobs.resume(job_id)
    # Sent again every job_watchdog_interval: three refusals take at least two intervals.
    eventually(lambda: refusals(gates, GatedJob.name) >= 3, "starts sent again", within=30)
    waiting = cluster.jobs.get(job_id)
    (gates / GatedJob.name).unlink()  # a worker qualifies again
    release.touch()

    assert waiting.status == JobStatus.RUNNING
    assert waiting.progress.failed_steps == 0
    state = cluster.jobs.wait(job_id, timeout=60)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert {r["node"] for r in records(tmp_path).values()} == {worker.node_id}
