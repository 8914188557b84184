"""An explicit rehydration pass, as the client and the command line ask for one.

The manager's `rehydrate()` returns once the interrupted jobs are loaded; the jobs resume in the
background. A caller wants to know what the pass did, so this waits for the drain, but only
within a bound: a large backlog keeps resuming after the answer, which then says so.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from ..engine.clock import Clock
from ..jobs.errors import InvalidOptionError
from .rehydration import RehydrationReport


class Rehydratable(Protocol):
    async def rehydrate(self) -> asyncio.Task[Any]: ...


@dataclass(frozen=True)
class RehydrationSummary:
    """What one pass did, in counts of jobs; all zero (and `drained` false) when the drain was
    still under way at the bound."""

    drained: bool
    queued: int = 0
    resumed: int = 0
    finished_stops: int = 0
    skipped: int = 0
    failed: int = 0
    quarantined: int = 0
    """Jobs left alone because recovery gave up on them (`choreography jobs resume` one)."""

    def line(self) -> str:
        if not self.drained:
            return "rehydration under way; the interrupted jobs keep resuming in the background"
        quarantined = f", {self.quarantined} quarantined" if self.quarantined else ""
        return (
            f"rehydrated: {self.queued} interrupted, {self.resumed} resumed, "
            f"{self.finished_stops} stops finished, {self.skipped} skipped, {self.failed} failed"
            f"{quarantined}"
        )


def check_timeout(seconds: object) -> float:
    """The bound of an explicit pass, or a one-line error naming the bad value."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise InvalidOptionError(
            "timeout", f"must be a positive number of seconds, not {seconds!r}"
        )
    return float(seconds)


async def rehydrate_within(
    manager: Rehydratable, within: float, clock: Clock
) -> RehydrationSummary:
    """Run a pass on `manager` and summarize it once it drained, or after `within` seconds."""
    drain = await manager.rehydrate()
    timer = asyncio.get_running_loop().create_task(clock.sleep(within))
    try:
        await asyncio.wait({drain, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
    if not drain.done() or drain.cancelled():
        return RehydrationSummary(drained=False)
    report: RehydrationReport = drain.result()  # a failed drain raises its failure
    return RehydrationSummary(
        drained=True,
        queued=len(report.queued),
        resumed=len(report.resumed),
        finished_stops=len(report.finished_stops),
        skipped=len(report.skipped),
        failed=len(report.failed),
        quarantined=len(report.quarantined),
    )
