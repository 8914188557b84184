"""Stopping runs and waiting, up to a deadline, for each to settle and persist its outcome:
what a drain asks of a worker (`StepWorker.stop_and_wait`).

A run that settles answers its outcome and reports it to the job as usual, once; one that
does not is answered as timed out, its callbacks are refused with Closed from then on, and it
reports once it settles. A stop already in progress is joined: the run is the same, and so is
its one outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from .clock import Clock, until_done
from .messages import SettledStops, StopRequest
from .run import StepRun
from .run_host import RunKey


def runs_to_stop(runs: Mapping[RunKey, StepRun], request: StopRequest) -> list[StepRun]:
    """The runs `request` names, of its execution or an earlier one."""
    return [
        run
        for key, run in runs.items()
        if key.job_key == request.job_key
        and key.job_id == request.job_id
        and (request.step_ids is None or key.step_id in request.step_ids)
        and run.generation <= request.generation
    ]


async def settled_within(runs: list[StepRun], clock: Clock, within: float) -> SettledStops:
    """Wait, up to `within` seconds, for stopped `runs` to settle and persist their outcomes:
    those that did answer with it; the others are answered as timed out, and their callbacks are
    refused from then on (each still reports once it settles)."""
    deadline = asyncio.ensure_future(clock.sleep(within))
    try:
        await until_done(deadline, lambda: [run.done for run in runs])
    finally:
        deadline.cancel()
    answer = SettledStops()
    for run in runs:
        if run.persisted is not None:
            answer.settled.append(run.persisted)
        else:  # not quiescent, or its outcome was not written: no answer of its own
            run.closed = True
            answer.timed_out.append(run.step_id)
    return answer
