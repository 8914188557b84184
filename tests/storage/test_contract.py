"""The storage contract: every provider answers every operation the same way.

Each test runs once per provider (memory, sqlite, postgres, mongomock, and a real MongoDB when
configured). Provider differences are capability flags, never provider names.
"""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from choreography_ray.jobs import (
    RUNNING_JOB_STATUSES,
    STOP_STATUSES,
    TERMINAL_JOB_STATUSES,
    JobKey,
    JobStatus,
    JobStepStatus,
    MalformedRecordError,
    Payload,
    PlannedStep,
    RecordNotFoundError,
    StorageJobError,
    UnknownTypeError,
    UnreadableStepsError,
    VersionConflictError,
)
from choreography_ray.storage import JobQuery, StepCounts
from choreography_ray.storage.protocols import PLAN_PART, STEP_PART, step_parts

from ..strategies import job_states, job_step_states, register_examples
from .conftest import JOB_TYPE, STEP_TYPE, ExampleRequest
from .support import plan_parts, whole_plan

# -- jobs: reading and writing ------------------------------------------------------------------


def test_a_saved_job_reads_back_equal_with_version_one(run, storage, make):
    job = make.job()
    assert run(storage.jobs.save(job)) == 1
    stored = run(storage.jobs.get(job.id))
    assert stored == job.model_copy(update={"version": 1})


def test_a_missing_job_is_not_found(run, storage):
    assert run(storage.jobs.find("nope")) is None
    with pytest.raises(RecordNotFoundError) as raised:
        run(storage.jobs.get("nope"))
    assert raised.value.code == StorageJobError.NOT_FOUND
    assert "nope" in str(raised.value)


def test_inserting_a_job_that_exists_conflicts(run, storage, make):
    job = make.job()
    run(storage.jobs.save(job))
    with pytest.raises(VersionConflictError) as raised:
        run(storage.jobs.save(job.model_copy(update={"details": "second"})))
    assert raised.value.conflicts == [job.id]
    assert run(storage.jobs.get(job.id)).details == ""


def test_an_update_with_the_stored_version_succeeds_and_bumps_it(run, storage, make):
    job = make.job()
    job.version = run(storage.jobs.save(job))
    job.status = JobStatus.STOPPED
    assert run(storage.jobs.save(job)) == 2
    assert run(storage.jobs.get(job.id)).status == JobStatus.STOPPED


def test_an_update_with_a_stale_version_conflicts_and_changes_nothing(run, storage, make):
    job = make.job()
    run(storage.jobs.save(job))
    stale = job.model_copy(update={"version": 1, "details": "first"})
    assert run(storage.jobs.save(stale)) == 2
    with pytest.raises(VersionConflictError):
        run(storage.jobs.save(stale.model_copy(update={"details": "second"})))
    assert run(storage.jobs.get(job.id)).details == "first"


def test_an_update_of_a_job_that_does_not_exist_conflicts(run, storage, make):
    with pytest.raises(VersionConflictError):
        run(storage.jobs.save(make.job(version=3)))


def test_of_two_writers_of_one_version_exactly_one_wins(run, storage, make):
    job = make.job()
    job.version = run(storage.jobs.save(job))

    async def both():
        first = job.model_copy(update={"details": "a"})
        second = job.model_copy(update={"details": "b"})
        return await asyncio.gather(
            storage.jobs.save(first), storage.jobs.save(second), return_exceptions=True
        )

    results = run(both())
    wins = [r for r in results if r == 2]
    losses = [r for r in results if isinstance(r, VersionConflictError)]
    assert len(wins) == 1 and len(losses) == 1
    assert run(storage.jobs.get(job.id)).details in {"a", "b"}


def test_of_two_inserts_of_one_job_exactly_one_wins(run, storage, make):
    job = make.job()

    async def both():
        return await asyncio.gather(
            storage.jobs.save(job.model_copy(update={"details": "a"})),
            storage.jobs.save(job.model_copy(update={"details": "b"})),
            return_exceptions=True,
        )

    results = run(both())
    assert sorted(type(r).__name__ for r in results) == ["VersionConflictError", "int"]


def test_removing_a_job_deletes_it_once(run, storage, make):
    job = make.job()
    run(storage.jobs.save(job))
    assert run(storage.jobs.remove(job.id)) is True
    assert run(storage.jobs.find(job.id)) is None
    assert run(storage.jobs.remove(job.id)) is False


@pytest.mark.parametrize(
    "status",
    [JobStatus.COMPLETED_SUCCESSFULLY, JobStatus.COMPLETED_WITH_FAILURES, JobStatus.FAILED],
)
def test_remove_terminal_deletes_a_terminal_job(run, storage, make, status):
    job = make.job(status=status)
    run(storage.jobs.save(job))
    assert run(storage.jobs.remove_terminal(job.id)) is True
    assert run(storage.jobs.find(job.id)) is None


@pytest.mark.parametrize(
    "status",
    [
        JobStatus.PREPARING_JOB,
        JobStatus.PREPARING_STEPS,
        JobStatus.STARTING_STEPS,
        JobStatus.RUNNING,
        JobStatus.STOPPED,
        JobStatus.REMOVING,
    ],
)
def test_remove_terminal_never_deletes_a_live_job(run, storage, make, status):
    job = make.job(status=status)
    run(storage.jobs.save(job))
    assert run(storage.jobs.remove_terminal(job.id)) is False
    assert run(storage.jobs.get(job.id)).status == status


def test_remove_terminal_of_a_missing_job_is_false(run, storage):
    assert run(storage.jobs.remove_terminal("missing")) is False


# -- jobs: queries ------------------------------------------------------------------------------


def _ids(jobs):
    return [job.id for job in jobs]


def test_a_query_orders_by_creation_then_id(run, storage, make):
    jobs = [
        make.job("c", created=make.at(1)),
        make.job("b", created=make.at(2)),
        make.job("a", created=make.at(2)),
        make.job("d", created=make.at(0)),
    ]
    for job in jobs:
        run(storage.jobs.save(job))
    assert _ids(run(storage.jobs.query(JobQuery()))) == ["d", "c", "a", "b"]
    assert _ids(run(storage.jobs.query())) == ["d", "c", "a", "b"]


