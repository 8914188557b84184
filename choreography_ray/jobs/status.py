"""Job and step statuses.

The integer values are persisted, so they never change: a record written by any release reads
back with the same meaning.
"""

from __future__ import annotations

from enum import IntEnum


class JobStatus(IntEnum):
    """Where a job is in its life."""

    NONE = 0
    PREPARING_JOB = 1
    PREPARING_STEPS = 2
    STARTING_STEPS = 3
    RUNNING = 4
    COMPLETED_SUCCESSFULLY = 5
    COMPLETED_WITH_FAILURES = 6
    STOPPED = 7
    FAILED = 8
    REMOVING = 9

    @property
    def is_running(self) -> bool:
        """Preparing, starting or running: the statuses recovery treats as interrupted."""
        return self in RUNNING_JOB_STATUSES

    @property
    def is_terminal(self) -> bool:
        """Completed or failed: nothing more will happen, and retention may delete the job."""
        return self in TERMINAL_JOB_STATUSES


class JobStepStatus(IntEnum):
    """Where a step is in its life."""

    UNKNOWN = 0
    SCHEDULED = 1
    RUNNING = 2
    COMPLETED_SUCCESSFULLY = 3
    COMPLETED_WITH_FAILURE = 4
    STOPPED = 5
    FAILED = 6
    REMOVING = 7
    UNREACHABLE = 8

    @property
    def is_final(self) -> bool:
        """An outcome the job counts: success, failure or unreachable."""
        return self in FINAL_STEP_STATUSES

    @property
    def is_failure(self) -> bool:
        """Statuses whose records stay queryable after the job completes."""
        return self in FAILED_STEP_STATUSES


RUNNING_JOB_STATUSES: frozenset[JobStatus] = frozenset(
    {
        JobStatus.PREPARING_JOB,
        JobStatus.PREPARING_STEPS,
        JobStatus.STARTING_STEPS,
        JobStatus.RUNNING,
    }
)
"""Statuses of a job that was doing work; after a crash these are the interrupted jobs."""

PREPARING_JOB_STATUSES: frozenset[JobStatus] = frozenset(
    {JobStatus.PREPARING_JOB, JobStatus.PREPARING_STEPS}
)
"""Statuses dead-job cleanup looks at."""

TERMINAL_JOB_STATUSES: frozenset[JobStatus] = frozenset(
    {JobStatus.COMPLETED_SUCCESSFULLY, JobStatus.COMPLETED_WITH_FAILURES, JobStatus.FAILED}
)
"""Statuses retention may delete and `remove_terminal` accepts."""

STOP_STATUSES: frozenset[JobStatus] = frozenset({JobStatus.STOPPED, JobStatus.REMOVING})
"""Statuses whose stop may still need finishing after a crash."""

FINAL_STEP_STATUSES: frozenset[JobStepStatus] = frozenset(
    {
        JobStepStatus.COMPLETED_SUCCESSFULLY,
        JobStepStatus.COMPLETED_WITH_FAILURE,
        JobStepStatus.FAILED,
        JobStepStatus.UNREACHABLE,
    }
)

FAILED_STEP_STATUSES: frozenset[JobStepStatus] = frozenset(
    {JobStepStatus.COMPLETED_WITH_FAILURE, JobStepStatus.FAILED}
)
