"""The storage contract of a listing of jobs by last change: the filter and every order.

Each test runs once per provider, as the rest of the contract suite does.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from choreography_ray.jobs import JobStatus, StatusChange
from choreography_ray.storage import JobOrder, JobQuery


def _ids(jobs):
    return [job.id for job in jobs]


def _job(make, job_id: str, created: int, status_at: int | None = None, **fields):
    """A job created at minute `created` whose status last changed at minute `status_at`."""
    history = [] if status_at is None else [StatusChange(status=1, occurred=make.at(status_at))]
    return make.job(job_id, created=make.at(created), status_changes=history, **fields)


def test_the_last_change_is_the_latest_of_creation_status_change_and_progress_write(make):
    assert _job(make, "a", 3).last_change == make.at(3)
    assert _job(make, "b", 3, 7).last_change == make.at(7)
    assert _job(make, "c", 3, 7, changed=make.at(9)).last_change == make.at(9)
    assert _job(make, "d", 3, 7, changed=make.at(5)).last_change == make.at(7)


def test_changed_after_is_inclusive_and_changed_before_exclusive(run, storage, make):
    run(storage.jobs.save(_job(make, "never", 0)))  # its creation is its last change
    run(storage.jobs.save(_job(make, "status", 0, 2)))
    run(storage.jobs.save(_job(make, "progress", 0, 1, changed=make.at(3))))
    run(storage.jobs.save(_job(make, "late", 1, 5)))

    def matching(**bounds) -> list[str]:
        query = JobQuery(**{k: make.at(v) for k, v in bounds.items()})
        found = sorted(_ids(run(storage.jobs.query(query))))
        assert run(storage.jobs.count(query)) == len(found)
        return found

    assert matching(changed_after=2) == ["late", "progress", "status"]
    assert matching(changed_after=3) == ["late", "progress"]
    assert matching(changed_before=3) == ["never", "status"]
    assert matching(changed_after=2, changed_before=5) == ["progress", "status"]
    assert matching(changed_after=1, created_after=1) == ["late"]


def test_a_write_moves_a_job_in_the_last_change_order(run, storage, make):
    run(storage.jobs.save(_job(make, "a", 0, 1)))
    run(storage.jobs.save(_job(make, "b", 0, 2)))
    by_change = JobQuery(order=JobOrder.CHANGED)
    assert _ids(run(storage.jobs.query(by_change))) == ["a", "b"]
    job = run(storage.jobs.get("a"))
    run(storage.jobs.save(job.model_copy(update={"changed": make.at(4)})))
    assert _ids(run(storage.jobs.query(by_change))) == ["b", "a"]
    assert _ids(run(storage.jobs.query(JobQuery(changed_after=make.at(3))))) == ["a"]


@pytest.fixture
def four(run, storage, make):
    """Four jobs whose created, last-change, id and status orders all differ, with ties."""
    jobs = [
        _job(make, "d", 1, 4, status=JobStatus.COMPLETED_SUCCESSFULLY),
        _job(make, "b", 2, 2, status=JobStatus.RUNNING),
        _job(make, "a", 2, 6, status=JobStatus.FAILED),
        _job(make, "c", 0, 4, status=JobStatus.RUNNING),
    ]
    for job in jobs:
        run(storage.jobs.save(job))


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        (JobOrder.CREATED, ["c", "d", "a", "b"]),
        (JobOrder.CHANGED, ["b", "c", "d", "a"]),
        (JobOrder.ID, ["a", "b", "c", "d"]),
        (JobOrder.STATUS, ["c", "b", "d", "a"]),
    ],
)
def test_every_order_ascending_and_descending_ends_with_the_id(run, storage, four, order, expected):
    assert int(JobStatus.RUNNING) < int(JobStatus.COMPLETED_SUCCESSFULLY) < int(JobStatus.FAILED)
    assert _ids(run(storage.jobs.query(JobQuery(order=order)))) == expected
    descending = JobQuery(order=order, descending=True)
    assert _ids(run(storage.jobs.query(descending))) == expected[::-1]


def test_skip_and_take_page_through_a_descending_order(run, storage, four):
    query = JobQuery(order=JobOrder.CHANGED, descending=True, take=3)
    assert _ids(run(storage.jobs.query(query))) == ["a", "d", "c"]
    assert _ids(run(storage.jobs.query(query.model_copy(update={"skip": 3})))) == ["b"]


def test_an_order_that_is_not_one_is_a_clear_error():
    with pytest.raises(ValidationError, match="created"):
        JobQuery(order="age")
