"""What the MongoDB provider does beyond the contract: names, indexes, plans, retries, URLs.

Everything runs on mongomock; the tests marked `mongodb` run against the server named by
CHOREOGRAPHY_TEST_MONGODB_URL and are skipped without it.
"""

from __future__ import annotations

import hashlib
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from bson.int64 import Int64
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    ConnectionFailure,
    DuplicateKeyError,
    ExecutionTimeout,
    NetworkTimeout,
    NotPrimaryError,
    OperationFailure,
    ServerSelectionTimeoutError,
    WaitQueueTimeoutError,
)

from choreography_ray.jobs import (
    ConfigurationError,
    JobKey,
    JobsOptions,
    JobStatus,
    JobStepStatus,
    Payload,
    PlannedStep,
    StorageUnavailableError,
    TypeRegistry,
    VersionConflictError,
)
from choreography_ray.storage import JobQuery, StorageURL, open_storage
from choreography_ray.storage.mongo import (
    MongoStorage,
    database_name,
    forget_mongomock_store,
)

from .conftest import STEP_TYPE, ExampleRequest, ExampleState, Factory
from .mongo_support import MongoServerSupport
from .support import MONGODB_ENV, env, whole_plan

# -- fixtures -------------------------------------------------------------------------------------


def _mock_url() -> str:
    return f"mongomock://localhost/t_{uuid.uuid4().hex[:12]}"


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def url() -> Iterator[str]:
    url = _mock_url()
    yield url
    forget_mongomock_store(url)


@pytest.fixture
def mongo(url: str, registry: TypeRegistry, sleeps: Sleeps, run: Any) -> Iterator[MongoStorage]:
    options = JobsOptions(transient_retry_attempts=4)
    provider = open_storage(url, registry=registry, options=options, sleep=sleeps)
    assert isinstance(provider, MongoStorage)
    run(provider.initialize())
    try:
        yield provider
    finally:
        run(provider.close())


def _plan(count: int, prefix: str = "s") -> list[PlannedStep]:
    return [
        PlannedStep(
            step_id=f"{prefix}{n:05}",
            stage=n % 2,
            step_type=STEP_TYPE,
            request=Payload(
                type="contract.request", data=ExampleRequest(index="i", shard=n).model_dump()
            ),
        )
        for n in range(count)
    ]


# -- database names -------------------------------------------------------------------------------


def _hashed(prefix: str, scope: str, namespace: str) -> str:
    digest = hashlib.sha256(f"{scope}\0{namespace}".encode()).hexdigest()[:24]
    return f"{prefix}+h{digest}"


def test_the_default_namespace_is_left_out_of_the_name():
    assert database_name("choreography", JobKey(scope="studio")) == "choreography+studio"


def test_another_namespace_is_part_of_the_name():
    key = JobKey(scope="studio", namespace="tenant-a")
    assert database_name("choreography", key) == "choreography+studio+tenant-a"


@pytest.mark.parametrize(
    ("scope", "namespace"),
    [
        ("a/b", "default"),
        ("a.b", "default"),
        ("a b", "default"),
        ("a$b", "default"),
        ("studio", 'x"y'),
        ("studio", "x:y"),
        ("studio", "x?y"),
        ("studio", "x*y|z<>"),
        ("back\\slash", "default"),
        ("a+b", "default"),
        ("Studio", "default"),
        ("studio", "Tenant"),
        ("h" + "0" * 24, "default"),
    ],
)
def test_a_name_mongodb_would_refuse_or_confuse_is_hashed(scope, namespace):
    name = database_name("p", JobKey(scope=scope, namespace=namespace))
    assert name == _hashed("p", scope, namespace)
    assert len(name.encode()) <= 63


def test_plus_signs_cannot_make_two_partitions_share_a_database():
    joined = database_name("p", JobKey(scope="a+b"))
    split = database_name("p", JobKey(scope="a", namespace="b"))
    assert split == "p+a+b"
    assert joined != split


