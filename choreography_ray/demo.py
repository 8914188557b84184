"""The demo job: a two-stage fan-out, the project's main job (`choreography demo`).

Stage 0 fans out over shards that each "index" a range of numbers (a little CPU work, with a
checkpoint); stage 1 runs one step per shard again to "verify" it. The job is durable: stop the
demo with Ctrl-C and run it again, and it resumes the same job from storage.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel

from .jobs.job import Job, StepDetails
from .jobs.step import JobStep, StepContext


class DemoRequest(BaseModel):
    steps: int = 2000
    """Steps in all, split over the two stages."""
    work: int = 200
    """Hash rounds per step: a little CPU work each."""


class ShardRequest(BaseModel):
    shard: int
    work: int


class ShardState(BaseModel):
    shard: int
    work: int
    digest: str = ""


class IndexShard(JobStep[ShardRequest, ShardState, str], name="choreography.demo.index-shard"):
    def initialize_state(self, request: ShardRequest) -> ShardState:
        return ShardState(shard=request.shard, work=request.work)

    async def perform(self, state: ShardState, ctx: StepContext) -> str:
        digest = hashlib.sha256(str(state.shard).encode())
        for _ in range(state.work):
            digest = hashlib.sha256(digest.digest())
        state.digest = digest.hexdigest()
        ctx.checkpoint(state)
        return state.digest[:16]


class DemoJob(Job[DemoRequest], name="choreography.demo.fan-out"):
    keep_after_completed = True  # keep the outcome for `choreography jobs show`

    def prepare_steps(self, request: DemoRequest) -> list[StepDetails]:
        first = request.steps - request.steps // 2
        return [
            self.create_step(
                IndexShard,
                ShardRequest(shard=n, work=request.work),
                stage=0 if n < first else 1,
                name=f"{'index' if n < first else 'verify'}-{n}",
            )
            for n in range(request.steps)
        ]

    def details(self, request: DemoRequest) -> str:
        return f"demo fan-out of {request.steps} steps in two stages"
