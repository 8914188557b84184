"""A job for the placement tests on several nodes, imported by the hosts by name: each step
records the node it ran on and how many steps of the job ran on that node at once, in files
of the test's directory (a side-effect table outside storage)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from choreography_ray.jobs import Job, JobStep, NoEligibleJobWorker, StepContext
from choreography_ray.jobs.job import StepOutcome
from choreography_ray.placement.directors import Candidate


class Spread(BaseModel):
    directory: str
    steps: int = 1
    n: int = 0
    hold: float = 0.3
    """Seconds each step stays running, so that steps of one node overlap."""
    release: str = ""
    """A file: when named, each step first waits until it exists."""


class CountedStep(JobStep[Spread, Spread, str], name="placement-tests.counted"):
    def initialize_state(self, request: Spread) -> Spread:
        return request

    async def perform(self, state: Spread, ctx: StepContext) -> str:
        import ray

        if state.release:
            await _until_made(state.release)
        node_id = ray.get_runtime_context().get_node_id()
        running = Path(state.directory) / "running" / node_id
        running.mkdir(parents=True, exist_ok=True)
        mine = running / str(state.n)
        # One worker host per node, one event loop: nothing runs between these lines.
        mine.touch()
        now = len(list(running.iterdir()))
        await asyncio.sleep(state.hold)
        mine.unlink()
        record = {"node": node_id, "running": now}
        (Path(state.directory) / f"{state.n}.json").write_text(json.dumps(record))
        return node_id


def _made(path: str) -> bool:
    return os.path.exists(path)


async def _until_made(path: str) -> None:
    """Wait until the test makes the file `path` (in another process: polled)."""
    while True:
        if _made(path):
            return
        await asyncio.sleep(0.05)


class SpreadJob(Job[Spread], name="placement-tests.spread"):
    keep_after_completed = True

    def prepare_steps(self, request: Spread):
        return [
            self.create_step(CountedStep, request.model_copy(update={"n": n}))
            for n in range(request.steps)
        ]


class TwoKindsJob(Job[Spread], name="placement-tests.two-kinds"):
    """Steps of two types: counted ones (numbered from 0), whose module every node imports,
    and picky ones (numbered from 100), whose module fails on nodes labelled
    `placement-tests/no-picky`. The job's own module imports everywhere."""

    keep_after_completed = True

    def prepare_steps(self, request: Spread):
        from .placement_picky import PickyStep  # prepared on a controller, where it imports

        return [
            *(
                self.create_step(CountedStep, request.model_copy(update={"n": n}))
                for n in range(request.steps)
            ),
            *(
                self.create_step(PickyStep, request.model_copy(update={"n": 100 + n}))
                for n in range(request.steps)
            ),
        ]


def records(directory: Path) -> dict[int, dict[str, object]]:
    """Each step's node and how many steps ran on that node as it started, by step number."""
    return {int(path.stem): json.loads(path.read_text()) for path in directory.glob("*.json")}


class OffsideJob(SpreadJob, name="placement-tests.offside"):
    """Kept off spot nodes by `SteadyForOffside`."""


class SteadyForOffside:
    """The step director of the placement tests: offside jobs only on nodes labelled
    spot=false; every other job anywhere."""

    def choose_workers(self, job_type: str, candidates):
        if job_type != OffsideJob.name:
            return [c.host for c in candidates]
        return [c.host for c in candidates if c.labels.get("spot") == "false"]


# -- when no worker qualifies ------------------------------------------------------------------

GATES_ENV = "PLACEMENT_TESTS_GATES"
"""A directory, set in the hosts' environment: a file there named after a job type closes
that type's gate (`GatedWorkers`)."""


def gates() -> Path:
    return Path(os.environ[GATES_ENV])


class GatedWorkers:
    """The step director of the no-worker tests: while a job type's gate is closed, no worker
    host qualifies for its steps; each refusal is noted in the file `<type>.refused`."""

    def choose_workers(self, job_type: str, candidates: Sequence[Candidate]) -> list[str]:
        root = os.environ.get(GATES_ENV)
        if root and (Path(root) / job_type).exists():
            with (Path(root) / f"{job_type}.refused").open("a") as noted:
                noted.write("refused\n")
            raise NoEligibleJobWorker(f"the gate of job type {job_type} is closed")
        return [c.host for c in candidates]


class ClosingJob(SpreadJob, name="placement-tests.closing"):
    """Closes its own gate once its steps are prepared, before they start: no worker qualifies
    as its prepared steps start. Notes each step outcome's error messages in
    `<job id>.outcomes`, one JSON list a line."""

    def on_before_starting_job_steps(self) -> None:
        (gates() / self.name).touch()

    def on_step_completed_or_stopped(self, outcome: StepOutcome) -> None:
        messages = outcome.error.messages if outcome.error is not None else []
        with (gates() / f"{self.info.id}.outcomes").open("a") as noted:
            noted.write(json.dumps(messages) + "\n")


class GatedJob(SpreadJob, name="placement-tests.gated"):
    """Its steps find a worker only while the test leaves its gate open."""
