"""Recovery reads a job's step records a bounded part at a time and lets each part go before
it reads far on (issue 23: a job's records read at once held about 8 KB a step decoded, eight
gigabytes for a million steps, in the controller host that recovered it)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

from choreography_ray.jobs import JobsOptions, JobStatus, ResumeJobSuccess
from choreography_ray.jobs.state import JobStepState
from choreography_ray.storage.protocols import StepPart
from choreography_ray.testing import InProcessCluster

from ..benchmark_modules import load_benchmark
from .fixtures import ScenarioJob, request, wrap_steps

PART = 3
KEYS = [f"k{n:02}" for n in range(11)]
DONE, FAILS, RUNNING = KEYS[:5], KEYS[5], KEYS[6:]


class PartReads:
    """Step storage whose parts hold `PART` records; before each part is read, how many records
    of the parts read earlier are still alive in memory."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.parts: list[int] = []
        self.alive_before_part: list[int] = []
        self.wholes = 0
        self._read: list[weakref.ref[JobStepState]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def get_all_for_job(self, *args: Any, **kwargs: Any) -> list[JobStepState]:
        self.wholes += 1
        return await self._inner.get_all_for_job(*args, **kwargs)

    async def part_for_job(self, job_id: str, after: str | None = None, take: int = 0) -> StepPart:
        gc.collect()
        self.alive_before_part.append(sum(ref() is not None for ref in self._read))
        part = await self._inner.part_for_job(job_id, after, PART)
        self.parts.append(len(part.steps) + len(part.unreadable))
        self._read.extend(weakref.ref(step) for step in part.steps)
        return part

    def reset(self) -> None:
        self.parts.clear()
        self.alive_before_part.clear()
        self._read.clear()


def _cluster(made: list[PartReads]) -> InProcessCluster:
    def make(steps: Any) -> PartReads:
        made.append(PartReads(steps))
        return made[-1]

    return InProcessCluster(
        options=JobsOptions(max_parallel_steps=len(KEYS)), wrap_storage=wrap_steps(make)
    )


def _crashed_midway(script: Any) -> None:
    """Five steps succeed, one fails for good, five are running at the crash."""
    script.behaviour[FAILS].fail = True
    script.behaviour[FAILS].non_retryable = True
    for key in RUNNING:
        script.behaviour[key].block = True


def test_a_recovered_job_is_counted_from_its_records_a_part_at_a_time(run, script):
    _crashed_midway(script)
    made: list[PartReads] = []

    async def scenario():
        async with _cluster(made) as cluster:
            result = await cluster.start(ScenarioJob, request(*KEYS))
            await cluster.settle()
            await cluster.crash()
            (reads,) = made
            reads.reset()
            for key in RUNNING:
                script.behaviour[key].block = False
            answer = await cluster.manager().resume(result.job_id)
            recovered = (list(reads.parts), list(reads.alive_before_part))
            final = await cluster.wait(result.job_id)
            # Its failed step runs again: found by reading the records a part at a time too.
            reads.reset()
            script.behaviour[FAILS].fail = False
            rerun = await cluster.retry_failed(result.job_id)
            again = (list(reads.parts), list(reads.alive_before_part))
            return answer, recovered, final, rerun, again, await cluster.wait(result.job_id), reads

    answer, recovered, final, rerun, again, last, reads = run(scenario())
    assert answer == ResumeJobSuccess.SUCCESS
    # Eleven records in parts of three; the last part is the one shorter than asked.
    assert recovered[0] == [3, 3, 3, 2]
    # A part is let go as the next is read: at most the one before it is still alive.
    assert max(recovered[1]) <= PART, recovered[1]
    assert reads.wholes == 0
    assert final.status == JobStatus.COMPLETED_WITH_FAILURES
    assert (final.progress.successful_steps, final.progress.failed_steps) == (10, 1)
    for key in DONE:
        assert script.ran(key) == 1, key  # counted from its record, never run again
    for key in RUNNING:
        assert script.ran(key) == 2, key  # interrupted: runs again under its identity
    assert len(rerun) == 1
    # Read twice: to find the failed steps, then to count the job again as it resumes.
    assert again[0] == [3, 3, 3, 2] * 2 and max(again[1]) <= PART
    assert last.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert last.progress.successful_steps == len(KEYS)


def test_a_recovered_job_stopped_counts_its_stops_from_its_records_a_part_at_a_time(run, script):
    _crashed_midway(script)
    made: list[PartReads] = []

    async def scenario():
        async with _cluster(made) as cluster:
            result = await cluster.start(ScenarioJob, request(*KEYS))
            await cluster.settle()
            await cluster.crash()
            (reads,) = made
            reads.reset()
            await cluster.manager().stop(result.job_id)
            await cluster.settle()
            stopped = await cluster.storage().jobs.get(result.job_id)
            return reads, stopped

    reads, stopped = run(scenario())
    assert reads.parts[:4] == [3, 3, 3, 2]
    assert max(reads.alive_before_part) <= PART, reads.alive_before_part
    assert reads.wholes == 0
    assert stopped.status == JobStatus.STOPPED
    progress = stopped.progress
    assert (progress.successful_steps, progress.failed_steps) == (5, 1)
    assert progress.stopped_steps == len(RUNNING)


def test_the_recount_memory_benchmark_recovers_a_job_counting_each_step_once(run, tmp_path):
    recount = load_benchmark("recount_memory")
    line = run(recount.measure(300, str(tmp_path)))
    assert line.startswith("300 records: JOB_IS_COMPLETED, RSS before ")
