"""Error codes keep the reference's values; exceptions carry them across process boundaries."""

from __future__ import annotations

import pickle
from enum import IntEnum

import pytest

from choreography_ray import jobs
from choreography_ray.jobs import errors
from choreography_ray.jobs.errors import (
    ActivationCallbackRejected,
    CannotResumeJobError,
    CannotRetryFailedError,
    ChoreographyError,
    ConfigurationError,
    InvalidOptionError,
    JobNotFoundError,
    JobOperationError,
    JobTypesError,
    MalformedRecordError,
    NoEligibleJobWorker,
    PrepareJobStepError,
    RecordNotFoundError,
    RemoveJobError,
    RemoveJobFailed,
    ResumeJobFailed,
    ResumeJobSuccess,
    RetryFailedRefused,
    StartJobError,
    StartJobFailed,
    StartJobStepError,
    StopJobError,
    StopJobFailed,
    StorageError,
    StorageJobError,
    StorageJobStepError,
    StorageUnavailableError,
    TypeAlreadyRegisteredError,
    TypeRegistryError,
    UnknownTypeError,
    UnsupportedStorageOperationError,
    VersionConflictError,
)

REFERENCE_CODES: dict[type[IntEnum], dict[str, int]] = {
    StartJobError: {
        "UNKNOWN": 0,
        "COULD_NOT_PREPARE_JOB_STEPS": 1,
        "FAILED_STARTING_SOME_JOB_STEPS": 2,
        "ALL_JOB_STEPS_FAILED_STARTING": 3,
        "NO_JOB_STEPS_TO_START": 4,
        "ALREADY_BEEN_PREPARED": 5,
        "ALREADY_COMPLETED": 6,
        "INVALID_STEP_PLAN": 7,  # ours
    },
    CannotResumeJobError: {
        "UNKNOWN": 0,
        "JOB_IS_NOT_PREPARED": 1,
        "JOB_CANNOT_BE_RESUMED": 2,
        "MISSING_STEP_PLAN": 3,  # ours
        "UNREADABLE_STEPS": 4,  # ours
    },
    CannotRetryFailedError: {  # ours
        "UNKNOWN": 0,
        "JOB_IS_NOT_FINISHED": 1,
        "NO_FAILED_STEPS": 2,
        "NOT_A_FAILED_STEP": 3,
        "UNREADABLE_STEPS": 4,
        "JOB_CANNOT_BE_RESUMED": 5,
    },
    ResumeJobSuccess: {"SUCCESS": 0, "JOB_IS_COMPLETED": 1, "JOB_ALREADY_RUNNING": 2},
    StopJobError: {
        "UNKNOWN": 0,
        "JOB_IS_COMPLETED": 1,
        "JOB_IS_NOT_RUNNING": 3,
        "COULD_NOT_PERSIST_STOP": 4,  # ours
    },
    RemoveJobError: {"UNKNOWN": 0, "JOB_IS_COMPLETED": 1, "JOB_IS_ALREADY_BEING_REMOVED": 2},
    StartJobStepError: {
        "UNKNOWN": 0,
        "NOT_PREPARED": 1,
        "ALREADY_STARTED": 2,
        "COMPLETED": 3,
        "UNRECOVERABLE_FAILED_STATE": 4,
    },
    PrepareJobStepError: {
        "UNKNOWN": 0,
        "WRONG_REQUEST_TYPE": 1,
        "CANNOT_PREPARE": 2,
        "UNEXPECTED_ERROR_PREPARING": 3,
    },
    StorageJobError: {
        "NOT_FOUND": 1,
        "TYPE_IS_NOT_A_JOB_STATE_TYPE": 2,
        "TYPE_IS_NOT_ASSOCIATED_WITH_A_JOB_TYPE": 3,
        "MALFORMED_RECORD": 4,  # ours
    },
    StorageJobStepError: {
        "NOT_FOUND": 1,
        "TYPE_IS_NOT_A_JOB_STEP_STATE_TYPE": 2,
        "MALFORMED_RECORD": 3,  # ours
    },
    ActivationCallbackRejected: {"NO_RUN": 0, "STALE_RUN": 1, "CLOSED": 2, "CANCELLED": 3},
}


@pytest.mark.parametrize("enum", list(REFERENCE_CODES), ids=lambda e: e.__name__)
def test_every_error_enum_has_exactly_the_reference_members_and_values(
    enum: type[IntEnum],
) -> None:
    assert {member.name: member.value for member in enum} == REFERENCE_CODES[enum]


def test_stop_job_error_leaves_value_two_unused_as_the_reference_does() -> None:
    with pytest.raises(ValueError):
        StopJobError(2)


def test_job_types_errors_name_the_three_lookup_failures() -> None:
    assert {m.name for m in JobTypesError} == {
        "NO_ASSOCIATED_JOB_TYPE",
        "JOB_TYPE_IS_NOT_SET",
        "COULD_NOT_FIND_TYPE",
    }


def test_every_exported_enum_in_the_errors_module_is_pinned_by_these_tests() -> None:
    exported = {
        value
        for name in errors.__all__
        if isinstance(value := getattr(errors, name), type) and issubclass(value, IntEnum)
    }
    assert exported - set(REFERENCE_CODES) <= {JobTypesError, errors.DrainJobResult}


EXCEPTIONS = [
    value
    for name in errors.__all__
    if isinstance(value := getattr(errors, name), type) and issubclass(value, BaseException)
]


@pytest.mark.parametrize("exception", EXCEPTIONS, ids=lambda e: e.__name__)
def test_every_exception_derives_from_choreography_error(exception: type[Exception]) -> None:
    assert issubclass(exception, ChoreographyError)


