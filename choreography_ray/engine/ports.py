"""The ports the engine drives. The in-process runtime and the Ray runtime implement them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..jobs.state import JobKey
from .messages import SettledStops, StartResult, StepReport, StepStart, StopRequest, StopResult
from .step_types import StepTypes


@dataclass(slots=True)
class Dispatched:
    """Where a batch of starts went, and the results of those that did not simply start."""

    results: list[StartResult] = field(default_factory=list)
    """A start without one started; a dispatcher may also answer every start."""
    hosts: dict[str, list[str]] = field(default_factory=dict)
    """The ids of the steps each worker host took: the job sends a step back to the host that
    runs it (sticky dispatch), and knows whose steps to send again when a host is lost."""
    undelivered: list[StepStart] = field(default_factory=list)
    """Starts no host took (its call failed); `error` says why."""
    error: BaseException | None = None


class StepDispatcher(Protocol):
    """Carries a job's step starts and stops to the workers that run them."""

    async def start_steps(
        self,
        job_key: JobKey,
        job_id: str,
        job_type: str,
        starts: Sequence[StepStart],
        sticky: Mapping[str, str],
        step_types: StepTypes | None = None,
        points: float | None = None,
    ) -> Dispatched:
        """Send `starts` to worker hosts; a step named in `sticky` goes to that host while it
        is alive (it may run the step already), any other to any eligible host: one that
        runs the job's type and, when `step_types` says, the step's own type. A start that
        no host can take is undelivered, with a `NoEligibleJobWorker` that says why.
        `points`: the job's priority points for the workers' queues, when it has any."""
        ...

    async def prioritize(self, job_key: JobKey, job_id: str, points: float) -> None:
        """Tell every worker host the job's new priority points (its priority changed)."""
        ...

    async def stop_steps(self, request: StopRequest) -> StopResult: ...

    async def locate(self, job_key: JobKey, job_id: str) -> dict[str, str]:
        """Which worker host holds a run of which step of the job (performing, queued or
        settling), as far as the hosts that answer know: a new activation sends those steps
        back where they are, so none runs twice."""
        ...

    async def unheld(
        self, job_key: JobKey, job_id: str, by_host: Mapping[str, Sequence[str]]
    ) -> list[str]:
        """Of the steps each worker host took (`by_host`), those the host answers it holds no
        run of: the watchdog's proof that a run ended without storing its outcome. A host that
        does not answer holds all of its steps, as far as the job can tell."""
        ...

    async def give_up(self, job_key: JobKey, job_id: str, shares: Mapping[str, float]) -> list[str]:
        """Ask each worker host in `shares` to hand back that share of the job's runs it has
        queued and not started (nothing of them was written): the steps, to be sent to hosts
        that joined. A host that does not answer keeps its runs."""
        ...

    async def check_placement(
        self, job_key: JobKey, job_type: str, step_types: Sequence[str] = ()
    ) -> None:
        """Raise `NoEligibleJobWorker` (with the reason) when no worker qualifies for the
        steps of `job_type` now, or for one of `step_types`: asked before a job's steps are
        prepared."""
        ...

    async def stop_and_wait(self, request: StopRequest, within: float) -> SettledStops:
        """Stop the steps and wait up to `within` seconds for each to persist its outcome and
        answer (a drain). A step no worker runs is in neither list of the answer; a step a
        worker may run but that did not answer (its worker unreachable) is timed out."""
        ...


class JobReporter(Protocol):
    """Carries step outcomes back to their job's live activation."""

    async def report(self, job_key: JobKey, job_id: str, reports: Sequence[StepReport]) -> None: ...


class StepPeers(Protocol):
    """Asks another worker host which steps it runs, before a step is started twice."""

    async def running(
        self, host: str, job_key: JobKey, job_id: str, step_ids: Sequence[str]
    ) -> tuple[str, list[str]]:
        """That host's activation id and which of `step_ids` of the job it runs; raises when
        the host is gone or does not answer in time."""
        ...
