"""Error codes and the one exception hierarchy that carries them.

Every operation that can be refused answers with a code from one of the enums below; the
integer values follow the reference system so that codes read the same in logs of both. Our
additions take the next free value. Exceptions derive from `ChoreographyError`, and those that
stand for a refused operation carry the code in `code`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

__all__ = [
    "ActivationCallbackRejected",
    "CannotResumeJobError",
    "CannotRetryFailedError",
    "ChoreographyError",
    "ClusterAuthenticationError",
    "ClusterUnreachableError",
    "ConfigurationError",
    "DrainJobResult",
    "DrainOutcome",
    "HostError",
    "InvalidJobIdError",
    "InvalidOperationError",
    "InvalidOptionError",
    "InvalidRequestError",
    "JobNotFoundError",
    "JobOperationError",
    "JobQuarantinedError",
    "JobTypesError",
    "MalformedRecordError",
    "NoEligibleJobWorker",
    "OwnedElsewhereError",
    "PrepareJobStepError",
    "RecordNotFoundError",
    "RemoveJobError",
    "RemoveJobFailed",
    "ResumeJobFailed",
    "ResumeJobSuccess",
    "RetryFailedRefused",
    "ShuttingDownError",
    "StartJobError",
    "StartJobFailed",
    "StartJobStepError",
    "StopJobError",
    "StopJobFailed",
    "StorageError",
    "StorageJobError",
    "StorageJobStepError",
    "StorageUnavailableError",
    "TypeAlreadyRegisteredError",
    "TypeRegistryError",
    "UnknownTypeError",
    "UnreadableStepsError",
    "UnsupportedStorageOperationError",
    "VersionConflictError",
]


class StartJobError(IntEnum):
    UNKNOWN = 0
    COULD_NOT_PREPARE_JOB_STEPS = 1
    FAILED_STARTING_SOME_JOB_STEPS = 2
    ALL_JOB_STEPS_FAILED_STARTING = 3
    NO_JOB_STEPS_TO_START = 4
    ALREADY_BEEN_PREPARED = 5
    ALREADY_COMPLETED = 6
    INVALID_STEP_PLAN = 7


class CannotResumeJobError(IntEnum):
    UNKNOWN = 0
    JOB_IS_NOT_PREPARED = 1
    JOB_CANNOT_BE_RESUMED = 2
    MISSING_STEP_PLAN = 3
    UNREADABLE_STEPS = 4


class CannotRetryFailedError(IntEnum):
    """Why `retry_failed` refused: nothing it refuses changes the job."""

    UNKNOWN = 0
    JOB_IS_NOT_FINISHED = 1
    """Neither completed with failures nor stopped with its stop finished."""
    NO_FAILED_STEPS = 2
    NOT_A_FAILED_STEP = 3
    """A step named in `steps` is not a failed step of the job."""
    UNREADABLE_STEPS = 4
    JOB_CANNOT_BE_RESUMED = 5


class ResumeJobSuccess(IntEnum):
    SUCCESS = 0
    JOB_IS_COMPLETED = 1
    JOB_ALREADY_RUNNING = 2


class StopJobError(IntEnum):
    UNKNOWN = 0
    JOB_IS_COMPLETED = 1
    JOB_IS_NOT_RUNNING = 3
    COULD_NOT_PERSIST_STOP = 4


class RemoveJobError(IntEnum):
    UNKNOWN = 0
    JOB_IS_COMPLETED = 1
    JOB_IS_ALREADY_BEING_REMOVED = 2


class StartJobStepError(IntEnum):
    UNKNOWN = 0
    NOT_PREPARED = 1
    ALREADY_STARTED = 2
    COMPLETED = 3
    UNRECOVERABLE_FAILED_STATE = 4


class PrepareJobStepError(IntEnum):
    UNKNOWN = 0
    WRONG_REQUEST_TYPE = 1
    CANNOT_PREPARE = 2
    UNEXPECTED_ERROR_PREPARING = 3


class StorageJobError(IntEnum):
    """Why storage could not hand out a job record."""

    NOT_FOUND = 1
    TYPE_IS_NOT_A_JOB_STATE_TYPE = 2
    TYPE_IS_NOT_ASSOCIATED_WITH_A_JOB_TYPE = 3
    MALFORMED_RECORD = 4


class StorageJobStepError(IntEnum):
    """Why storage could not hand out a step record."""

    NOT_FOUND = 1
    TYPE_IS_NOT_A_JOB_STEP_STATE_TYPE = 2
    MALFORMED_RECORD = 3


class JobTypesError(IntEnum):
    NO_ASSOCIATED_JOB_TYPE = 0
    JOB_TYPE_IS_NOT_SET = 1
    COULD_NOT_FIND_TYPE = 2


class ActivationCallbackRejected(IntEnum):
    """Why a callback from step work (checkpoint, progress) was refused."""

    NO_RUN = 0
    STALE_RUN = 1
    CLOSED = 2
    CANCELLED = 3


class DrainJobResult(IntEnum):
    DRAINED = 0
    TIMED_OUT = 1
    COMPLETED = 2
    NOT_FOUND = 3
    UNKNOWN_JOB_TYPE = 4


@dataclass(frozen=True)
class DrainOutcome:
    """What a drain answers: its result, the steps that answered with their persisted outcome,
    and the steps that did not answer in time (each still reports once its work settles)."""

    result: DrainJobResult
    drained: tuple[str, ...] = ()
    not_drained: tuple[str, ...] = ()

    @property
    def is_drained(self) -> bool:
        return self.result == DrainJobResult.DRAINED


# --------------------------------------------------------------------------------------------
# Exceptions


class ChoreographyError(Exception):
    """Root of every error this package raises on purpose.

    `code` is the enum member that says why, where the operation has one.
    """

    code: IntEnum | None = None

    def __init__(self, message: str, *, code: IntEnum | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross Ray process boundaries; keep the code and the message through that.
        return (_rebuild_error, (type(self), self.message, self.code, self.__dict__))


def _rebuild_error(
    cls: type[ChoreographyError], message: str, code: IntEnum | None, attrs: dict[str, Any]
) -> ChoreographyError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(attrs)
    error.message = message
    error.code = code
    return error


class ConfigurationError(ChoreographyError):
    """Raised when an option, a URL or a configuration file is not usable."""


class InvalidOptionError(ConfigurationError):
    """Raised when a setting has a bad value; `setting` names it."""

    def __init__(self, setting: str, reason: str) -> None:
        super().__init__(f"{setting}: {reason}")
        self.setting = setting
        self.reason = reason


class TypeRegistryError(ChoreographyError):
    """Raised when a type cannot be registered or resolved."""


class TypeAlreadyRegisteredError(TypeRegistryError):
    """Raised when a second class claims a name that is taken (JobTypeAlreadyExists)."""


class UnknownTypeError(TypeRegistryError):
    """Raised when a stored or requested type name is not in the registry.

    The name is never imported: only registered classes can be named by stored data.
    """

    def __init__(self, name: str, kind: str | None = None, *, code: IntEnum | None = None) -> None:
        what = f"{kind} type" if kind else "type"
        super().__init__(
            f"unknown {what} {name!r}: no class is registered under that name "
            "(import the module that defines it before use)",
            code=code if code is not None else JobTypesError.COULD_NOT_FIND_TYPE,
        )
        self.name = name
        self.kind = kind


class StorageError(ChoreographyError):
    """Raised when storage fails or refuses an operation."""


class StorageUnavailableError(StorageError):
    """Raised when storage cannot be reached, after transient retries ran out."""


class RecordNotFoundError(StorageError):
    """Raised when a job or step record does not exist in the given scope and namespace."""


class VersionConflictError(StorageError):
    """Raised when a compare-and-set write lost: the stored version is not the one read.

    `conflicts` lists the ids of the records that were not written; where a provider's batches
    are not atomic, `applied` maps the ids of records that were written to their new versions.
    """

    def __init__(
        self, message: str, conflicts: list[str], applied: dict[str, int] | None = None
    ) -> None:
        super().__init__(message)
        self.conflicts = conflicts
        self.applied = applied or {}


class MalformedRecordError(StorageError):
    """Raised when a stored record cannot be read back: bad JSON, or a type it does not fit."""


class UnreadableStepsError(StorageError):
    """Raised by a strict load of a job's steps when some of its step records cannot be read.

    A job is never resumed, recovered, counted or completed from part of its steps.
    `unreadable` maps each such step id to why it cannot be read, in storage order.
    """

    SHOWN = 3
    """How many step ids the message names."""

    def __init__(self, job_id: str, unreadable: dict[str, str]) -> None:
        shown = "; ".join(
            f"{step_id!r}: {why}" for step_id, why in list(unreadable.items())[: self.SHOWN]
        )
        more = f"; and {len(unreadable) - self.SHOWN} more" if len(unreadable) > self.SHOWN else ""
        super().__init__(
            f"job {job_id!r}: {len(unreadable)} step record(s) cannot be read ({shown}{more})"
        )
        self.job_id = job_id
        self.unreadable = unreadable


class UnsupportedStorageOperationError(StorageError):
    """Raised when a provider does not offer an operation, such as external step plans."""


class InvalidRequestError(ChoreographyError, ValueError):
    """Raised when a request cannot be stored as given: it would not read back the same."""


class JobOperationError(ChoreographyError):
    """Raised when a job refuses an operation; `code` says why."""


class StartJobFailed(JobOperationError):
    code: StartJobError


class ResumeJobFailed(JobOperationError):
    code: CannotResumeJobError


class RetryFailedRefused(JobOperationError):
    code: CannotRetryFailedError


class StopJobFailed(JobOperationError):
    code: StopJobError


class RemoveJobFailed(JobOperationError):
    code: RemoveJobError


class JobNotFoundError(JobOperationError):
    """Raised when no job with the given id exists in the scope and namespace."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job with id {job_id!r}", code=StorageJobError.NOT_FOUND)
        self.job_id = job_id


