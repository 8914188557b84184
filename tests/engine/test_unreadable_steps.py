"""A job whose step records cannot all be read is never resumed, recovered or completed from
the records that can: it is refused with UNREADABLE_STEPS and stays as it is in storage.

The records are made unreadable as an operator or a later release would leave them: a step
type this release does not register, and a row that is not JSON.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from pydantic import BaseModel

from choreography_ray.jobs import (
    CannotResumeJobError,
    InvalidRequestError,
    Job,
    JobsOptions,
    JobStatus,
    ResumeJobFailed,
)
from choreography_ray.testing import InProcessCluster

from .fixtures import ScenarioJob, Script, request

KEYS = [f"k{i}" for i in range(12)]


def _rows(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as db:
        jobs = db.execute(  # the record last, whatever columns later releases add
            "SELECT scope, namespace, id, type, status, created, stop_finalized, changed, "
            "version, state FROM choreography_jobs ORDER BY id"
        ).fetchall()
        steps = db.execute(
            "SELECT * FROM choreography_job_steps ORDER BY job_id, step_id"
        ).fetchall()
    return jobs + steps


def _spoil(path: Path, job_id: str) -> None:
    """Two steps of a type this release does not know, one that is not JSON."""
    with sqlite3.connect(path) as db:
        ids = [
            row[0]
            for row in db.execute(
                "SELECT step_id FROM choreography_job_steps WHERE job_id = ? ORDER BY step_id",
                (job_id,),
            )
        ]
        for step_id in ids[:2]:
            db.execute(
                "UPDATE choreography_job_steps SET type = 'later.release.Step', "
                "state = replace(state, 'scenario.key-step', 'later.release.Step') "
                "WHERE job_id = ? AND step_id = ?",
                (job_id, step_id),
            )
        db.execute(
            "UPDATE choreography_job_steps SET state = '{not json' "
            "WHERE job_id = ? AND step_id = ?",
            (job_id, ids[2]),
        )


@pytest.fixture
def sqlite_cluster(tmp_path, run):
    def make() -> InProcessCluster:
        cluster = InProcessCluster(
            f"sqlite:///{tmp_path / 'jobs.db'}", options=JobsOptions(max_parallel_steps=4)
        )
        run(cluster.provider.initialize())
        made.append(cluster)
        return cluster

    made: list[InProcessCluster] = []
    yield make, tmp_path / "jobs.db"
    for cluster in made:
        run(cluster.close())


def _blocked_job(run, cluster: InProcessCluster, script: Script) -> str:
    for key in KEYS:
        script.behaviour[key].block = True
    result = run(cluster.start(ScenarioJob, request(*KEYS), job_id="spoiled"))
    assert result.error is None, result
    run(cluster.settle())
    return result.job_id


def test_resuming_a_stopped_job_with_unreadable_steps_is_refused_and_changes_nothing(
    run, script, sqlite_cluster
):
    make, path = sqlite_cluster
    cluster = make()
    job_id = _blocked_job(run, cluster, script)
    run(cluster.manager().stop(job_id))
    run(cluster.settle())
    assert run(cluster.manager().get(job_id)).status == JobStatus.STOPPED
    _spoil(path, job_id)
    before, ran = _rows(path), {key: script.ran(key) for key in KEYS}

    with pytest.raises(ResumeJobFailed) as refused:
        run(cluster.manager().resume(job_id))

    assert refused.value.code == CannotResumeJobError.UNREADABLE_STEPS
    message = str(refused.value)
    assert "\n" not in message and "3 step record(s) cannot be read" in message
    assert "later.release.Step" in message
    run(cluster.settle())
    assert _rows(path) == before
    assert {key: script.ran(key) for key in KEYS} == ran  # nothing ran again


def test_recovering_a_running_job_with_unreadable_steps_leaves_it_as_it_is(
    run, script, sqlite_cluster
):
    make, path = sqlite_cluster
    cluster = make()
    job_id = _blocked_job(run, cluster, script)
    run(cluster.crash())
    _spoil(path, job_id)
    before, ran = _rows(path), {key: script.ran(key) for key in KEYS}

    async def rehydrate():
        report = await (await cluster.manager().rehydrate())
        await cluster.settle()
        return report

    report = run(rehydrate())

    assert job_id in report.failed
    after = _rows(path)
    assert after[1:] == before[1:]  # every step record as it was
    # The job record too, but for the recovery it counted and why that failed (quarantine).
    counted = json.loads(after[0][-1])
    assert counted.pop("recovery_attempts") == 1
    assert "3 step record(s) cannot be read" in counted.pop("recovery_error")
    stored = json.loads(before[0][-1])
    assert (stored.pop("recovery_attempts"), stored.pop("recovery_error")) == (0, "")
    assert counted == stored
    assert run(cluster.manager().get(job_id)).status == JobStatus.RUNNING
    assert {key: script.ran(key) for key in KEYS} == ran


def test_removing_a_job_with_unreadable_steps_removes_every_record(run, script, sqlite_cluster):
    make, path = sqlite_cluster
    cluster = make()
    job_id = _blocked_job(run, cluster, script)
    run(cluster.crash())
    _spoil(path, job_id)

    run(cluster.manager().remove(job_id))
    run(cluster.settle())

    assert _rows(path) == []


def test_counting_a_job_with_unreadable_steps_counts_them_apart(run, script, sqlite_cluster):
    make, path = sqlite_cluster
    cluster = make()
    job_id = _blocked_job(run, cluster, script)
    _spoil(path, job_id)

    counts = run(cluster.manager().step_counts(job_id))

    assert counts.unreadable == 3
    assert counts.total == len(KEYS)


class GaugeJobRequest(BaseModel):
    reading: float


class GaugeJob(Job[GaugeJobRequest], name="scenario.gauge-job"):
    def prepare_steps(self, request):  # pragma: no cover - refused before planning
        return []


def test_a_job_request_that_storage_would_change_is_refused_before_anything_is_written(
    run, script, sqlite_cluster
):
    make, path = sqlite_cluster
    cluster = make()
    before = _rows(path)

    with pytest.raises(InvalidRequestError, match="nan"):
        run(cluster.start(GaugeJob, GaugeJobRequest(reading=float("nan")), job_id="gauge"))

    assert _rows(path) == before