def test_a_query_filters_by_type_and_status(run, storage, make, registry):
    class OtherJob:
        pass

    registry.register(OtherJob, kind="job", name="contract.other-job")
    run(storage.jobs.save(make.job("r", status=JobStatus.RUNNING, created=make.at(1))))
    run(storage.jobs.save(make.job("s", status=JobStatus.STOPPED, created=make.at(2))))
    run(storage.jobs.save(make.job("f", status=JobStatus.FAILED, created=make.at(3))))
    run(storage.jobs.save(make.job("o", type="contract.other-job", created=make.at(4))))
    running_or_stopped = JobQuery(statuses=frozenset({JobStatus.RUNNING, JobStatus.STOPPED}))
    assert _ids(run(storage.jobs.query(running_or_stopped))) == ["r", "s", "o"]
    assert _ids(run(storage.jobs.query(JobQuery(type=JOB_TYPE)))) == ["r", "s", "f"]
    both = JobQuery(type="contract.other-job", statuses=frozenset({JobStatus.RUNNING}))
    assert _ids(run(storage.jobs.query(both))) == ["o"]
    assert run(storage.jobs.count(JobQuery(type=JOB_TYPE))) == 3
    assert run(storage.jobs.count()) == 4


def test_created_before_is_exclusive(run, storage, make):
    for minute in range(4):
        run(storage.jobs.save(make.job(f"j{minute}", created=make.at(minute))))
    before = JobQuery(created_before=make.at(2))
    assert _ids(run(storage.jobs.query(before))) == ["j0", "j1"]
    assert run(storage.jobs.count(before)) == 2


def test_created_after_is_inclusive_and_bounds_a_range_with_created_before(run, storage, make):
    for minute in range(5):
        run(storage.jobs.save(make.job(f"j{minute}", created=make.at(minute))))
    after = JobQuery(created_after=make.at(2))
    assert _ids(run(storage.jobs.query(after))) == ["j2", "j3", "j4"]
    between = JobQuery(created_after=make.at(1), created_before=make.at(3))
    assert _ids(run(storage.jobs.query(between))) == ["j1", "j2"]
    assert run(storage.jobs.count(between)) == 2


def test_an_id_prefix_keeps_the_jobs_whose_id_starts_with_it_exactly(run, storage, make):
    ids = ["3f2a9c1e-a", "3f2a9c1e-b", "3F2A9C1E-c", "3f2b", "3f%_", "3f%x", "4"]
    for minute, job_id in enumerate(ids):
        run(storage.jobs.save(make.job(job_id, created=make.at(minute))))

    def matching(prefix: str) -> list[str]:
        query = JobQuery(id_prefix=prefix)
        found = _ids(run(storage.jobs.query(query)))
        assert run(storage.jobs.count(query)) == len(found)
        return found

    assert matching("3f2a9c1e") == ["3f2a9c1e-a", "3f2a9c1e-b"]
    assert matching("3F") == ["3F2A9C1E-c"]
    assert matching("3f%_") == ["3f%_"]
    assert matching("3f%") == ["3f%_", "3f%x"]
    assert matching("3f2a9c1e-b") == ["3f2a9c1e-b"]
    assert matching("5") == []
    assert len(matching("")) == len(ids)


def test_skip_and_take_page_through_the_order(run, storage, make):
    for minute in range(7):
        run(storage.jobs.save(make.job(f"j{minute}", created=make.at(minute))))
    assert _ids(run(storage.jobs.query(JobQuery(skip=2, take=3)))) == ["j2", "j3", "j4"]
    assert _ids(run(storage.jobs.query(JobQuery(skip=5, take=3)))) == ["j5", "j6"]
    assert len(run(storage.jobs.query(JobQuery(take=0)))) == 7
    assert len(run(storage.jobs.query(JobQuery(take=-1)))) == 7
    assert run(storage.jobs.query(JobQuery(skip=9))) == []


def test_take_defaults_to_a_page_of_one_hundred(run, storage, make):
    for n in range(105):
        run(storage.jobs.save(make.job(f"j{n:03}", created=make.at(n))))
    assert len(run(storage.jobs.query())) == 100


def test_listing_excluding_finalized_stops_leaves_out_only_finalized_stopped_jobs(
    run, storage, make
):
    cases = {
        "running": (JobStatus.RUNNING, False),
        "preparing": (JobStatus.PREPARING_STEPS, False),
        "stopped-open": (JobStatus.STOPPED, False),
        "stopped-final": (JobStatus.STOPPED, True),
        "removing-final": (JobStatus.REMOVING, True),
        "removing-open": (JobStatus.REMOVING, False),
        "completed": (JobStatus.COMPLETED_SUCCESSFULLY, False),
    }
    for minute, (job_id, (status, finalized)) in enumerate(cases.items()):
        job = make.job(job_id, status=status, stop_finalized=finalized, created=make.at(minute))
        run(storage.jobs.save(job))
    wanted = [
        JobStatus.RUNNING,
        JobStatus.PREPARING_STEPS,
        JobStatus.STOPPED,
        JobStatus.REMOVING,
    ]
    found = run(storage.jobs.get_jobs_excluding_finalized_stops(wanted))
    assert _ids(found) == [
        "running",
        "preparing",
        "stopped-open",
        "removing-final",
        "removing-open",
    ]


def test_a_finalized_stop_that_resumes_and_stops_again_is_listed(run, storage, make):
    job = make.job(status=JobStatus.STOPPED, stop_finalized=True)
    job.version = run(storage.jobs.save(job))
    assert run(storage.jobs.get_jobs_excluding_finalized_stops([JobStatus.STOPPED])) == []
    job.stop_finalized = False
    run(storage.jobs.save(job))
    assert _ids(run(storage.jobs.get_jobs_excluding_finalized_stops([JobStatus.STOPPED]))) == [
        job.id
    ]


# -- the catalog of partitions with unfinished jobs ----------------------------------------------

