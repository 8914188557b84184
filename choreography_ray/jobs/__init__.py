"""The author's side of the job system: statuses, state, options, errors and the type registry.

Nothing here imports Ray or a storage driver: declaring a job touches neither.
"""

from .adaptive import AdaptiveConcurrency
from .concurrency import ConcurrencyKey
from .errors import *  # noqa: F403
from .errors import __all__ as _errors_all
from .functions import JobFunction, StepFunction, job, step
from .job import (
    Job,
    JobInfo,
    JobStageFailureBehavior,
    JobStepDispatchContext,
    StepDetails,
    StepOutcome,
)
from .mapping import MapJob  # noqa: F401 - registered here, so every host runs map jobs
from .options import JobsOptions, parse_duration
from .rates import RateLimit
from .registry import Payload, TypeKind, TypeRegistry, default_registry, register_type
from .results import GATHER_LIMIT, ItemFailed, ItemResult, ResultsTooLargeError
from .retry import RetryPolicy
from .state import (
    DEFAULT_NAMESPACE,
    DEFAULT_SCOPE,
    JobKey,
    JobOwner,
    JobProgress,
    JobStageProgress,
    JobState,
    JobStepProgress,
    JobStepState,
    PlannedStep,
    Quarantine,
    StatusChange,
    StepError,
    StepLease,
)
from .status import (
    FAILED_STEP_STATUSES,
    FINAL_STEP_STATUSES,
    PREPARING_JOB_STATUSES,
    RUNNING_JOB_STATUSES,
    STOP_STATUSES,
    TERMINAL_JOB_STATUSES,
    JobStatus,
    JobStepStatus,
)
from .step import JobRequest, JobStep, StepCancelled, StepContext, StepFailed, StepRequest

__all__ = [
    *_errors_all,
    # authoring
    "AdaptiveConcurrency",
    "ConcurrencyKey",
    "Job",
    "JobFunction",
    "JobInfo",
    "JobRequest",
    "JobStageFailureBehavior",
    "JobStep",
    "JobStepDispatchContext",
    "StepCancelled",
    "StepContext",
    "StepDetails",
    "StepFailed",
    "StepFunction",
    "StepOutcome",
    "StepRequest",
    "job",
    "step",
    # results
    "GATHER_LIMIT",
    "ItemFailed",
    "ItemResult",
    "ResultsTooLargeError",
    # options
    "JobsOptions",
    "RateLimit",
    "RetryPolicy",
    "parse_duration",
    # registry
    "Payload",
    "TypeKind",
    "TypeRegistry",
    "default_registry",
    "register_type",
    # state
    "DEFAULT_NAMESPACE",
    "DEFAULT_SCOPE",
    "JobKey",
    "JobOwner",
    "JobProgress",
    "JobStageProgress",
    "JobState",
    "JobStepProgress",
    "JobStepState",
    "PlannedStep",
    "Quarantine",
    "StatusChange",
    "StepError",
    "StepLease",
    # statuses
    "FAILED_STEP_STATUSES",
    "FINAL_STEP_STATUSES",
    "PREPARING_JOB_STATUSES",
    "RUNNING_JOB_STATUSES",
    "STOP_STATUSES",
    "TERMINAL_JOB_STATUSES",
    "JobStatus",
    "JobStepStatus",
]
