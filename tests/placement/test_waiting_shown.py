"""`jobs list` and `jobs show` say why a job waits for a worker."""

from __future__ import annotations

from datetime import UTC, datetime

from choreography_ray.cli.jobs import waiting_text
from choreography_ray.jobs.state import JobState, WorkerWait


def test_a_waiting_job_reads_waiting_for_a_worker_with_the_reason() -> None:
    job = JobState(id="j", type="t", created=datetime.now(UTC))
    assert waiting_text(job) == ""
    job.waiting_for_worker = WorkerWait(
        reason="no worker host runs job type 't'", since=job.created
    )
    assert waiting_text(job) == "waiting for a worker: no worker host runs job type 't'"
    assert JobState.model_validate_json(job.model_dump_json()) == job  # stored as JSON
