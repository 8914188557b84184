"""The ports the engine drives. The in-process runtime and the Ray runtime implement them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..jobs.state import JobKey
from .messages import StartResult, StepReport, StepStart, StopRequest, StopResult


class StepDispatcher(Protocol):
    """Carries a job's step starts and stops to the workers that run them."""

    async def start_steps(
        self, job_key: JobKey, job_id: str, job_type: str, starts: Sequence[StepStart]
    ) -> list[StartResult]:
        """Results of the starts that did not simply start (a start without one started);
        a dispatcher may also answer every start."""
        ...

    async def stop_steps(self, request: StopRequest) -> StopResult: ...


class JobReporter(Protocol):
    """Carries step outcomes back to their job's live activation."""

    async def report(self, job_key: JobKey, job_id: str, reports: Sequence[StepReport]) -> None: ...
