"""Storage that goes down mid-job and comes back: a state the job waits out, not a loss.

While every storage call fails, runs that finish keep their outcome and write it once storage
answers again; the worker starts no new run meanwhile, so nothing performs for an outcome that
cannot be stored; and when storage is back the job finishes with every step run once and
counted once — whether the outage was short (the job's own record was never written during
it) or long (the job's writes failed too and its activation was let go).
"""

from __future__ import annotations

import asyncio

import pytest

from choreography_ray.engine.clock import settle
from choreography_ray.engine.manager import READ_SECONDS
from choreography_ray.jobs import JobsOptions, JobStatus, JobStepStatus
from choreography_ray.jobs.errors import StorageUnavailableError
from choreography_ray.storage.protocols import JobsStorage
from choreography_ray.testing import InProcessCluster, StorageOutage

from .fixtures import ScenarioJob, request, wrap_steps

KEYS = [f"k{n:02d}" for n in range(12)]
WINDOW = 4


@pytest.fixture
def outage() -> StorageOutage:
    return StorageOutage()


@pytest.fixture
def cluster(script, run, outage):
    cluster = InProcessCluster(
        options=JobsOptions(max_parallel_steps=WINDOW), wrap_storage=outage.wrap
    )
    run(cluster.provider.initialize())
    yield cluster
    run(cluster.close())


async def _start_blocked(cluster: InProcessCluster, script) -> str:
    for key in KEYS:
        script.behaviour[key].block = True
    result = await cluster.start(ScenarioJob, request(*KEYS))
    assert result.succeeded
    await cluster.settle()
    assert len(script.runs) == WINDOW
    return result.job_id


async def _finish(cluster: InProcessCluster, job_id: str, seconds: int = 180) -> None:
    for _ in range(seconds):
        await cluster.advance(1)
        state = await cluster.storage().jobs.find(job_id)
        if state is not None and state.status.is_terminal:
            return


@pytest.mark.parametrize("minutes_down", [0, 3], ids=["short", "long"])
def test_outcomes_finished_in_an_outage_are_stored_once_it_ends(
    run, script, cluster, outage, minutes_down
):
    """The seed's "nothing must leave a job idle", against a store that went away: in a short
    outage the job's activation kept running and heard nothing; in a long one its own writes
    failed and it was let go. Either way it finishes, each step performed once."""

    async def scenario() -> None:
        job_id = await _start_blocked(cluster, script)
        outage.begin()
        script.release(KEYS[0])  # its outcome's write fails: the worker learns of the outage
        await cluster.settle()
        assert cluster.worker.writers.storage_down
        script.release(*KEYS)  # every step may finish now; none can store its outcome
        await cluster.settle()
        for _ in range(minutes_down * 60):
            await cluster.advance(1)
        # The runs performing when the outage was found finished; none started after (the
        # slot k00 freed went to the next run before its write had failed).
        assert len(script.runs) == WINDOW + 1
        assert outage.failed_writes > 0
        outage.end()
        await _finish(cluster, job_id)
        state = await cluster.storage().jobs.get(job_id)
        assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
        assert state.progress.successful_steps == len(KEYS)
        assert sorted(key for key, _ in script.runs) == KEYS  # every step performed once
        steps = await cluster.storage().steps.get_for_job(job_id)
        assert {s.status for s in steps} == {JobStepStatus.COMPLETED_SUCCESSFULLY}

    run(scenario())


def test_a_worker_starts_nothing_while_its_outcomes_wait_for_storage(run, script, cluster, outage):
    """The queued runs wait: starting them would perform work whose outcome cannot be stored,
    and that would run again if the worker were lost before storage came back."""

    async def scenario() -> None:
        job_id = await _start_blocked(cluster, script)
        outage.begin()
        script.release(KEYS[0])
        await cluster.settle()
        worker = cluster.worker
        assert worker.writers.storage_down
        assert len(script.runs) == WINDOW + 1  # k00's slot went on before its write failed
        script.release(*KEYS[1 : WINDOW + 1])  # the performing runs finish: no slot is used
        await cluster.advance(30)
        assert len(script.runs) == WINDOW + 1
        outage.end()
        await cluster.advance(60)  # the held outcomes are written at the writer's next try
        assert not worker.writers.storage_down
        assert len(script.runs) == WINDOW * 2 + 1  # dispatch resumed with the write
        script.release(*KEYS)
        await _finish(cluster, job_id)
        state = await cluster.storage().jobs.get(job_id)
        assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
        assert sorted(key for key, _ in script.runs) == KEYS

    run(scenario())


