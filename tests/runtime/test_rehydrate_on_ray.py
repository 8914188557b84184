"""An explicit rehydration pass through the client and the command line, on one single-node Ray
for the module: the pass reaches the partition's jobs manager and says what it did."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from choreography_ray.cli import app
from choreography_ray.jobs import JobStatus
from choreography_ray.jobs.errors import InvalidOptionError
from choreography_ray.recovery.explicit import RehydrationSummary

from .ray_jobs import FanOut, FanOutJob, gate, kill_hosts

runner = CliRunner()


@pytest.fixture(scope="module")
def jobs(ray_instance, tmp_path_factory):
    import choreography_ray as cr

    database = tmp_path_factory.mktemp("rehydrate") / "jobs.db"
    client = cr.connect(f"sqlite:///{database}", modules=["tests.runtime.ray_jobs"])
    client.storage_url = f"sqlite:///{database}"
    return client


def test_rehydrate_answers_what_the_pass_did(jobs):
    import ray

    handle = gate()
    try:
        job_id = jobs.start(FanOutJob, FanOut(steps=2, block=True), scope="rehydrate")
        # The job runs, its steps held at the gate: loaded by the pass, and left to run.
        summary = jobs.rehydrate(scope="rehydrate", timeout=30)
        assert summary == RehydrationSummary(drained=True, queued=1, skipped=1)
        ray.get(handle.open.remote())
        done = jobs.wait(job_id, scope="rehydrate", timeout=60)
        assert done.status == JobStatus.COMPLETED_SUCCESSFULLY
    finally:
        ray.kill(handle)
    assert jobs.rehydrate(scope="rehydrate") == RehydrationSummary(drained=True)
    with pytest.raises(InvalidOptionError, match="timeout: must be a positive number"):
        jobs.rehydrate(scope="rehydrate", timeout=0)


def test_the_async_client_rehydrates_too(jobs, run):
    assert run(jobs.aio.rehydrate(scope="elsewhere")) == RehydrationSummary(drained=True)


def test_jobs_rehydrate_prints_the_summary(jobs):
    result = runner.invoke(app, ["jobs", "rehydrate", "--scope", "rehydrate-cli"])
    assert result.exit_code == 0, result.output
    assert "rehydrated: 0 interrupted, 0 resumed" in result.output


def test_jobs_rehydrate_with_a_bad_timeout_is_a_one_line_error(jobs):
    result = runner.invoke(app, ["jobs", "rehydrate", "--timeout", "0"])
    assert result.exit_code == 2
    assert "timeout: must be a positive number of seconds, not 0.0" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_new_controller_recovers_partitions_the_configuration_never_named(jobs):
    """The key catalog comes from storage: a partition missing from the cluster's
    configuration (a whole-cluster restart keeps only the default one) is still recovered."""
    import ray

    import choreography_ray as cr
    from choreography_ray.runtime.config import read_config, write_config
    from choreography_ray.runtime.constants import NAMESPACE

    handle = gate()
    try:
        job_id = jobs.start(FanOutJob, FanOut(steps=2, block=True), namespace="forgotten")
        config = read_config(NAMESPACE)
        write_config(
            config.model_copy(
                update={"keys": [k for k in config.keys if k.namespace != "forgotten"]}
            ),
            NAMESPACE,
        )
        kill_hosts(workers=True)  # as a restart would: the steps' runs are lost too
        cr.connect(modules=["tests.runtime.ray_jobs"])  # starts a new controller host
        ray.get(handle.open.remote())
        # Read storage, not the client: a client call would activate the job by itself.
        assert _stored_status(jobs.storage_url, job_id) == JobStatus.COMPLETED_SUCCESSFULLY
    finally:
        ray.kill(handle)


def _stored_status(url: str, job_id: str, within: float = 30.0) -> JobStatus:
    """The job's stored status once it is finished (bounded wait for the recovered job)."""
    import asyncio
    import time

    from choreography_ray.jobs import JobKey
    from choreography_ray.storage import open_storage

    async def stored() -> Any:
        async with open_storage(url) as provider:
            return await provider.for_key(JobKey(namespace="forgotten")).jobs.find(job_id)

    deadline = time.monotonic() + within
    while True:
        found = asyncio.run(stored())
        if found.is_finished or time.monotonic() > deadline:
            return found.status
        time.sleep(0.2)