def test_a_name_over_63_bytes_is_hashed():
    fits = JobKey(scope="s" * (63 - len("p+")))
    assert database_name("p", fits) == "p+" + "s" * 61
    long = JobKey(scope="s" * 62)
    assert database_name("p", long) == _hashed("p", "s" * 62, "default")
    multibyte = JobKey(scope="é" * 31)  # 62 bytes
    assert database_name("p", multibyte) == _hashed("p", "é" * 31, "default")


def test_hashed_names_are_deterministic_and_tell_partitions_apart():
    first = database_name("p", JobKey(scope="a.b", namespace="n"))
    assert first == database_name("p", JobKey(scope="a.b", namespace="n"))
    assert first != database_name("p", JobKey(scope="a.b", namespace="m"))
    assert first != database_name("p", JobKey(scope="a.b\0n"))


def test_the_prefix_comes_from_the_url_path(registry):
    assert MongoStorage(StorageURL("mongomock://x/jobs_db"), registry=registry).prefix == "jobs_db"
    assert MongoStorage(StorageURL("mongomock://x"), registry=registry).prefix == "choreography"
    assert MongoStorage(StorageURL("mongomock://x/"), registry=registry).prefix == "choreography"


@pytest.mark.parametrize("path", ["a.b", "x" * 38, "a%20b"])
def test_a_prefix_mongodb_cannot_use_is_a_configuration_error(path, registry):
    with pytest.raises(ConfigurationError, match="prefix"):
        MongoStorage(StorageURL(f"mongomock://x/{path}"), registry=registry)


def test_a_partition_lives_in_its_named_database(run, mongo, registry):
    key = JobKey(scope="studio", namespace="tenant-a")
    make = Factory(registry, key)
    run(mongo.for_key(key).jobs.save(make.job("j1")))
    assert mongo.partition(key).database.name == f"{mongo.prefix}+studio+tenant-a"
    assert mongo.client[f"{mongo.prefix}+studio+tenant-a"]["jobs"].count_documents({}) == 1


# -- layout ---------------------------------------------------------------------------------------


def test_documents_carry_the_queried_fields_beside_the_record(run, mongo, registry):
    key = JobKey(scope="studio")
    make = Factory(registry, key)
    storage = mongo.for_key(key)
    job = make.job("j1", status=JobStatus.STOPPED, stop_finalized=True)
    run(storage.jobs.save(job))
    run(storage.steps.save(make.step("j1", "s1", stage=3)))
    stored = mongo.partition(key).jobs.find_one({"_id": "j1"})
    assert stored["type"] == job.type
    assert stored["status"] == int(JobStatus.STOPPED)
    assert stored["created"] == 1_767_225_600_000_000  # 2026-01-01 in microseconds
    assert isinstance(stored["created"], Int64) and isinstance(stored["version"], Int64)
    assert stored["stopFinalized"] is True and stored["version"] == 1
    assert isinstance(stored["state"], dict) and stored["state"]["id"] == "j1"
    step = mongo.partition(key).steps.find_one({"jobId": "j1", "stepId": "s1"})
    assert step["_id"] == {"jobId": "j1", "stepId": "s1"}
    assert (step["stage"], step["status"], step["version"]) == (3, int(JobStepStatus.SCHEDULED), 1)
    assert step["state"]["job_id"] == "j1"


def test_values_bson_cannot_hold_as_documents_are_stored_as_json(run, mongo, registry):
    key = JobKey(scope="studio")
    make = Factory(registry, key)
    storage = mongo.for_key(key)
    huge = make.step("j", "huge", state=registry.dump(ExampleState(shard=2**70)))
    odd_keys = make.step(
        "j", "odd", state=Payload(type="contract.state", data={"shard": 1, "$set": {"a.b": 1}})
    )
    run(storage.steps.save_many([huge, odd_keys]))
    for step in (huge, odd_keys):
        document = mongo.partition(key).steps.find_one({"stepId": step.id})
        assert isinstance(document["state"], str)
        assert run(storage.steps.get("j", step.id)) == step.model_copy(update={"version": 1})
    request = Payload(type="contract.request", data={"index": "i", "shard": 1, "x.y": {"$z": 2}})
    job = make.job("j", request=request)
    run(storage.jobs.save(job))
    assert isinstance(mongo.partition(key).jobs.find_one({"_id": "j"})["state"], str)
    assert run(storage.jobs.get("j")) == job.model_copy(update={"version": 1})
    assert run(storage.jobs.query()) == [job.model_copy(update={"version": 1})]
    plan = [_plan(1)[0].model_copy(update={"request": request})]
    run(storage.plans.save_plan("j", 1, plan))
    assert isinstance(mongo.partition(key).plans.find_one({"jobId": "j"})["entry"], str)
    assert run(whole_plan(storage.plans, "j", 1)) == plan