UNFINISHED = RUNNING_JOB_STATUSES | STOP_STATUSES
"""The statuses rehydration loads (engine.manager.INTERRUPTED_STATUSES)."""


def _save_in(run, provider, make, key, status, *, finalized=False):
    job = make.job(key=key, status=status, stop_finalized=finalized)
    job.version = run(provider.for_key(key).jobs.save(job))
    return job


def _listed(run, provider, keys):
    """Which of `keys` the catalog lists: other tests may share the store."""
    found = run(provider.keys_with_jobs(UNFINISHED))
    assert len(found) == len(set(found))
    assert found == sorted(found, key=lambda k: (k.scope, k.namespace))
    return [k for k in found if k in set(keys)]


def test_the_catalog_lists_exactly_the_partitions_with_unfinished_jobs(run, provider, make, key):
    def part(name):
        return JobKey(scope=key.scope, namespace=name)

    for status in sorted(RUNNING_JOB_STATUSES):
        _save_in(run, provider, make, part(f"a-{status.name.lower()}"), status)
    _save_in(run, provider, make, part("b-open-stop"), JobStatus.STOPPED)
    _save_in(run, provider, make, part("c-removing"), JobStatus.REMOVING, finalized=True)
    for status in sorted(TERMINAL_JOB_STATUSES):
        _save_in(run, provider, make, part("d-terminal"), status)
    _save_in(run, provider, make, part("e-finalized-stop"), JobStatus.STOPPED, finalized=True)
    provider.for_key(part("f-opened-never-written"))
    _save_in(run, provider, make, part("g-mixed"), JobStatus.COMPLETED_SUCCESSFULLY)
    _save_in(run, provider, make, part("g-mixed"), JobStatus.RUNNING)
    _save_in(run, provider, make, part("g-mixed"), JobStatus.RUNNING)
    running = [part(f"a-{status.name.lower()}") for status in sorted(RUNNING_JOB_STATUSES)]
    unfinished = [*running, part("b-open-stop"), part("c-removing"), part("g-mixed")]
    finished = [part(n) for n in ("d-terminal", "e-finalized-stop", "f-opened-never-written")]

    assert _listed(run, provider, unfinished + finished) == sorted(
        unfinished, key=lambda k: k.namespace
    )


def test_the_catalog_follows_jobs_as_they_finish_and_stop(run, provider, make, key):
    job = _save_in(run, provider, make, key, JobStatus.RUNNING)
    assert _listed(run, provider, [key]) == [key]
    job.status = JobStatus.STOPPED
    job.version = run(provider.for_key(key).jobs.save(job))
    assert _listed(run, provider, [key]) == [key]
    job.stop_finalized = True
    job.version = run(provider.for_key(key).jobs.save(job))
    assert _listed(run, provider, [key]) == []
    job.status, job.stop_finalized = JobStatus.RUNNING, False
    job.version = run(provider.for_key(key).jobs.save(job))
    assert _listed(run, provider, [key]) == [key]
    run(provider.for_key(key).jobs.remove(job.id))
    assert _listed(run, provider, [key]) == []


@pytest.mark.parametrize(
    ("scope", "namespace"),
    [
        ("plain", "default"),
        ("plain", "tenant-a"),
        ("Upper.Case+plus", "Tenant/1"),
        ("h0123456789abcdef01234567", "default"),
        ("x" * 60, "y" * 60),
        ("ünïcode", "名前"),
    ],
)
def test_the_catalog_names_any_partition_key_as_it_was_written(
    run, provider, make, key, scope, namespace
):
    mine = JobKey(scope=f"{key.scope}-{scope}", namespace=namespace)
    _save_in(run, provider, make, mine, JobStatus.RUNNING)
    assert _listed(run, provider, [mine]) == [mine]


def test_the_catalog_asks_only_for_the_given_statuses(run, provider, make, key):
    _save_in(run, provider, make, key, JobStatus.RUNNING)
    assert run(provider.keys_with_jobs([])) == []
    assert key not in run(provider.keys_with_jobs([JobStatus.STOPPED]))
    assert key in run(provider.keys_with_jobs([JobStatus.RUNNING]))


# -- isolation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "other", [{"namespace": "tenant-b"}, {"scope": "another-scope"}], ids=["namespace", "scope"]
)
def test_scopes_and_namespaces_do_not_see_or_touch_each_other(
    run, provider, storage, make, key, other
):
    other_key = key.model_copy(update=other)
    other_storage = provider.for_key(other_key)
    mine = make.job("shared-id", details="mine", status=JobStatus.COMPLETED_SUCCESSFULLY)
    theirs = mine.model_copy(update={"key": other_key, "details": "theirs"})
    run(storage.jobs.save(mine))
    run(other_storage.jobs.save(theirs))
    run(storage.steps.save(make.step("shared-id", "step-1")))

    assert run(other_storage.jobs.get("shared-id")).details == "theirs"
    assert run(other_storage.steps.get_for_job("shared-id")) == []
    assert run(other_storage.steps.count_for_job("shared-id")) == 0
    assert run(other_storage.steps.find("shared-id", "step-1")) is None
    assert run(other_storage.jobs.count()) == 1

    assert run(other_storage.jobs.remove_terminal("shared-id")) is True
    assert run(other_storage.steps.remove_all_for_job("shared-id")) == 0
    assert run(storage.jobs.get("shared-id")).details == "mine"
    assert run(storage.steps.count_for_job("shared-id")) == 1
    assert _ids(run(storage.jobs.query())) == ["shared-id"]
    assert run(other_storage.jobs.query()) == []


def test_a_partition_refuses_a_job_of_another_partition(run, storage, make, key):
    foreign = make.job(key=JobKey(scope=key.scope, namespace="elsewhere"))
    with pytest.raises(ValueError, match="belongs to"):
        run(storage.jobs.save(foreign))


def test_the_same_partition_twice_is_one_partition(run, provider, storage, make, key):
    run(storage.jobs.save(make.job("j")))
    again = provider.for_key(JobKey(scope=key.scope, namespace=key.namespace))
    assert run(again.jobs.get("j")).id == "j"