class OwnedElsewhereError(ChoreographyError):
    """Raised when a job's live activation is on another host; `host` names it."""

    def __init__(self, job_id: str, host: str, epoch: int) -> None:
        super().__init__(f"job {job_id!r} is active on host {host!r}")
        self.job_id = job_id
        self.host = host
        self.epoch = epoch


class JobQuarantinedError(ChoreographyError):
    """Raised when recovery, or a worker's report, would activate a job that recovery gave up
    on (`max_recovery_attempts`); `reason` says why. An explicit resume takes it out."""

    def __init__(self, job_id: str, reason: str) -> None:
        super().__init__(
            f"job {job_id!r} is quarantined: {reason}; `choreography jobs resume {job_id}` "
            "takes it out"
        )
        self.job_id = job_id
        self.reason = reason


class ShuttingDownError(ChoreographyError):
    """Raised when a host or manager that is shutting down is asked to take on work."""


class NoEligibleJobWorker(ChoreographyError):
    """Raised by a placement director when no node qualifies for a job or step."""


class InvalidJobIdError(ChoreographyError, ValueError):
    """Raised before any remote call when a job id cannot name a job (empty, too long, a
    control character, a path separator, surrounding whitespace)."""

    def __init__(self, job_id: object, reason: str) -> None:
        super().__init__(f"job id {job_id!r} {reason}")
        self.job_id = job_id
        self.reason = reason


class AmbiguousJobIdError(ChoreographyError, ValueError):
    """Raised when a job id prefix given to a command starts the ids of several jobs; `matches`
    lists some of them."""

    def __init__(self, prefix: str, matches: list[str], more: bool) -> None:
        listed = ", ".join(matches) + (", …" if more else "")
        super().__init__(
            f"{prefix!r} starts the ids of several jobs: {listed}; give more of the id"
        )
        self.prefix = prefix
        self.matches = matches


class HostError(ChoreographyError):
    """Raised when a host actor failed a call with an error that is not one of ours, or died
    during it; the message is one line, the host's traceback stays in its log."""


class InvalidOperationError(ChoreographyError, TypeError):
    """Raised by a host asked to perform something that is not one of its typed operations: a
    controller host given anything but a client's request (`runtime.operations`), the storage
    actor asked for a method the storage protocols do not declare, a request that a host of
    the previous release cannot perform."""


class ClusterAuthenticationError(ConfigurationError):
    """Raised when the Ray cluster refuses this process because it uses token authentication
    and this process has no (or another) token."""


class ClusterUnreachableError(ConfigurationError):
    """Raised when no Ray cluster answers at the address given (or none runs on this machine
    for "auto")."""