@pytest.mark.parametrize("exception", EXCEPTIONS, ids=lambda e: e.__name__)
def test_every_exception_is_exported_from_the_jobs_package(exception: type[Exception]) -> None:
    assert getattr(jobs, exception.__name__) is exception


@pytest.mark.parametrize(
    ("child", "parent"),
    [
        (InvalidOptionError, ConfigurationError),
        (TypeAlreadyRegisteredError, TypeRegistryError),
        (UnknownTypeError, TypeRegistryError),
        (StorageUnavailableError, StorageError),
        (RecordNotFoundError, StorageError),
        (VersionConflictError, StorageError),
        (MalformedRecordError, StorageError),
        (UnsupportedStorageOperationError, StorageError),
        (StartJobFailed, JobOperationError),
        (ResumeJobFailed, JobOperationError),
        (StopJobFailed, JobOperationError),
        (RemoveJobFailed, JobOperationError),
        (JobNotFoundError, JobOperationError),
    ],
)
def test_errors_group_under_their_family(child: type, parent: type) -> None:
    assert issubclass(child, parent)


def test_an_error_carries_its_message_and_code() -> None:
    error = StartJobFailed("the plan is invalid", code=StartJobError.INVALID_STEP_PLAN)
    assert error.message == "the plan is invalid"
    assert str(error) == "the plan is invalid"
    assert error.code is StartJobError.INVALID_STEP_PLAN


def test_an_error_without_a_code_has_none() -> None:
    assert StorageError("boom").code is None
    assert NoEligibleJobWorker("no node").code is None


def test_an_unknown_type_error_names_the_type_and_defaults_to_could_not_find_type() -> None:
    error = UnknownTypeError("some.module.Thing", "job")
    assert error.name == "some.module.Thing"
    assert error.kind == "job"
    assert "some.module.Thing" in str(error)
    assert error.code is JobTypesError.COULD_NOT_FIND_TYPE


def test_an_unknown_type_error_keeps_a_storage_code_it_is_given() -> None:
    code = StorageJobError.TYPE_IS_NOT_ASSOCIATED_WITH_A_JOB_TYPE
    assert UnknownTypeError("x", "job", code=code).code is code


def test_a_job_not_found_error_names_the_job_and_has_the_not_found_code() -> None:
    error = JobNotFoundError("job-42")
    assert error.job_id == "job-42"
    assert "job-42" in str(error)
    assert error.code is StorageJobError.NOT_FOUND


def test_an_invalid_option_error_names_the_setting_in_its_message() -> None:
    error = InvalidOptionError("step_stop_timeout", "must not be negative")
    assert error.setting == "step_stop_timeout"
    assert error.reason == "must not be negative"
    assert str(error).startswith("step_stop_timeout:")


def round_trip(error: Exception) -> Exception:
    return pickle.loads(pickle.dumps(error))


PICKLED = [
    pytest.param(ChoreographyError("plain"), {}, id="ChoreographyError"),
    pytest.param(
        StartJobFailed("bad plan", code=StartJobError.INVALID_STEP_PLAN), {}, id="StartJobFailed"
    ),
    pytest.param(
        ResumeJobFailed("no plan", code=CannotResumeJobError.MISSING_STEP_PLAN),
        {},
        id="ResumeJobFailed",
    ),
    pytest.param(
        RetryFailedRefused("none", code=CannotRetryFailedError.NO_FAILED_STEPS),
        {},
        id="RetryFailedRefused",
    ),
    pytest.param(
        StopJobFailed("not saved", code=StopJobError.COULD_NOT_PERSIST_STOP), {}, id="StopJobFailed"
    ),
    pytest.param(
        RemoveJobFailed("twice", code=RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED),
        {},
        id="RemoveJobFailed",
    ),
    pytest.param(
        InvalidOptionError("max_parallel_steps", "must be at least 1"),
        {"setting": "max_parallel_steps", "reason": "must be at least 1"},
        id="InvalidOptionError",
    ),
    pytest.param(
        VersionConflictError("lost the race", ["job-1", "step-2"]),
        {"conflicts": ["job-1", "step-2"]},
        id="VersionConflictError",
    ),
    pytest.param(
        UnknownTypeError("os.system", "request"),
        {"name": "os.system", "kind": "request"},
        id="UnknownTypeError",
    ),
    pytest.param(JobNotFoundError("job-9"), {"job_id": "job-9"}, id="JobNotFoundError"),
    pytest.param(
        MalformedRecordError("bad json", code=StorageJobStepError.MALFORMED_RECORD),
        {},
        id="MalformedRecordError",
    ),
    pytest.param(TypeAlreadyRegisteredError("taken"), {}, id="TypeAlreadyRegisteredError"),
    pytest.param(StorageUnavailableError("down"), {}, id="StorageUnavailableError"),
    pytest.param(NoEligibleJobWorker("no worker"), {}, id="NoEligibleJobWorker"),
]


@pytest.mark.parametrize(("error", "attributes"), PICKLED)
def test_an_error_survives_pickling_with_its_message_code_and_attributes(
    error: ChoreographyError, attributes: dict[str, object]
) -> None:
    copy = round_trip(error)
    assert type(copy) is type(error)
    assert copy.message == error.message
    assert str(copy) == str(error)
    assert copy.args == error.args
    assert copy.code is error.code
    for name, value in attributes.items():
        assert getattr(copy, name) == value


def test_extra_attributes_set_after_raising_survive_pickling() -> None:
    error = StorageError("boom")
    error.provider = "memory"  # type: ignore[attr-defined]
    assert round_trip(error).provider == "memory"  # type: ignore[attr-defined]


def test_a_pickled_error_can_be_raised_and_caught_by_its_family() -> None:
    copy = round_trip(VersionConflictError("lost", ["a"]))
    with pytest.raises(StorageError) as caught:
        raise copy
    assert caught.value.conflicts == ["a"]