@pytest.mark.parametrize("bad", ["", None, 42, "x" * 201])
def test_a_bad_job_id_is_a_clear_error(run, storage, bad):
    with pytest.raises(ValueError, match="job id"):
        run(storage.jobs.get(bad))


# -- unreadable records -------------------------------------------------------------------------


def _raw_job(run, support, provider, key, job_id, document, *, type=JOB_TYPE, minute=0):
    run(
        support.write_raw_job(
            provider,
            key,
            job_id,
            document=document,
            type=type,
            status=int(JobStatus.RUNNING),
            created_us=1_700_000_000_000_000 + minute,
        )
    )


def test_a_malformed_job_is_skipped_in_listings_and_an_error_when_read(
    run, support, provider, storage, key, make, caplog
):
    run(storage.jobs.save(make.job("good", created=make.at(0))))
    _raw_job(run, support, provider, key, "bad", "{not json", minute=1)
    with caplog.at_level(logging.WARNING, logger="choreography_ray.storage"):
        assert _ids(run(storage.jobs.query())) == ["good"]
        assert _ids(run(storage.jobs.get_jobs_excluding_finalized_stops([JobStatus.RUNNING]))) == [
            "good"
        ]
    assert any("bad" in record.getMessage() for record in caplog.records)
    with pytest.raises(MalformedRecordError, match="bad"):
        run(storage.jobs.get("bad"))


def test_a_job_whose_record_misses_fields_is_malformed(run, support, provider, storage, key):
    _raw_job(run, support, provider, key, "partial", json.dumps({"id": "partial"}))
    with pytest.raises(MalformedRecordError):
        run(storage.jobs.get("partial"))
    assert run(storage.jobs.query()) == []


def test_a_job_of_an_unknown_type_is_skipped_and_never_imported(
    run, support, provider, storage, key, make, caplog
):
    run(storage.jobs.save(make.job("good", created=make.at(0))))
    document = make.job("evil", type="os.system").model_dump_json()
    _raw_job(run, support, provider, key, "evil", document, type="os.system", minute=1)
    with caplog.at_level(logging.WARNING, logger="choreography_ray.storage"):
        assert _ids(run(storage.jobs.query())) == ["good"]
    with pytest.raises(UnknownTypeError) as raised:
        run(storage.jobs.get("evil"))
    assert raised.value.name == "os.system"


def test_a_listing_of_only_unknown_types_is_empty(run, support, provider, storage, key, make):
    for n in range(3):
        document = make.job(f"u{n}", type="nobody.knows").model_dump_json()
        _raw_job(run, support, provider, key, f"u{n}", document, type="nobody.knows", minute=n)
    assert run(storage.jobs.query()) == []
    assert run(storage.jobs.count()) == 3


def test_a_job_whose_request_type_is_unknown_cannot_be_read(
    run, support, provider, storage, key, make
):
    job = make.job("odd", request=Payload(type="not.registered", data={}))
    _raw_job(run, support, provider, key, "odd", job.model_dump_json())
    with pytest.raises(UnknownTypeError):
        run(storage.jobs.get("odd"))


def test_a_job_whose_request_does_not_fit_its_type_is_malformed(
    run, support, provider, storage, key, make
):
    job = make.job("odd", request=Payload(type="contract.request", data={"index": 3}))
    _raw_job(run, support, provider, key, "odd", job.model_dump_json())
    with pytest.raises(MalformedRecordError, match=r"contract\.request"):
        run(storage.jobs.get("odd"))


def test_saving_a_job_does_not_validate_away_unknown_data(run, storage, make):
    job = make.job(
        plan=[
            PlannedStep(
                step_id="s1",
                stage=1,
                step_type=STEP_TYPE,
                request=Payload(type="contract.request", data={"index": "x", "shard": 2}),
            )
        ]
    )
    run(storage.jobs.save(job))
    assert run(storage.jobs.get(job.id)).plan == job.plan


# -- steps --------------------------------------------------------------------------------------


def test_a_saved_step_reads_back_equal(run, storage, make):
    step = make.step("job-1", "step-1", stage=2, name="shard 1")
    assert run(storage.steps.save(step)) == 1
    assert run(storage.steps.get("job-1", "step-1")) == step.model_copy(update={"version": 1})


def test_a_missing_step_is_not_found(run, storage):
    assert run(storage.steps.find("job", "step")) is None
    with pytest.raises(RecordNotFoundError, match="step"):
        run(storage.steps.get("job", "step"))


def test_step_writes_are_compare_and_set(run, storage, make):
    step = make.step("job-1", "step-1")
    step.version = run(storage.steps.save(step))
    with pytest.raises(VersionConflictError):
        run(storage.steps.save(step.model_copy(update={"version": 0})))
    step.status = JobStepStatus.RUNNING
    assert run(storage.steps.save(step)) == 2
    with pytest.raises(VersionConflictError) as raised:
        run(storage.steps.save(step.model_copy(update={"status": JobStepStatus.FAILED})))
    assert raised.value.conflicts == ["step-1"]
    assert run(storage.steps.get("job-1", "step-1")).status == JobStepStatus.RUNNING


def test_of_two_step_writers_exactly_one_wins(run, storage, make):
    step = make.step("job-1", "step-1")
    step.version = run(storage.steps.save(step))

    async def both():
        return await asyncio.gather(
            storage.steps.save(step.model_copy(update={"name": "a"})),
            storage.steps.save(step.model_copy(update={"name": "b"})),
            return_exceptions=True,
        )

    results = run(both())
    assert sorted(type(r).__name__ for r in results) == ["VersionConflictError", "int"]


def test_get_many_reads_the_asked_steps_in_order_and_leaves_out_missing_ones(run, storage, make):
    run(storage.steps.save_many([make.step("job", f"s{n}", stage=n) for n in range(5)]))
    run(storage.steps.save(make.step("other", "s1")))
    found = run(storage.steps.get_many("job", ["s3", "missing", "s0", "s4"]))
    assert [(s.id, s.job_id, s.version) for s in found] == [
        ("s3", "job", 1),
        ("s0", "job", 1),
        ("s4", "job", 1),
    ]
    assert run(storage.steps.get_many("job", [])) == []


