"""Jobs for the multi-node tests, imported by the hosts by name: each step writes the id of
the Ray node it ran on into a file of its own, a side-effect table outside storage."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from choreography_ray.jobs import Job, JobStep, StepContext, step


class Where(BaseModel):
    directory: str
    steps: int = 1
    n: int = 0


class RecordNode(JobStep[Where, Where, str], name="multinode-tests.record-node"):
    def initialize_state(self, request: Where) -> Where:
        return request

    async def perform(self, state: Where, ctx: StepContext) -> str:
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        (Path(state.directory) / str(state.n)).write_text(node_id)
        return node_id


class WhereJob(Job[Where], name="multinode-tests.where"):
    keep_after_completed = True

    def prepare_steps(self, request: Where):
        return [
            self.create_step(RecordNode, request.model_copy(update={"n": n}))
            for n in range(request.steps)
        ]


def nodes_recorded(directory: Path) -> dict[int, str]:
    """The node each step ran on, by step number."""
    return {int(path.name): path.read_text() for path in directory.iterdir()}


class Held(BaseModel):
    directory: str
    n: int
    held: bool = False


@step(name="multinode-tests.record-item")
async def record_item(item: Held) -> str:
    """Record each run of the item in a file of its own (`<n>.<run>`, holding the node id);
    a held item then waits for a `release` file (at most a minute) before it completes."""
    import asyncio
    import time
    import uuid

    import ray

    node_id = ray.get_runtime_context().get_node_id()
    directory = Path(item.directory)
    (directory / f"{item.n}.{uuid.uuid4().hex}").write_text(node_id)
    deadline = time.monotonic() + 60
    while item.held and not (directory / "release").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"item {item.n} was never released")
        await asyncio.sleep(0.05)
    return node_id


def runs_recorded(directory: Path) -> dict[int, list[str]]:
    """The nodes each item ran on, one entry per run, by item."""
    runs: dict[int, list[str]] = {}
    for path in directory.iterdir():
        if path.name != "release":
            runs.setdefault(int(path.name.split(".")[0]), []).append(path.read_text())
    return runs
