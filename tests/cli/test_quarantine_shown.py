"""`jobs list` and `jobs show` say that recovery gave up on a job, why, and what takes it out;
run as commands over a stored state, without a cluster (the reading is stubbed)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

import choreography_ray.cli.jobs as jobs_commands
from choreography_ray.cli import app
from choreography_ray.cli.output import job_detail_json, job_json, job_rows
from choreography_ray.jobs.state import JobKey, JobProgress, JobState, Quarantine
from choreography_ray.jobs.status import JobStatus
from choreography_ray.storage.protocols import StepCounts

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
REASON = (
    "10 recoveries in a row did not complete; the last error: the resume hook failed: "
    "[tenant-7] has no index (FileNotFoundError)"
)

runner = CliRunner()


def job(job_id: str = "poisoned-job", *, key: JobKey | None = None, **fields: Any) -> JobState:
    return JobState(
        id=job_id,
        key=key or JobKey(),
        type="examples.rebuild",
        status=JobStatus.RUNNING,
        created=NOW - timedelta(hours=1),
        progress=JobProgress(total_steps=4, successful_steps=1),
        **fields,
    )


def quarantined(job_id: str = "poisoned-job", **fields: Any) -> JobState:
    return job(
        job_id,
        quarantine=Quarantine(reason=REASON, attempts=10, since=NOW),
        recovery_attempts=10,
        **fields,
    )


@pytest.fixture
def stored(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the reading commands find: `answer` is what their storage read returns."""
    found: dict[str, Any] = {}

    def read_cluster(storage: Any, address: Any, work: Any, **_: Any) -> Any:
        return found["answer"]

    monkeypatch.setattr(jobs_commands, "read_cluster", read_cluster)
    return found


def invoke(*args: str) -> Any:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_jobs_list_marks_a_quarantined_job(stored):
    stored["answer"] = [quarantined("aaaaaaaa-poisoned"), job("bbbbbbbb-healthy")]
    lines = invoke("jobs", "list").output.splitlines()
    assert "RUNNING (quarantined)" in lines[1] and "aaaaaaaa" in lines[1]
    assert "quarantined" not in lines[2] and "RUNNING" in lines[2]
    listed = json.loads(invoke("jobs", "list", "-o", "json").output)
    assert listed[0]["quarantine"] == {
        "reason": REASON,
        "attempts": 10,
        "since": "2026-05-01T12:00:00Z",
    }
    assert listed[1]["quarantine"] is None


def test_jobs_show_gives_the_reason_and_the_command_that_takes_the_job_out(stored):
    stored["answer"] = (quarantined(), StepCounts(), {})
    output = invoke("jobs", "show", "poisoned-job").output
    assert f"quarantined since 2026-05-01 12:00:00 UTC after 10 recovery attempts: {REASON}" in (
        output
    )  # brackets in the reason are printed, not read as markup
    assert "`choreography jobs resume poisoned-job` takes it out of quarantine" in output
    shown = json.loads(invoke("jobs", "show", "poisoned-job", "-o", "json").output)
    assert shown["quarantine"]["attempts"] == 10 and shown["recovery_attempts"] == 10


def test_jobs_show_names_the_partition_in_the_resume_command(stored):
    stored["answer"] = (quarantined(key=JobKey(scope="studio")), StepCounts(), {})
    output = invoke("jobs", "show", "poisoned-job", "--scope", "studio").output
    assert "`choreography jobs resume poisoned-job --scope studio` takes it out" in output


def test_jobs_show_counts_recoveries_that_did_not_complete_before_any_quarantine(stored):
    stored["answer"] = (
        job(recovery_attempts=2, recovery_error="the resume hook failed: [tenant-7] boom"),
        StepCounts(),
        {},
    )
    output = invoke("jobs", "show", "poisoned-job").output
    assert (
        "recovery attempts in a row not completed: 2; the last failed: the resume hook failed: "
        "[tenant-7] boom" in output
    )
    assert "quarantined" not in output
    stored["answer"] = (job(), StepCounts(), {})
    assert "recovery attempts" not in invoke("jobs", "show", "poisoned-job").output


def test_the_json_of_a_job_says_whether_it_is_quarantined():
    assert job_json(job())["quarantine"] is None
    assert job_rows([quarantined()], wide=True, now=NOW)[0][1] == "RUNNING (quarantined)"
    shown = job_detail_json(quarantined(recovery_error="boom"), StepCounts())
    assert (shown["recovery_attempts"], shown["recovery_error"]) == (10, "boom")