# -- the catalog of partitions --------------------------------------------------------------------


def test_the_catalog_reads_a_key_stored_as_json_text(run, mongo, registry):
    key = JobKey(scope="Odd.Scope", namespace="t")
    request = Payload(type="contract.request", data={"index": "i", "shard": 1, "x.y": {"$z": 2}})
    run(mongo.for_key(key).jobs.save(Factory(registry, key).job("j", request=request)))
    assert isinstance(mongo.partition(key).jobs.find_one({"_id": "j"})["state"], str)
    assert run(mongo.keys_with_jobs([JobStatus.RUNNING])) == [key]


def test_the_catalog_never_takes_a_database_of_another_prefix_for_its_own(run, mongo, registry):
    # A provider with prefix `{p}+a` keeps partition b/default in `{p}+a+b`, which reads like
    # partition a/b of prefix `{p}`; the job in it names b/default, whose database is `{p}+b`.
    key = JobKey(scope="b")
    run(mongo.for_key(key).jobs.save(Factory(registry, key).job("j")))
    document = mongo.partition(key).jobs.find_one({"_id": "j"})
    mongo.client[f"{mongo.prefix}+a+b"]["jobs"].insert_one(document)
    mongo.partition(key).jobs.delete_one({"_id": "j"})
    assert run(mongo.keys_with_jobs([JobStatus.RUNNING])) == []


def test_a_job_that_does_not_name_its_partition_is_logged_and_left_out(
    run, mongo, registry, caplog
):
    good = JobKey(scope="good")
    run(mongo.for_key(good).jobs.save(Factory(registry, good).job("j")))
    broken = mongo.client[f"{mongo.prefix}+broken"]["jobs"]
    broken.insert_one({"_id": "x", "status": int(JobStatus.RUNNING), "state": "{not json"})
    with caplog.at_level("WARNING", logger="choreography_ray.storage"):
        assert run(mongo.keys_with_jobs([JobStatus.RUNNING])) == [good]
    assert "does not say which partition it belongs to" in caplog.text


# -- indexes --------------------------------------------------------------------------------------


EXPECTED_INDEXES = {
    "jobs": {
        "status",
        "type_status",
        "status_created",
        "type_status_created",
        "status_stopFinalized",
        "created",
        "changed",
    },
    "job-steps": {
        "jobId_status",
        "jobId_stepId",
        "jobId_stage_stepId",
        "jobId_stage_position_stepId",
        "jobId_changed_stepId",
    },
    "job-step-plans": {"jobId_incarnation_index"},
}


def _index_names(partition) -> dict[str, set[str]]:
    return {
        collection.name: set(collection.index_information()) - {"_id_"}
        for collection in (partition.jobs, partition.steps, partition.plans)
    }


def test_the_indexes_exist_after_first_use(run, mongo):
    key = JobKey(scope="studio")
    run(mongo.for_key(key).jobs.count())
    assert _index_names(mongo.partition(key)) == EXPECTED_INDEXES
    keys = mongo.partition(key).jobs.index_information()["type_status_created"]["key"]
    assert [field for field, _ in keys] == ["type", "status", "created", "_id"]
    plan_keys = mongo.partition(key).plans.index_information()["jobId_incarnation_index"]["key"]
    assert [field for field, _ in plan_keys] == ["jobId", "incarnation", "ordinal"]