def test_get_many_reads_more_steps_than_one_batch(run, storage, make):
    run(storage.steps.save_many([make.step("job", f"s{n:05}") for n in range(2500)]))
    ids = [f"s{n:05}" for n in reversed(range(2500))]
    assert [s.id for s in run(storage.steps.get_many("job", ids))] == ids


def test_an_empty_batch_writes_nothing(run, storage):
    assert run(storage.steps.save_many([])) == []


def test_a_batch_of_one_is_versioned(run, storage, make):
    step = make.step("job-1", "step-1")
    assert run(storage.steps.save_many([step])) == [1]
    step.version = 1
    assert run(storage.steps.save_many([step])) == [2]


def test_a_batch_of_ten_thousand_steps_is_written_and_updated(run, storage, make):
    steps = [make.step("big", f"s{n:05}", stage=n % 3) for n in range(10_000)]
    assert run(storage.steps.save_many(steps)) == [1] * 10_000
    assert run(storage.steps.count_for_job("big")) == 10_000
    for step in steps:
        step.version = 1
        step.status = JobStepStatus.COMPLETED_SUCCESSFULLY
    for start in range(0, 10_000, 100):
        assert run(storage.steps.save_many(steps[start : start + 100])) == [2] * 100
    counts = run(storage.steps.count_by_status("big"))
    assert counts == {JobStepStatus.COMPLETED_SUCCESSFULLY: 10_000}
    loaded = run(storage.steps.get_for_job("big"))
    assert len(loaded) == 10_000
    assert [(s.stage, s.id) for s in loaded] == sorted((s.stage, s.id) for s in steps)


def test_a_batch_with_a_stale_record_reports_it_and_leaves_it_unchanged(
    run, provider, storage, make
):
    steps = [make.step("job-1", f"s{n}") for n in range(5)]
    run(storage.steps.save_many(steps))
    for step in steps:
        step.version = 1
    run(storage.steps.save(steps[2].model_copy(update={"name": "moved on"})))
    for step in steps:
        step.status = JobStepStatus.RUNNING
    with pytest.raises(VersionConflictError) as raised:
        run(storage.steps.save_many(steps))
    assert raised.value.conflicts == ["s2"]
    stored = {s.id: s for s in run(storage.steps.get_for_job("job-1"))}
    assert stored["s2"].name == "moved on" and stored["s2"].status == JobStepStatus.SCHEDULED
    if provider.capabilities.atomic_batches:
        assert all(s.status == JobStepStatus.SCHEDULED for s in stored.values())
        assert all(s.version == 1 for i, s in stored.items() if i != "s2")
    else:
        assert all(s.status == JobStepStatus.RUNNING for i, s in stored.items() if i != "s2")
        assert raised.value.applied == {i: 2 for i in stored if i != "s2"}


def test_a_batch_that_inserts_an_existing_step_conflicts(run, provider, storage, make):
    run(storage.steps.save(make.step("job-1", "s1")))
    with pytest.raises(VersionConflictError) as raised:
        run(storage.steps.save_many([make.step("job-1", "s0"), make.step("job-1", "s1")]))
    assert raised.value.conflicts == ["s1"]
    if provider.capabilities.atomic_batches:
        assert run(storage.steps.find("job-1", "s0")) is None


def test_a_step_twice_in_one_batch_is_refused(run, storage, make):
    step = make.step("job-1", "s1")
    with pytest.raises(ValueError, match="twice"):
        run(storage.steps.save_many([step, step]))
    assert run(storage.steps.find("job-1", "s1")) is None


def test_steps_of_a_job_filter_by_status_and_order_by_stage_then_id(run, storage, make):
    statuses = [
        ("b", 0, JobStepStatus.RUNNING),
        ("a", 1, JobStepStatus.FAILED),
        ("c", 0, JobStepStatus.COMPLETED_WITH_FAILURE),
        ("d", 2, JobStepStatus.RUNNING),
    ]
    run(storage.steps.save_many([make.step("job", i, stage=g, status=s) for i, g, s in statuses]))
    run(storage.steps.save(make.step("other-job", "z")))
    assert [s.id for s in run(storage.steps.get_for_job("job"))] == ["b", "c", "a", "d"]
    failed = [JobStepStatus.FAILED, JobStepStatus.COMPLETED_WITH_FAILURE]
    assert [s.id for s in run(storage.steps.get_for_job("job", failed))] == ["c", "a"]
    assert run(storage.steps.get_for_job("job", [])) == []
    assert run(storage.steps.count_for_job("job", [JobStepStatus.RUNNING])) == 2
    assert run(storage.steps.count_by_status("job")) == {
        JobStepStatus.RUNNING: 2,
        JobStepStatus.FAILED: 1,
        JobStepStatus.COMPLETED_WITH_FAILURE: 1,
    }
    assert run(storage.steps.count_by_status("nobody")) == {}


def test_removing_steps(run, storage, make):
    run(storage.steps.save_many([make.step("job", f"s{n}") for n in range(3)]))
    run(storage.steps.save(make.step("other", "s0")))
    assert run(storage.steps.remove("job", "s0")) is True
    assert run(storage.steps.remove("job", "s0")) is False
    assert run(storage.steps.remove_all_for_job("job")) == 2
    assert run(storage.steps.count_for_job("job")) == 0
    assert run(storage.steps.count_for_job("other")) == 1


def test_removing_non_failed_steps_keeps_failed_ones_queryable(run, storage, make):
    statuses = list(JobStepStatus)
    run(storage.steps.save_many([make.step("job", f"s{int(s)}", status=s) for s in statuses]))
    removed = run(storage.steps.remove_all_non_failed_for_job("job"))
    assert removed == len(statuses) - 2
    left = run(storage.steps.get_for_job("job"))
    assert sorted(s.status for s in left) == [
        JobStepStatus.COMPLETED_WITH_FAILURE,
        JobStepStatus.FAILED,
    ]


