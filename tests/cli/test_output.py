"""Listings for people (one line per job at any width) and for scripts (a stable JSON schema),
without a cluster."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import typer

from choreography_ray.cli.common import exit_code
from choreography_ray.cli.output import (
    JOB_COLUMNS,
    age,
    job_detail_json,
    job_json,
    job_rows,
    lines,
    short_ids,
    step_json,
)
from choreography_ray.jobs.errors import (
    AmbiguousJobIdError,
    ClusterAuthenticationError,
    ClusterUnreachableError,
    InvalidJobIdError,
    InvalidOptionError,
    JobNotFoundError,
    RemoveJobFailed,
    StorageUnavailableError,
)
from choreography_ray.jobs.state import JobProgress, JobState, JobStepState, StepError
from choreography_ray.jobs.status import JobStatus, JobStepStatus
from choreography_ray.storage.protocols import StepCounts

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def job(job_id: str, job_type: str = "examples.rebuild-search-index-for-every-tenant") -> JobState:
    return JobState(
        id=job_id,
        type=job_type,
        status=JobStatus.COMPLETED_WITH_FAILURES,
        created=NOW - timedelta(hours=3),
        progress=JobProgress(total_steps=20000, successful_steps=19990, failed_steps=10),
    )


def test_short_ids_are_the_shortest_unique_prefixes_of_at_least_eight():
    ids = ["3f2a9c1e5d7b4a60aaaa", "3f2a9c1e5d7b4a61bbbb", "77e0c4d2ffff", "abc"]
    assert short_ids(ids) == {
        "3f2a9c1e5d7b4a60aaaa": "3f2a9c1e5d7b4a60",
        "3f2a9c1e5d7b4a61bbbb": "3f2a9c1e5d7b4a61",
        "77e0c4d2ffff": "77e0c4d2",
        "abc": "abc",
    }


@pytest.mark.parametrize("width", [80, 60, 40])
def test_a_listing_keeps_one_line_per_job_within_the_width(width):
    jobs = [job(uuid.uuid4().hex) for _ in range(3)]
    printed = lines(JOB_COLUMNS, job_rows(jobs, wide=False, now=NOW), width)
    assert len(printed) == 1 + len(jobs)  # a header and one line per job
    assert all(len(line) <= width for line in printed)
    assert all(
        line.split()[0] in {"id", *short_ids(j.id for j in jobs).values()} for line in printed
    )
    if width == 80:
        assert "COMPLETED_WITH_FAILURES" in printed[1] and "20000/20000" in printed[1]
        assert "examples.rebuild" in printed[1] and "…" in printed[1] and "3h" in printed[1]


def test_wide_listings_keep_full_ids_and_whole_columns():
    jobs = [job("f" * 32)]
    printed = lines(JOB_COLUMNS, job_rows(jobs, wide=True, now=NOW), None)
    assert "f" * 32 in printed[1] and "examples.rebuild-search-index-for-every-tenant" in printed[1]


def test_ages_read_in_the_largest_unit():
    assert [age(NOW - timedelta(seconds=s), NOW) for s in (5, 90, 7200, 200000)] == [
        "5s",
        "1m",
        "2h",
        "2d",
    ]


def test_the_json_schema_of_a_job_is_stable():
    listed = job_json(job("j1"))
    assert set(listed) == {
        "id",
        "scope",
        "namespace",
        "type",
        "status",
        "priority",
        "created",
        "updated",
        "progress",
        "details",
        "waiting_for_worker",
        "concurrency_key",
        "waiting_for_key",
        "adaptive_window",
        "adaptive_windows",
        "quarantine",
    }
    assert listed["created"] == "2026-05-01T09:00:00Z"
    assert listed["progress"]["failed"] == 10
    shown = job_detail_json(job("j1"), StepCounts({JobStepStatus.FAILED: 10}, unreadable=1))
    assert set(shown) - set(listed) == {
        "status_history",
        "step_counts",
        "unreadable_steps",
        "step_records_read",
        "owner",
        "pending_drain",
        "stop_finalized",
        "execution_generation",
        "recovery_attempts",
        "recovery_error",
    }
    assert shown["step_counts"] == {"FAILED": 10} and shown["unreadable_steps"] == 1
    assert shown["step_records_read"] is True


def test_the_json_schema_of_a_step_carries_its_error():
    step = JobStepState(
        id="s1",
        job_id="j1",
        type="t",
        status=JobStepStatus.FAILED,
        attempt=3,
        error=StepError(messages=["disk full"], stack_trace="Traceback …"),
    )
    shown = step_json(step)
    assert shown["status"] == "FAILED" and shown["attempt"] == 3
    assert shown["error"] == {"messages": ["disk full"], "stack_trace": "Traceback …"}


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (RemoveJobFailed("completed"), 1),
        (TimeoutError("did not finish"), 1),
        (InvalidOptionError("limit", "must be 0 or more"), 2),
        (InvalidJobIdError("a/b", "contains a path separator"), 2),
        (ValueError("unknown status 'bogus'"), 2),
        (JobNotFoundError("j1"), 3),
        (AmbiguousJobIdError("3f", ["3f2a", "3f2b"], False), 2),
        (ClusterUnreachableError("cannot reach the Ray cluster at 'auto'"), 4),
        (ClusterAuthenticationError("the cluster uses token authentication"), 4),
        (StorageUnavailableError("cannot reach storage"), 4),
    ],
)
def test_errors_exit_with_their_documented_code(error, code):
    assert exit_code(error) == code
    assert isinstance(typer.Exit(code), typer.Exit)


def test_an_error_of_many_lines_is_printed_as_one(capsys):
    """The last safeguard of every command: whatever an error's text spans (a driver's
    message, a traceback pasted into a reason), the command prints one line."""
    from choreography_ray.cli.common import fail

    exit_with = fail(ValueError("bad value\n  detail on a second line\n\nand a third"))
    printed = capsys.readouterr().err.strip().splitlines()
    assert len(printed) == 1 and printed[0].startswith("error: bad value")
    assert exit_with.exit_code == 2