def test_index_creation_is_idempotent_and_keeps_older_indexes(run, url, registry):
    key = JobKey(scope="studio", namespace="n")
    first = MongoStorage(StorageURL(url), registry=registry)
    first.partition(key).plans.create_index([("jobId", 1)], name="jobId")
    run(first.for_key(key).jobs.count())
    run(first.initialize())
    second = MongoStorage(StorageURL(url), registry=registry)
    run(second.for_key(key).steps.count_for_job("j"))
    run(second.initialize())
    names = _index_names(second.partition(key))
    assert names["jobs"] == EXPECTED_INDEXES["jobs"]
    assert names["job-step-plans"] == {"jobId_incarnation_index", "jobId"}
    run(first.close())
    run(second.close())


def test_initialize_creates_the_indexes_of_partitions_already_open(run, url, registry):
    provider = MongoStorage(StorageURL(url), registry=registry)
    key = JobKey(scope="early")
    provider.for_key(key)
    run(provider.initialize())
    assert _index_names(provider.partition(key)) == EXPECTED_INDEXES
    run(provider.close())


# -- plans ----------------------------------------------------------------------------------------


def test_plans_are_fenced_by_incarnation(run, mongo):
    plans = mongo.for_key(JobKey(scope="studio")).plans
    run(plans.save_plan("job", 1, _plan(3, "a")))
    run(plans.save_plan("job", 2, _plan(4, "b")))
    assert run(plans.delete_plan("job", 1)) == 3
    assert [p.step_id for p in run(whole_plan(plans, "job", 2))] == [f"b{n:05}" for n in range(4)]
    assert run(whole_plan(plans, "job", 1)) == []


def test_a_save_after_a_partial_attempt_replaces_it(run, mongo):
    key = JobKey(scope="studio")
    plans = mongo.for_key(key).plans
    collection = mongo.partition(key).plans
    original = collection.insert_many
    calls = []

    def fail_second_batch(documents, **kwargs):
        calls.append(len(documents))
        if len(calls) == 2:
            raise OperationFailure("disk full", code=14031)
        return original(documents, **kwargs)

    collection.insert_many = fail_second_batch
    with pytest.raises(OperationFailure):
        run(plans.save_plan("job", 1, _plan(2_500, "first")))
    assert collection.count_documents({"jobId": "job", "incarnation": 1}) == 1_000
    del collection.insert_many

    retry = _plan(1_200, "second")
    run(plans.save_plan("job", 1, retry))
    assert run(whole_plan(plans, "job", 1)) == retry
    assert collection.count_documents({"jobId": "job", "incarnation": 1}) == 1_200


def test_plans_are_written_in_batches_of_a_thousand(run, mongo):
    key = JobKey(scope="studio")
    collection = mongo.partition(key).plans
    original = collection.insert_many
    sizes = []

    def record(documents, **kwargs):
        sizes.append(len(documents))
        return original(documents, **kwargs)

    collection.insert_many = record
    run(mongo.for_key(key).plans.save_plan("job", 1, _plan(2_345)))
    assert sizes == [1_000, 1_000, 345]
    assert collection.find_one({"ordinal": 1_500})["_id"] == {
        "jobId": "job",
        "incarnation": 1,
        "ordinal": 1_500,
    }


def test_a_transient_failure_mid_plan_is_retried_without_duplicates(run, mongo, sleeps):
    key = JobKey(scope="studio")
    collection = mongo.partition(key).plans
    original = collection.insert_many
    calls = []

    def drop_once(documents, **kwargs):
        calls.append(len(documents))
        if len(calls) == 2:
            raise AutoReconnect("connection reset")
        return original(documents, **kwargs)

    collection.insert_many = drop_once
    plan = _plan(2_001)
    run(mongo.for_key(key).plans.save_plan("job", 4, plan))
    assert run(whole_plan(mongo.for_key(key).plans, "job", 4)) == plan
    assert collection.count_documents({"incarnation": 4}) == 2_001
    assert len(sleeps) == 1