def _raw_step(
    run, support, provider, key, job_id, step_id, document, stage=0, status=JobStepStatus.RUNNING
):
    run(
        support.write_raw_step(
            provider,
            key,
            job_id,
            step_id,
            document=document,
            status=int(status),
            stage=stage,
        )
    )


def test_an_unreadable_step_is_skipped_in_listings_and_an_error_when_read(
    run, support, provider, storage, key, make, caplog
):
    run(storage.steps.save(make.step("job", "good", status=JobStepStatus.RUNNING)))
    _raw_step(run, support, provider, key, "job", "bad", "[1, 2")
    unknown = make.step("job", "alien", type="somewhere.Else").model_dump_json()
    _raw_step(run, support, provider, key, "job", "alien", unknown)
    with caplog.at_level(logging.WARNING, logger="choreography_ray.storage"):
        assert [s.id for s in run(storage.steps.get_for_job("job"))] == ["good"]
        assert [s.id for s in run(storage.steps.get_for_job("job", [JobStepStatus.RUNNING]))] == [
            "good"
        ]
    assert run(storage.steps.count_for_job("job")) == 3
    with pytest.raises(MalformedRecordError):
        run(storage.steps.get("job", "bad"))
    with pytest.raises(UnknownTypeError):
        run(storage.steps.get("job", "alien"))


def _job_with_unreadable_steps(run, support, provider, storage, key, make):
    """Job "job": two readable steps, and three records that cannot be read (one malformed,
    two of a step type this release does not register), one of them with a failed status."""
    run(
        storage.steps.save_many(
            [
                make.step("job", "good-1", status=JobStepStatus.COMPLETED_SUCCESSFULLY),
                make.step("job", "good-2", status=JobStepStatus.FAILED, stage=1),
            ]
        )
    )
    alien = make.step("job", "x", type="later.release.Step").model_dump_json()
    _raw_step(run, support, provider, key, "job", "alien-1", alien.replace('"x"', '"alien-1"'))
    _raw_step(
        run,
        support,
        provider,
        key,
        "job",
        "alien-2",
        alien.replace('"x"', '"alien-2"'),
        status=JobStepStatus.FAILED,
    )
    _raw_step(run, support, provider, key, "job", "broken", "{not json", stage=1)
    run(storage.steps.save(make.step("other-job", "untouched")))


def test_a_strict_load_of_a_job_with_unreadable_steps_names_them_and_returns_nothing(
    run, support, provider, storage, key, make
):
    _job_with_unreadable_steps(run, support, provider, storage, key, make)
    with pytest.raises(UnreadableStepsError) as raised:
        run(storage.steps.get_all_for_job("job"))
    error = raised.value
    assert error.job_id == "job"
    assert sorted(error.unreadable) == ["alien-1", "alien-2", "broken"]
    assert "later.release.Step" in error.unreadable["alien-1"]
    assert "malformed" in error.unreadable["broken"]
    message = str(error)
    assert "3 step record(s) cannot be read" in message and "'alien-1'" in message
    assert "\n" not in message
    # Nothing changed in storage, and listings still show what can be read.
    assert run(storage.steps.count_for_job("job")) == 5
    assert [s.id for s in run(storage.steps.get_for_job("job"))] == ["good-1", "good-2"]


def test_a_strict_load_of_readable_steps_is_the_listing(run, storage, make):
    run(storage.steps.save_many([make.step("job", f"s{n}", stage=n % 2) for n in range(4)]))
    strict = run(storage.steps.get_all_for_job("job"))
    assert strict == run(storage.steps.get_for_job("job"))
    assert [s.id for s in strict] == ["s0", "s2", "s1", "s3"]
    running = [JobStepStatus.RUNNING]
    assert run(storage.steps.get_all_for_job("job", running)) == []
    assert run(storage.steps.get_all_for_job("nobody")) == []


def test_a_job_s_records_are_read_in_parts_in_step_id_order_naming_the_unreadable(
    run, support, provider, storage, key, make
):
    """What recovery reads: bounded parts across the stages, each record once, a record that
    cannot be read named where it lies rather than left out or raised."""
    _job_with_unreadable_steps(run, support, provider, storage, key, make)
    parts = []
    after = None
    while True:
        part = run(storage.steps.part_for_job("job", after, take=2))
        parts.append(([s.id for s in part.steps], sorted(part.unreadable), part.last))
        if part.last is None:
            break
        after = part.last
    assert parts == [
        ([], ["alien-1", "alien-2"], "alien-2"),
        (["good-1"], ["broken"], "good-1"),
        (["good-2"], [], None),  # shorter than asked: the last part
    ]
    assert "later.release.Step" in run(storage.steps.part_for_job("job")).unreadable["alien-1"]


def test_reading_a_job_s_records_in_parts_reaches_every_one_and_only_its_own(run, storage, make):
    ids = [f"s{n:05}" for n in range(STEP_PART + 1)]
    run(storage.steps.save_many([make.step("job", i, stage=n % 3) for n, i in enumerate(ids)]))
    run(storage.steps.save(make.step("other-job", "s00000")))

    async def read_all(job_id):
        return [part async for part in step_parts(storage.steps, job_id)]

    parts = run(read_all("job"))
    assert [len(part.steps) for part in parts] == [STEP_PART, 1]
    assert [s.id for part in parts for s in part.steps] == ids
    assert [part.last for part in parts] == [ids[STEP_PART - 1], None]
    (empty,) = run(read_all("nobody"))
    assert (empty.steps, empty.unreadable, empty.last) == ([], {}, None)
    # A full last part is followed by an empty one.
    exact = run(storage.steps.part_for_job("job", ids[0], take=STEP_PART))
    assert exact.last == ids[-1]
    after = run(storage.steps.part_for_job("job", exact.last, take=STEP_PART))
    assert (after.steps, after.last) == ([], None)


def test_a_part_of_no_records_is_refused(run, storage):
    with pytest.raises(ValueError, match="at least one record, not 0"):
        run(storage.steps.part_for_job("job", None, take=0))