class _Refuses:
    """Step storage whose next outcome write fails for good (not a transient error)."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.refuse = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def save_many(self, states):
        if self.refuse and any(s.status.is_final for s in states):
            self.refuse -= 1
            raise ValueError("a bug in a provider: the batch was refused")
        return await self._inner.save_many(states)


def test_a_run_that_ended_without_its_outcome_is_sent_again(run, script):
    """The last safeguard against an idle job: a run that ended without storing its outcome
    (here a write refused by a permanent error) is found by the watchdog, which asks the
    worker host whether it still holds the step and sends it again when it does not."""
    made: list[_Refuses] = []

    def refusing(inner):
        made.append(_Refuses(inner))
        return made[-1]

    async def scenario() -> None:
        cluster = InProcessCluster(
            options=JobsOptions(max_parallel_steps=WINDOW), wrap_storage=wrap_steps(refusing)
        )
        await cluster.provider.initialize()
        try:
            result = await cluster.start(ScenarioJob, request("a", "b"))
            steps = made[0]
            steps.refuse = 1
            await cluster.settle()
            assert len(script.runs) == 2
            watchdog = cluster.options.job_watchdog_interval.total_seconds()
            await cluster.advance(watchdog * 3)
            state = await cluster.storage().jobs.get(result.job_id)
            assert state.status == JobStatus.COMPLETED_SUCCESSFULLY, state.status
            assert state.progress.successful_steps == 2
            # The refused batch held both outcomes: each step ran again, once.
            assert sorted(key for key, _ in script.runs) == ["a", "a", "b", "b"]
        finally:
            await cluster.close()

    run(scenario())


class _Stuck:
    """Job storage whose writes, and then its listings, wait until released."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.writes = asyncio.Event()
        self.writes.set()
        self.listings = asyncio.Event()
        self.listings.set()
        self.waiting = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def save(self, state):
        self.waiting += 1
        await self.writes.wait()
        return await self._inner.save(state)

    async def query(self, query=None):
        await self.listings.wait()
        return await self._inner.query(query)


def test_reads_never_wait_behind_a_write_that_waits(run, script):
    """`get` answers the stored state while the job's own write waits on storage, and a
    listing that storage does not answer ends in one clear error after the read bound."""
    made: list[_Stuck] = []

    def stuck(storage):
        made.append(_Stuck(storage.jobs))
        return JobsStorage(key=storage.key, jobs=made[-1], steps=storage.steps, plans=storage.plans)

    async def scenario() -> None:
        cluster = InProcessCluster(
            options=JobsOptions(max_parallel_steps=WINDOW), wrap_storage=stuck
        )
        await cluster.provider.initialize()
        try:
            script.behaviour["a"].block = True
            result = await cluster.start(ScenarioJob, request("a"))
            jobs = made[0]
            jobs.writes.clear()  # the next write of the job waits
            script.release("a")
            await settle(200)  # the outcome is counted; the progress write waits (busy)
            assert jobs.waiting
            manager = cluster.manager()
            state = await asyncio.wait_for(manager.get(result.job_id), 1)
            assert state.status == JobStatus.RUNNING  # as stored: the write has not landed
            jobs.listings.clear()
            listing = asyncio.ensure_future(manager.list())
            await settle()
            await cluster.clock.advance(READ_SECONDS - 0.1)
            assert not listing.done()
            await cluster.clock.advance(0.1)
            with pytest.raises(StorageUnavailableError, match="did not answer"):
                await listing
            jobs.listings.set()
            jobs.writes.set()
            await cluster.settle()
            done = await manager.get(result.job_id)
            assert done.status == JobStatus.COMPLETED_SUCCESSFULLY
        finally:
            jobs.writes.set()
            jobs.listings.set()
            await cluster.close()

    run(scenario())


class _Slow:
    """Step storage whose workers' batch writes (runs' records) wait until released."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.open = asyncio.Event()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def save_many(self, states):
        if any(state.status != JobStepStatus.UNKNOWN for state in states):
            await self.open.wait()
        return await self._inner.save_many(states)


def test_runs_wait_while_too_many_records_wait_to_be_written(run, script):
    """The in-flight window: while the writers have `limit` records on their way, no
    run starts, so a worker lost meanwhile takes at most that much work with it."""
    made: list[_Slow] = []

    def slow(inner):
        made.append(_Slow(inner))
        return made[-1]

    async def scenario() -> None:
        cluster = InProcessCluster(
            options=JobsOptions(max_parallel_steps=WINDOW), wrap_storage=wrap_steps(slow)
        )
        await cluster.provider.initialize()
        cluster.worker.writers.limit = 3
        try:
            made_before = len(made)
            result = await cluster.start(ScenarioJob, request(*KEYS))
            steps = made[made_before]
            await settle(200)
            assert len(script.runs) == 3  # three records wait: the fourth run did not start
            steps.open.set()
            await cluster.settle()
            state = await cluster.storage().jobs.get(result.job_id)
            assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
            assert sorted(key for key, _ in script.runs) == KEYS
        finally:
            for steps in made:
                steps.open.set()
            await cluster.close()

    run(scenario())
