"""An explicit rehydration pass through the client and the command line, on one single-node Ray
for the module: the pass reaches the partition's jobs manager and says what it did."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from choreography_ray.cli import app
from choreography_ray.jobs import JobStatus
from choreography_ray.jobs.errors import InvalidOptionError
from choreography_ray.recovery.explicit import RehydrationSummary

from .ray_jobs import FanOut, FanOutJob, gate

runner = CliRunner()


@pytest.fixture(scope="module")
def jobs(ray_instance, tmp_path_factory):
    import choreography_ray as cr

    database = tmp_path_factory.mktemp("rehydrate") / "jobs.db"
    return cr.connect(f"sqlite:///{database}", modules=["tests.runtime.ray_jobs"])


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
    assert result.exit_code == 1
    assert "timeout: must be a positive number of seconds, not 0.0" in result.output
    assert len(result.output.strip().splitlines()) == 1
