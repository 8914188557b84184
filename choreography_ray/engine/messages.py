"""What jobs and workers say to each other. Plain values: they cross process boundaries.

A job dispatches `StepStart`s to a worker in batches and hears back `StepReport`s in batches.
Every message carries the job's execution generation, so a report of an earlier execution is
never mistaken for one of the current.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, NamedTuple

from ..jobs.errors import StartJobStepError
from ..jobs.state import JobKey, StepError
from ..jobs.status import JobStepStatus


class StepStart(NamedTuple):
    """Tuples, not dataclasses: thousands cross a process boundary per second."""

    step_id: str
    generation: int
    attempt: int = 1


class StartOutcome(IntEnum):
    STARTED = 0
    ALREADY_STARTED = 1
    COMPLETED = 2
    FAILED = 3


class StartResult(NamedTuple):
    step_id: str
    outcome: StartOutcome
    error: StartJobStepError | None = None
    reason: str = ""
    report: StepReport | None = None
    """For a step found already finished: its stored outcome, so the job can count it."""


class StepReport(NamedTuple):
    """A step's outcome, already persisted by the worker when it is sent."""

    step_id: str
    status: JobStepStatus
    generation: int
    attempt: int
    stage: int = 0
    name: str = ""
    result: tuple[str, Any] | None = None
    """The result (or partial result) as (type name, JSON data): plain data crosses processes
    far faster than a pydantic model."""
    error: StepError | None = None
    non_retryable: bool = False


class StopRequest(NamedTuple):
    job_key: JobKey
    job_id: str
    generation: int
    step_ids: tuple[str, ...] | None = None
    """None stops every step of the job the worker runs."""
    removing: bool = False


@dataclass(slots=True)
class StopResult:
    stopping: list[str] = field(default_factory=list)
    """Steps whose runs were told to stop; each reports once it settles."""
    not_running: list[str] = field(default_factory=list)
