"""Jobs for the scheduling tests on Ray, imported by the hosts by name: each step records
when it began in a file of its own (a side-effect table outside storage), then works a while."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pydantic import BaseModel

from choreography_ray.jobs import Job, JobStep, StepContext


class Timed(BaseModel):
    directory: str
    tag: str
    steps: int = 1
    seconds: float = 0.05
    n: int = 0


class RecordStart(JobStep[Timed, Timed, int], name="scheduling-tests.record-start"):
    def initialize_state(self, request: Timed) -> Timed:
        return request

    async def perform(self, state: Timed, ctx: StepContext) -> int:
        (Path(state.directory) / f"{state.tag}-{state.n}").write_text(repr(time.time()))
        await asyncio.sleep(state.seconds)
        return state.n


class TimedJob(Job[Timed], name="scheduling-tests.timed"):
    keep_after_completed = True

    def prepare_steps(self, request: Timed):
        return [
            self.create_step(RecordStart, request.model_copy(update={"n": n}))
            for n in range(request.steps)
        ]


def starts(directory: Path) -> list[str]:
    """The tag of every step that began, in the order they began."""
    found = [(float(path.read_text()), path.name.rsplit("-", 1)[0]) for path in directory.iterdir()]
    return [tag for _, tag in sorted(found)]
