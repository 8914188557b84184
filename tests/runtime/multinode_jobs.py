"""A job for the multi-node tests, imported by the hosts by name: each step writes the id of
the Ray node it ran on into a file of its own, a side-effect table outside storage."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from choreography_ray.jobs import Job, JobStep, StepContext


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
