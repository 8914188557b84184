"""A step run leaves no reference cycle behind.

Garbage in a cycle waits for the cycle collector, which the hosts run rarely (200,000
allocations apart, `runtime.host_process.tune_gc`): a cycle per step made the worker host hold
every finished run until the next collection (449 MB at 100,000 steps) and made each
collection scan them. Counted here with the collector off: whatever `gc.collect()` finds
after a job is garbage that reference counting could not free.
"""

from __future__ import annotations

import gc

from choreography_ray.bench import BenchRequest, NoopFanOut
from choreography_ray.jobs import JobStatus

STEPS = 400


def test_a_job_of_no_op_steps_leaves_no_cycle_per_step(run, cluster):
    async def job(steps: int) -> JobStatus:
        result = await cluster.start(NoopFanOut, BenchRequest(steps=steps))
        state = await cluster.wait(result.job_id)
        assert state is not None
        return state.status

    assert run(job(20)) == JobStatus.COMPLETED_SUCCESSFULLY  # first-use caches filled
    gc.collect()
    gc.disable()
    try:
        assert run(job(STEPS)) == JobStatus.COMPLETED_SUCCESSFULLY
        found = gc.collect()
    finally:
        gc.enable()
    assert found < STEPS // 4, f"{found} objects in reference cycles after {STEPS} steps"