def test_an_unreadable_step_error_names_only_the_first_few_ids():
    error = UnreadableStepsError("job", {f"s{n}": "unknown step type" for n in range(1996)})
    message = str(error)
    assert "1996 step record(s)" in message and "'s0'" in message and "'s2'" in message
    assert "'s3'" not in message and "and 1993 more" in message


def test_counts_and_the_unreadable_steps_error_cross_process_boundaries_whole():
    counts = StepCounts({JobStepStatus.FAILED: 2}, unreadable=1)
    again = pickle.loads(pickle.dumps(counts))
    assert again == counts and again.unreadable == 1 and again.total == 3
    assert again != StepCounts({JobStepStatus.FAILED: 2})
    error = pickle.loads(pickle.dumps(UnreadableStepsError("job", {"s1": "malformed"})))
    assert (error.job_id, error.unreadable) == ("job", {"s1": "malformed"})
    assert "'s1': malformed" in str(error)


def test_unreadable_steps_are_counted_apart_never_dropped(
    run, support, provider, storage, key, make
):
    _job_with_unreadable_steps(run, support, provider, storage, key, make)
    counts = run(storage.steps.count_by_status("job"))
    assert dict(counts) == {JobStepStatus.COMPLETED_SUCCESSFULLY: 1, JobStepStatus.FAILED: 1}
    assert counts.unreadable == 3
    assert counts.total == run(storage.steps.count_for_job("job")) == 5
    assert run(storage.steps.count_by_status("other-job")).unreadable == 0


def test_a_count_by_stored_status_counts_every_record_without_reading_one(
    run, support, provider, storage, key, make
):
    """What `jobs show` and the console ask while a job runs: one grouped query, not a million
    decodes. Every record counts by the status stored beside it, readable or not."""
    _job_with_unreadable_steps(run, support, provider, storage, key, make)
    counts = run(storage.steps.count_by_status("job", verify=False))
    assert dict(counts) == {
        JobStepStatus.COMPLETED_SUCCESSFULLY: 1,
        JobStepStatus.FAILED: 2,
        JobStepStatus.RUNNING: 2,
    }
    assert counts.unreadable == 0 and not counts.verified
    assert counts.total == 5
    assert run(storage.steps.count_by_status("nobody", verify=False)) == {}


def test_removing_a_job_s_steps_removes_unreadable_records_too(
    run, support, provider, storage, key, make
):
    _job_with_unreadable_steps(run, support, provider, storage, key, make)
    assert run(storage.steps.remove_all_for_job("job")) == 5
    assert run(storage.steps.count_for_job("job")) == 0
    assert run(storage.steps.count_for_job("other-job")) == 1


def test_keeping_failed_steps_keeps_only_readable_ones(run, support, provider, storage, key, make):
    # A failed record that cannot be read is shown by no query: keeping it would keep it forever.
    _job_with_unreadable_steps(run, support, provider, storage, key, make)
    assert run(storage.steps.remove_all_non_failed_for_job("job")) == 4
    assert [s.id for s in run(storage.steps.get_all_for_job("job"))] == ["good-2"]
    assert run(storage.steps.count_for_job("job")) == 1
    assert run(storage.steps.count_for_job("other-job")) == 1


def test_a_step_whose_state_does_not_fit_its_type_is_malformed(
    run, support, provider, storage, key, make
):
    odd = make.step("job", "odd", state=Payload(type="contract.state", data={"shard": "x"}))
    _raw_step(run, support, provider, key, "job", "odd", odd.model_dump_json())
    with pytest.raises(MalformedRecordError, match=r"contract\.state"):
        run(storage.steps.get("job", "odd"))


# -- plans --------------------------------------------------------------------------------------


def _plan(count: int, prefix: str = "s") -> list[PlannedStep]:
    return [
        PlannedStep(
            step_id=f"{prefix}{n:05}",
            stage=n % 2,
            step_type=STEP_TYPE,
            name=f"shard {n}",
            request=Payload(
                type="contract.request", data=ExampleRequest(index="i", shard=n).model_dump()
            ),
        )
        for n in range(count)
    ]


def test_providers_without_external_plans_say_so(provider, storage):
    assert (storage.plans is not None) == provider.capabilities.external_step_plans


@pytest.fixture
def plans(provider, storage):
    if not provider.capabilities.external_step_plans:
        pytest.skip(f"{type(provider).__name__} keeps plans inline")
    return storage.plans


def test_a_stored_plan_loads_in_plan_order(run, plans):
    plan = list(reversed(_plan(5)))
    run(plans.save_plan("job", 1, plan))
    assert run(whole_plan(plans, "job", 1)) == plan


def test_a_missing_plan_loads_empty(run, plans):
    assert run(whole_plan(plans, "job", 7)) == []


def test_an_empty_plan_is_stored_and_loads_empty(run, plans):
    run(plans.save_plan("job", 1, []))
    assert run(whole_plan(plans, "job", 1)) == []


def test_deleting_a_plan_deletes_only_that_incarnation(run, plans):
    run(plans.save_plan("job", 1, _plan(3, "a")))
    run(plans.save_plan("job", 2, _plan(2, "b")))
    run(plans.save_plan("other", 1, _plan(1, "c")))
    assert run(plans.delete_plan("job", 1)) == 3
    assert run(whole_plan(plans, "job", 1)) == []
    assert [p.step_id for p in run(whole_plan(plans, "job", 2))] == ["b00000", "b00001"]
    assert len(run(whole_plan(plans, "other", 1))) == 1
    assert run(plans.delete_plan("job", 1)) == 0


def test_stored_plans_are_listed_by_job_and_incarnation_and_bounded(run, plans):
    assert run(plans.stored_plans(take=10)) == []
    run(plans.save_plan("job-b", 2, _plan(2, "b")))
    run(plans.save_plan("job-a", 1, _plan(3, "a")))
    run(plans.save_plan("job-b", 1, _plan(1, "c")))
    assert run(plans.stored_plans(take=10)) == [("job-a", 1), ("job-b", 1), ("job-b", 2)]
    assert run(plans.stored_plans(take=2)) == [("job-a", 1), ("job-b", 1)]
    run(plans.delete_plan("job-b", 1))
    assert run(plans.stored_plans(take=10)) == [("job-a", 1), ("job-b", 2)]


