"""Storage outages on a real Ray: a PostgreSQL server of this test's own, stopped abruptly
(`pg_ctl stop -m immediate`) at 30 % of a job and started again 20 s later; and the SQLite file
write-locked by another process for 15 s. Never the machine's shared server.

Each case checks, from storage and the steps' own side-effect table:
- the job completes once storage is back, with exact counts: none lost, none counted twice;
- no step whose success was stored before the outage ran again, and steps that ran twice are
  at most the in-flight window (the outcomes finished during the outage were held);
- reading calls answered within 5 s during the outage, with the last stored state or one
  clear `StorageUnavailableError`.

The outage itself is real time (a server stopped, a lock held): the waits are bounded.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from choreography_ray.jobs import JobsOptions, JobStatus, JobStepStatus
from choreography_ray.jobs.errors import StorageUnavailableError
from choreography_ray.testing.postgres_server import PostgresServer
from choreography_ray.testing.side_effects import MODULE, Effects, RecordRuns, SideEffects
from choreography_ray.testing.waiting import eventually, read_job

STEPS = 3000
STEP_SECONDS = 0.01
PARALLEL = 8
OUTAGE_SECONDS = 20.0
READ_BOUND = 5.0
"""Seconds a reading call may take during the outage."""

OPTIONS = JobsOptions(max_parallel_steps=PARALLEL, job_watchdog_interval="5s")


def _statuses(url: str, job_id: str) -> tuple[Any, dict[str, JobStepStatus]]:
    job, steps = read_job(url, job_id)
    return job, {step.id: step.status for step in steps}


def _successes(url: str, job_id: str) -> frozenset[str]:
    _, statuses = _statuses(url, job_id)
    return frozenset(s for s, st in statuses.items() if st == JobStepStatus.COMPLETED_SUCCESSFULLY)


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


def _connect(url: str) -> Any:
    import choreography_ray as cr

    return cr.connect(
        url, namespace=f"outage-{uuid.uuid4().hex[:8]}", options=OPTIONS, modules=[MODULE]
    )


def _timed_reads(jobs: Any, job_id: str) -> list[tuple[float, str]]:
    """A `get` and a `list` during the outage: how long each took and what it answered."""
    answers = []
    for call in (lambda: jobs.get(job_id), lambda: jobs.list()):
        began = time.monotonic()
        try:
            call()
            answer = "state"
        except StorageUnavailableError as error:
            answer = f"unavailable: {error}"
            assert "\n" not in str(error)
        answers.append((time.monotonic() - began, answer))
    return answers


def _run_outage(
    jobs: Any, url: str, tmp_path: Path, begin: Any, end: Any
) -> tuple[str, SideEffects, frozenset[str], int, list[tuple[float, str]]]:
    table = SideEffects(tmp_path / "effects.db")
    job_id = jobs.start(
        RecordRuns, Effects(table=str(table.path), steps=STEPS, step_seconds=STEP_SECONDS)
    )

    def far_enough() -> frozenset[str] | None:
        done = _successes(url, job_id)
        return done if len(done) >= 0.3 * STEPS else None

    stored = eventually(far_enough, "30 % of the steps stored", 120)
    mark = table.mark()
    began = time.time()
    begin()
    try:
        time.sleep(1.0)  # the outage is under way: the first writes are failing
        reads = _timed_reads(jobs, job_id)
        time.sleep(max(0.0, OUTAGE_SECONDS - 1.0 - sum(t for t, _ in reads)))
    finally:
        ended = time.time()
        end()
    during = [run for run in table.runs(mark) if began <= run.at <= ended]
    late = [run for run in during if run.at > began + 10]
    last = max((run.at - began for run in during), default=0.0)
    print(
        f"\n{len(during)} run(s) began during the outage, {len(late)} after its first 10 s; "
        f"the last {last:.1f} s in"
    )
    assert not late, "steps went on starting while their outcomes could not be stored"
    return job_id, table, stored, mark, reads


def _check(url: str, job_id: str, table: SideEffects, stored: frozenset[str], mark: int) -> None:
    back = time.monotonic()

    def finished() -> Any:
        job, _ = _statuses(url, job_id)
        return job if job is not None and job.status.is_terminal else None

    job = eventually(finished, "the job finished after the outage", 120)
    _, statuses = _statuses(url, job_id)
    runs = table.by_step()
    twice = sorted(step for step, found in runs.items() if len(found) > 1)
    after = table.by_step(after=mark)
    print(
        f"\nfinished {time.monotonic() - back:.1f} s after storage came back; "
        f"{len(after)} run(s) began after the outage began; {len(twice)} step(s) ran twice"
    )
    assert job.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert job.progress.successful_steps == STEPS  # none lost, none counted twice
    assert set(statuses.values()) == {JobStepStatus.COMPLETED_SUCCESSFULLY}
    assert set(runs) == set(statuses)  # every step ran
    assert set(after) & stored == set(), "a step whose success was stored ran again"
    assert len(twice) <= PARALLEL, twice  # at most the in-flight window


def test_a_postgres_server_stopped_mid_job_and_started_again(ray_instance, postgres, tmp_path):
    jobs = _connect(postgres.url)
    job_id, table, stored, mark, reads = _run_outage(
        jobs, postgres.url, tmp_path, postgres.stop, postgres.start
    )
    print(f"reads during the outage: {reads}")
    for seconds, _ in reads:
        assert seconds <= READ_BOUND
    _check(postgres.url, job_id, table, stored, mark)


_LOCKER = textwrap.dedent(
    """
    import sqlite3, sys, time
    connection = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
    connection.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    sys.stdin.readline()
    connection.execute("COMMIT")
    """
)


def test_sqlite_write_locked_by_another_process(ray_instance, tmp_path):
    path = tmp_path / "jobs.db"
    # A write waits out the lock for the busy timeout, and the provider tries it five times:
    # at the default 5 s the outage would be declared about 26 s in, after this 20 s lock. On
    # an idle machine the steps left (about 2,000, as many as a worker host may hold unwritten)
    # all started within 4 s anyway; on a loaded one runs went on starting past 10 s. At 1 s it
    # is declared within about 6.5 s (five tries and the backoff between them).
    url = f"sqlite:///{path}?busy_timeout=1000"
    jobs = _connect(url)
    locker: dict[str, subprocess.Popen[str]] = {}

    def lock() -> None:
        process = subprocess.Popen(
            [sys.executable, "-c", _LOCKER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        locker["process"] = process
        assert process.stdout is not None and process.stdout.readline().strip() == "locked"

    def unlock() -> None:
        process = locker["process"]
        assert process.stdin is not None
        process.stdin.write("\n")
        process.stdin.flush()
        process.wait(timeout=30)

    job_id, table, stored, mark, reads = _run_outage(jobs, url, tmp_path, lock, unlock)
    print(f"reads during the lock: {reads}")
    for seconds, _ in reads:
        assert seconds <= READ_BOUND
    _check(url, job_id, table, stored, mark)