# -- transient failures ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        AutoReconnect("reset"),
        NotPrimaryError("stepped down"),
        NetworkTimeout("slow"),
        ExecutionTimeout("maxTimeMS", code=50),
        WaitQueueTimeoutError("pool"),
        ServerSelectionTimeoutError("no primary"),
        ConnectionFailure("refused"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_connection_errors_and_timeouts_are_transient(mongo, error):
    assert mongo.is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        DuplicateKeyError("E11000", code=11000),
        OperationFailure("unauthorized", code=13),
        BulkWriteError({"writeErrors": [], "nInserted": 0}),
        VersionConflictError("lost", ["j"]),
        ValueError("bad id"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_refusals_are_not_transient(mongo, error):
    assert not mongo.is_transient(error)


def _flaky(collection, method: str, failures: int, error: BaseException) -> list[int]:
    original = getattr(collection, method)
    calls: list[int] = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) <= failures:
            raise error
        return original(*args, **kwargs)

    setattr(collection, method, flaky)
    return calls


def test_a_transient_error_is_retried_until_it_passes(run, mongo, registry, sleeps):
    key = JobKey(scope="studio")
    storage = mongo.for_key(key)
    run(storage.jobs.save(Factory(registry, key).job("j1")))
    calls = _flaky(mongo.partition(key).jobs, "find_one", 3, AutoReconnect("reset"))
    assert run(storage.jobs.get("j1")).id == "j1"
    assert len(calls) == 4
    assert len(sleeps) == 3


def test_a_transient_error_that_persists_becomes_storage_unavailable(run, mongo, sleeps):
    key = JobKey(scope="studio")
    storage = mongo.for_key(key)
    run(storage.jobs.count())
    calls = _flaky(mongo.partition(key).jobs, "count_documents", 99, NetworkTimeout("slow"))
    with pytest.raises(StorageUnavailableError, match="NetworkTimeout"):
        run(storage.jobs.count(JobQuery()))
    assert len(calls) == 4 and len(sleeps) == 3


def test_a_refusal_surfaces_at_once(run, mongo, sleeps):
    key = JobKey(scope="studio")
    storage = mongo.for_key(key)
    run(storage.jobs.count())
    calls = _flaky(
        mongo.partition(key).jobs, "find_one", 99, OperationFailure("unauthorized", code=13)
    )
    with pytest.raises(OperationFailure, match="unauthorized"):
        run(storage.jobs.find("j1"))
    assert len(calls) == 1 and sleeps == []


def test_a_job_write_applied_before_the_connection_dropped_is_not_a_conflict(run, mongo, registry):
    key = JobKey(scope="studio")
    storage = mongo.for_key(key)
    job = Factory(registry, key).job("j1")
    job.version = run(storage.jobs.save(job))
    collection = mongo.partition(key).jobs
    original = collection.replace_one
    calls = []

    def apply_then_drop(*args, **kwargs):
        calls.append(1)
        result = original(*args, **kwargs)
        if len(calls) == 1:
            raise AutoReconnect("reply lost")
        return result

    collection.replace_one = apply_then_drop
    job.details = "mine"
    assert run(storage.jobs.save(job)) == 2
    assert len(calls) == 2
    assert run(storage.jobs.get("j1")).details == "mine"
    with pytest.raises(VersionConflictError):
        run(storage.jobs.save(job))


def test_an_insert_applied_before_the_connection_dropped_is_not_a_conflict(run, mongo, registry):
    key = JobKey(scope="studio")
    storage = mongo.for_key(key)
    collection = mongo.partition(key).jobs
    original = collection.insert_one
    calls = []

    def apply_then_drop(document, **kwargs):
        calls.append(1)
        result = original(document, **kwargs)
        if len(calls) == 1:
            raise AutoReconnect("reply lost")
        return result

    collection.insert_one = apply_then_drop
    assert run(storage.jobs.save(Factory(registry, key).job("j1"))) == 1
    assert len(calls) == 2


def test_a_step_batch_applied_before_the_connection_dropped_is_not_a_conflict(run, mongo, registry):
    key = JobKey(scope="studio")
    storage = mongo.for_key(key)
    make = Factory(registry, key)
    steps = [make.step("j", f"s{n}") for n in range(4)]
    run(storage.steps.save_many(steps[:2]))
    steps[0].version = steps[1].version = 1
    partition = mongo.partition(key)
    original = partition.write_steps
    calls = []

    def apply_then_drop(operations):
        calls.append(1)
        details = original(operations)
        if len(calls) == 1:
            raise AutoReconnect("reply lost")
        return details

    partition.write_steps = apply_then_drop
    for step in steps:
        step.status = JobStepStatus.RUNNING
    assert run(storage.steps.save_many(steps)) == [2, 2, 1, 1]
    assert len(calls) == 2
    del partition.write_steps
    stored = run(storage.steps.get_for_job("j"))
    assert [(s.id, s.version, s.status) for s in stored] == [
        (f"s{n}", 2 if n < 2 else 1, JobStepStatus.RUNNING) for n in range(4)
    ]


def test_a_conflict_in_a_batch_still_writes_the_other_records(run, mongo, registry):
    key = JobKey(scope="studio")
    storage = mongo.for_key(key)
    make = Factory(registry, key)
    run(storage.steps.save(make.step("j", "old")))
    batch = [make.step("j", "new-1"), make.step("j", "old"), make.step("j", "new-2")]
    with pytest.raises(VersionConflictError) as raised:
        run(storage.steps.save_many(batch))
    assert raised.value.conflicts == ["old"]
    assert run(storage.steps.count_for_job("j")) == 3


def _server_like_bulk_write(collection):
    """A `bulk_write` answering as a server does (pymongo's request objects, its details)."""

    def bulk_write(requests, ordered=True):
        from pymongo import InsertOne

        assert ordered is False
        details = {"nInserted": 0, "nMatched": 0, "nModified": 0, "writeErrors": []}
        for index, request in enumerate(requests):
            if isinstance(request, InsertOne):
                try:
                    collection.insert_one(request._doc)
                    details["nInserted"] += 1
                except DuplicateKeyError as error:
                    details["writeErrors"].append({"index": index, "code": error.code})
            else:
                details["nMatched"] += collection.replace_one(
                    request._filter, request._doc
                ).matched_count
        if details["writeErrors"]:
            raise BulkWriteError({**details, "writeConcernErrors": []})

        class Result:
            bulk_api_result = details

        return Result()

    return bulk_write


def test_the_server_bulk_path_reports_inserts_and_replaces_that_lost(run, mongo, registry):
    key = JobKey(scope="studio")
    storage = mongo.for_key(key)
    make = Factory(registry, key)
    steps = [make.step("j", f"s{n}") for n in range(4)]
    run(storage.steps.save_many([*steps, make.step("j", "x", name="taken")]))
    for step in steps:
        step.version = 1
    run(storage.steps.save(steps[2].model_copy(update={"name": "moved on"})))
    partition = mongo.partition(key)
    partition.mock = False
    partition.steps.bulk_write = _server_like_bulk_write(partition.steps)
    batch = [make.step("j", "x"), *steps, make.step("j", "s9")]
    with pytest.raises(VersionConflictError) as raised:
        run(storage.steps.save_many(batch))
    assert raised.value.conflicts == ["x", "s2"]
    stored = {s.id: s for s in run(storage.steps.get_for_job("j"))}
    assert sorted(stored) == ["s0", "s1", "s2", "s3", "s9", "x"]
    assert [stored[i].version for i in ("s0", "s1", "s2", "s3", "s9")] == [2, 2, 2, 2, 1]
    assert stored["x"].name == "taken"
    assert stored["s2"].name == "moved on"
    fresh = [make.step("j", "s10"), make.step("j", "s11")]
    assert run(storage.steps.save_many(fresh)) == [1, 1]


def test_a_bulk_write_error_other_than_a_duplicate_surfaces(run, mongo, registry):
    key = JobKey(scope="studio")
    partition = mongo.partition(key)
    partition.mock = False
    failure = BulkWriteError({"writeErrors": [{"index": 0, "code": 2, "errmsg": "bad"}]})
    _flaky(partition.steps, "bulk_write", 99, failure)
    with pytest.raises(BulkWriteError):
        run(mongo.for_key(key).steps.save(Factory(registry, key).step("j", "s1")))


# -- providers and URLs ---------------------------------------------------------------------------


def test_providers_on_one_mongomock_url_share_data_and_other_urls_do_not(run, url, registry):
    key = JobKey(scope="studio")
    first = open_storage(url, registry=registry)
    second = open_storage(url, registry=registry)
    other_url = _mock_url()
    other = open_storage(other_url, registry=registry)
    run(first.for_key(key).jobs.save(Factory(registry, key).job("j1")))
    assert run(second.for_key(key).jobs.get("j1")).id == "j1"
    assert run(other.for_key(key).jobs.find("j1")) is None
    for provider in (first, second, other):
        run(provider.close())
    forget_mongomock_store(other_url)


def test_a_closed_mongomock_provider_leaves_the_shared_data(run, url, registry):
    key = JobKey(scope="studio")
    first = open_storage(url, registry=registry)
    run(first.for_key(key).jobs.save(Factory(registry, key).job("j1")))
    run(first.close())
    second = open_storage(url, registry=registry)
    assert run(second.for_key(key).jobs.get("j1")).id == "j1"
    run(second.close())


def test_mongomock_urls_need_mongomock(monkeypatch, registry):
    monkeypatch.setitem(sys.modules, "mongomock", None)
    with pytest.raises(ConfigurationError, match="mongomock"):
        open_storage(_mock_url(), registry=registry)


def test_the_password_never_shows(run, registry):
    url = "mongodb://user:s3cr3t@localhost:1/jobs?serverSelectionTimeoutMS=1"
    provider = open_storage(url, registry=registry)
    try:
        assert "s3cr3t" not in repr(provider)
        assert "s3cr3t" not in str(provider.url)
        assert "***" in repr(provider)
        assert provider.prefix == "jobs"
    finally:
        run(provider.close())


@pytest.mark.parametrize(
    "url",
    [
        "mongodb://user:s3cr3t@localhost:notaport/jobs",
        "mongodb://user:s3cr3t@/jobs",
        "mongodb+srv://user:s3cr3t@localhost:27017/jobs",
    ],
)
def test_an_unusable_url_is_a_configuration_error_without_the_password(url, registry):
    with pytest.raises(ConfigurationError) as raised:
        open_storage(url, registry=registry)
    assert "s3cr3t" not in str(raised.value)


def test_mongomock_keeps_the_capabilities_of_a_server():
    capabilities = MongoStorage.capabilities
    assert capabilities.external_step_plans and not capabilities.atomic_batches
    assert capabilities.shared_across_processes


# -- a real server --------------------------------------------------------------------------------

needs_server = pytest.mark.skipif(env(MONGODB_ENV) is None, reason=f"{MONGODB_ENV} is not set")


@pytest.fixture
def server(registry: TypeRegistry, run: Any) -> Iterator[MongoStorage]:
    provider = run(MongoServerSupport().open(None, registry))  # type: ignore[arg-type]
    try:
        yield provider
    finally:
        run(provider.close())


@pytest.mark.mongodb
@needs_server
def test_a_server_gets_the_named_database_and_its_indexes(run, server, registry):
    key = JobKey(scope=f"srv-{uuid.uuid4().hex[:8]}", namespace="tenant-a")
    storage = server.for_key(key)
    run(storage.jobs.save(Factory(registry, key).job("j1")))
    assert server.partition(key).database.name == database_name(server.prefix, key)
    assert _index_names(server.partition(key)) == EXPECTED_INDEXES


@pytest.mark.mongodb
@needs_server
def test_a_server_batch_with_a_conflict_writes_the_rest(run, server, registry):
    key = JobKey(scope=f"srv-{uuid.uuid4().hex[:8]}")
    storage = server.for_key(key)
    make = Factory(registry, key)
    steps = [make.step("j", f"s{n}") for n in range(5)]
    run(storage.steps.save_many(steps))
    for step in steps:
        step.version = 1
    run(storage.steps.save(steps[3].model_copy(update={"name": "moved on"})))
    with pytest.raises(VersionConflictError) as raised:
        run(storage.steps.save_many([*steps, make.step("j", "s0"), make.step("j", "s9")]))
    assert raised.value.conflicts == ["s3", "s0"]
    assert run(storage.steps.count_for_job("j")) == 6