def test_a_retried_plan_save_replaces_the_earlier_attempt(run, plans):
    run(plans.save_plan("job", 1, _plan(5, "first")))
    retry = _plan(3, "second")
    run(plans.save_plan("job", 1, retry))
    assert run(whole_plan(plans, "job", 1)) == retry


def test_a_plan_of_ten_thousand_steps_round_trips(run, plans):
    plan = _plan(10_000)
    run(plans.save_plan("job", 3, plan))
    assert run(whole_plan(plans, "job", 3)) == plan


def test_a_plan_saved_in_parts_reads_back_in_bounded_parts_in_order(run, plans):
    """A plan too large to hold whole is saved a part at a time and read a part at a time."""
    plan = _plan(PLAN_PART + 2_500)
    run(plans.save_plan("job", 2, plan[:PLAN_PART]))
    run(plans.append_plan("job", 2, PLAN_PART, plan[PLAN_PART : PLAN_PART + 2_000]))
    run(plans.append_plan("job", 2, PLAN_PART + 2_000, plan[PLAN_PART + 2_000 :]))
    parts = run(plan_parts(plans, "job", 2))
    assert [len(part) for part in parts] == [PLAN_PART, 2_500]
    assert [planned for part in parts for planned in part] == plan
    assert run(whole_plan(plans, "job", 2)) == plan
    assert run(plans.stored_plans(take=10)) == [("job", 2)]
    assert run(plans.delete_plan("job", 2)) == len(plan)
    assert run(plan_parts(plans, "job", 2)) == []


def test_a_part_appended_again_replaces_its_interrupted_attempt(run, plans):
    """A part whose write is retried after a lost answer leaves one copy of each entry."""
    plan = _plan(3_000)
    run(plans.save_plan("job", 1, plan[:1_000]))
    run(plans.append_plan("job", 1, 1_000, plan[1_000:2_000]))
    run(plans.append_plan("job", 1, 1_000, plan[1_000:2_000]))
    run(plans.append_plan("job", 1, 2_000, plan[2_000:]))
    assert run(whole_plan(plans, "job", 1)) == plan
    retry = _plan(2, "again")
    run(plans.save_plan("job", 1, retry))  # the whole plan saved again starts from nothing
    assert run(whole_plan(plans, "job", 1)) == retry


def test_a_large_plan_is_listed_once_and_deleted_whole(run, plans):
    """However a provider splits a plan into records (SQL: rows of a thousand entries)."""
    run(plans.save_plan("job", 3, _plan(2_500)))
    run(plans.save_plan("job", 4, _plan(1_001, "b")))
    assert run(plans.stored_plans(take=10)) == [("job", 3), ("job", 4)]
    assert run(plans.delete_plan("job", 3)) == 2_500
    assert run(plans.stored_plans(take=10)) == [("job", 4)]
    assert [p.step_id for p in run(whole_plan(plans, "job", 4))][-2:] == ["b00999", "b01000"]


def test_plans_are_isolated_between_partitions(run, provider, plans, key):
    other = provider.for_key(key.model_copy(update={"namespace": "tenant-b"}))
    run(plans.save_plan("job", 1, _plan(2)))
    assert run(whole_plan(other.plans, "job", 1)) == []
    assert run(other.plans.delete_plan("job", 1)) == 0
    assert len(run(whole_plan(plans, "job", 1))) == 2


def test_a_plan_entry_of_an_unknown_step_type_cannot_be_loaded(run, plans):
    entry = _plan(1)[0].model_copy(update={"step_type": "who.knows"})
    run(plans.save_plan("job", 1, [entry]))
    with pytest.raises(UnknownTypeError):
        run(whole_plan(plans, "job", 1))


def test_a_plan_entry_of_an_unknown_request_type_cannot_be_loaded(run, plans):
    entries = _plan(3)
    entries[2] = entries[2].model_copy(update={"request": Payload(type="who.knows", data={})})
    run(plans.save_plan("job", 1, entries))
    with pytest.raises(UnknownTypeError, match=r"who\.knows"):
        run(whole_plan(plans, "job", 1))


def test_a_plan_entry_is_read_back_with_its_request_data_unchecked(run, plans):
    """Plan storage checks the names an entry holds; its request's data is checked once, by
    the engine as it loads it to prepare the step, which names the step when it does not fit
    (tests/engine/test_plan_parts.py)."""
    entry = _plan(1)[0]
    unfit = entry.model_copy(update={"request": Payload(type="contract.request", data=[1])})
    run(plans.save_plan("job", 1, [unfit]))
    assert run(whole_plan(plans, "job", 1)) == [unfit]


# -- property-based round trips -----------------------------------------------------------------

_ROUND_TRIP = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_ROUND_TRIP
@given(data=st.data())
def test_any_job_state_round_trips(run, provider, storage, key, registry, data):
    examples = register_examples(registry)
    job = data.draw(job_states(key=key, registry_types=examples, job_id=uuid.uuid4().hex))
    job.version = run(storage.jobs.save(job))
    assert run(storage.jobs.get(job.id)) == job
    job.status = JobStatus.STOPPED
    job.version = run(storage.jobs.save(job))
    assert run(storage.jobs.get(job.id)) == job


@_ROUND_TRIP
@given(data=st.data())
def test_any_step_state_round_trips(run, provider, storage, registry, data):
    examples = register_examples(registry)
    job_id = uuid.uuid4().hex
    steps = data.draw(
        st.lists(
            job_step_states(
                job_id=job_id, registry_types=examples, populated=data.draw(st.booleans())
            ),
            min_size=1,
            max_size=5,
            unique_by=lambda s: s.id,
        )
    )
    versions = run(storage.steps.save_many(steps))
    for step, version in zip(steps, versions, strict=True):
        step.version = version
        assert run(storage.steps.get(job_id, step.id)) == step
    assert sorted(run(storage.steps.get_for_job(job_id)), key=lambda s: s.id) == sorted(
        steps, key=lambda s: s.id
    )
