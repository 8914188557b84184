"""A step write that lands while its answer is lost (the database went away between its
commit and its reply). The writer held it as unwritten and wrote it again expecting the
version it had read; storage answered that the record had moved on. Taking its own write for
another's, the writer stopped the run (which then ran a second time) or dropped its outcome's
report; and, the conflict being the only answer storage gave, it went on believing storage
away, so its worker started no step again (the job stood still for good). Now the writer asks
what storage holds, and a record holding a write of its own goes on from it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from choreography_ray.bench import NoopStep
from choreography_ray.engine.clock import FakeClock, settle
from choreography_ray.engine.writer import StaleRecord, StepWriter, Tracked
from choreography_ray.jobs import JobsOptions, JobStatus, JobStepStatus
from choreography_ray.jobs.errors import StorageUnavailableError
from choreography_ray.jobs.retry import Backoff
from choreography_ray.jobs.state import JobKey, JobStepState, StatusChange
from choreography_ray.storage.protocols import JobsStorage
from choreography_ray.storage.schemes import open_storage
from choreography_ray.testing import InProcessCluster

from .fixtures import ScenarioJob, request, wrap_steps

KEYS = ["a", "b", "c"]
WATCHDOG = 30


class LostAnswers:
    """Step storage that writes the first batch `loses` picks, then answers as if storage
    had gone away before the reply: the write is durable and the writer does not know it."""

    def __init__(self, inner: Any, loses: Any = lambda states: True) -> None:
        self._inner = inner
        self._loses = loses
        self.lost: list[list[str]] = []
        self.saves = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def save_many(self, states: list[Any]) -> Any:
        self.saves += 1
        versions = await self._inner.save_many(states)
        if not self.lost and self._loses(states):
            self.lost.append([state.id for state in states])
            raise StorageUnavailableError("the connection dropped before the commit's reply")
        return versions


def _with(status: JobStepStatus) -> Any:
    return lambda states: any(state.status == status for state in states)


@pytest.mark.parametrize(
    "lost", [JobStepStatus.RUNNING, JobStepStatus.COMPLETED_SUCCESSFULLY], ids=lambda s: s.name
)
def test_a_step_write_whose_answer_was_lost_goes_on_from_what_landed(run, script, lost):
    """Running lost: the run goes on, and each step is performed once (it ran twice, or with
    storage believed away, the job never finished). Outcome lost: it is reported at once,
    not found by the job's watchdog a sweep later."""
    wrapped: list[LostAnswers] = []

    def make(inner: Any) -> LostAnswers:
        wrapped.append(LostAnswers(inner, _with(lost)))
        return wrapped[-1]

    cluster = InProcessCluster(
        options=JobsOptions(job_watchdog_interval=f"{WATCHDOG}s"), wrap_storage=wrap_steps(make)
    )

    async def scenario() -> None:
        for key in KEYS:
            script.behaviour[key].block = True
        result = await cluster.start(ScenarioJob, request(*KEYS))
        assert result.succeeded
        await cluster.settle()
        script.release(*KEYS)
        await cluster.settle()
        assert any(w.lost for w in wrapped), f"no {lost.name} write was answered as lost"
        seconds = 0
        while seconds < WATCHDOG - 1:  # the writer's backoff is at most 5 s
            await cluster.advance(1)
            seconds += 1
            state = await cluster.storage().jobs.get(result.job_id)
            if state.status.is_terminal:
                break
        assert state.status == JobStatus.COMPLETED_SUCCESSFULLY, (
            f"not finished {seconds} s after the lost answer (the watchdog would act at "
            f"{WATCHDOG} s)"
        )
        assert state.progress.successful_steps == len(KEYS)
        assert sorted(key for key, _ in script.runs) == KEYS  # each step performed once
        assert not cluster.worker.writers.storage_down

    try:
        run(scenario())
    finally:
        run(cluster.close())


def _running(state: JobStepState, at: int) -> JobStepState:
    change = StatusChange(status=int(JobStepStatus.RUNNING), occurred=FakeClock().now())
    return state.model_copy(
        update={"status": JobStepStatus.RUNNING, "status_changes": [change], "generation": at}
    )


class Refusing:
    """Step storage whose first write fails unwritten, as storage away would; `meanwhile`
    runs then (another writer changing the record)."""

    def __init__(self, inner: Any, meanwhile: Any) -> None:
        self._inner = inner
        self._meanwhile = meanwhile
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def save_many(self, states: list[Any]) -> Any:
        if not self.refused:
            self.refused += 1
            await self._meanwhile()
            raise StorageUnavailableError("storage is away")
        return await self._inner.save_many(states)


def test_a_record_another_writer_changed_during_an_outage_is_stale_and_storage_is_back():
    """The safeguards' other side: a stored record that is not a write of this writer's is
    another's (the job's, a newer run's), and the run must stop. And an answer that is a
    conflict still says storage answers: the worker may start steps again."""

    async def scenario() -> tuple[list[Any], StepWriter]:
        def refusing_after_another(steps: Any) -> Refusing:
            async def another_writer() -> None:  # a newer run of the same step, say
                await steps.save(_running(await steps.get("j", "s"), at=2))

            return Refusing(steps, another_writer)

        _, refusing, writer, clock, prepared = await _writer_over("other", refusing_after_another)
        told: list[Any] = []
        writer.write(Tracked(_running(prepared, at=1)), told.append)
        await settle()  # refused: the record is held for the writer's backoff
        assert refusing.refused == 1 and writer.unavailable is not None and not told
        for _ in range(20):
            await clock.advance(1)
            if told:
                break
        return told, writer

    told, writer = asyncio.run(scenario())
    assert len(told) == 1 and isinstance(told[0], StaleRecord)
    assert writer.unavailable is None, "a conflict is an answer: storage is back"


class ConflictThenAway(LostAnswers):
    """Step storage whose first write lands unanswered, whose second conflicts with it, and
    whose first read back finds storage away again: a connection that flaps."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.reads = 0

    async def get_many(self, job_id: str, step_ids: list[str]) -> Any:
        self.reads += 1
        if self.reads == 1:
            raise StorageUnavailableError("away again")
        return await self._inner.get_many(job_id, step_ids)


async def _writer_over(
    name: str, wrap: Any
) -> tuple[JobsStorage, Any, StepWriter, FakeClock, JobStepState]:
    """A writer over memory storage whose steps `wrap` makes; a prepared record stored."""
    inner = open_storage(f"memory://lost-answers-{name}").for_key(JobKey())
    prepared = JobStepState(id="s", job_id="j", type=NoopStep.name, is_prepared=True)
    prepared.version = await inner.steps.save(prepared)
    steps = wrap(inner.steps)
    storage = JobsStorage(key=inner.key, jobs=inner.jobs, steps=steps, plans=inner.plans)
    clock = FakeClock()
    writer = StepWriter(JobKey(), storage, clock=clock, backoff=Backoff(0.01, 0.1))
    return inner, steps, writer, clock, prepared


def test_storage_away_again_while_the_writer_reads_back_holds_the_record(caplog):
    """Not knowing whose write storage holds, the writer holds the record and asks again
    after its backoff; it neither stops the run nor loses the write, nor takes storage for
    back (which would start its backoff over) until the read-back answers."""

    async def scenario() -> tuple[list[Any], Tracked, ConflictThenAway]:
        _, flapping, writer, clock, prepared = await _writer_over("flap", ConflictThenAway)
        record = Tracked(_running(prepared, at=1))
        told: list[Any] = []
        writer.write(record, told.append)
        for _ in range(20):
            await clock.advance(1)
            if told:
                break
        return told, record, flapping

    with caplog.at_level(logging.WARNING, logger="choreography_ray.engine"):
        told, record, flapping = asyncio.run(scenario())
    assert flapping.reads >= 2, "the writer never read the record back a second time"
    assert caplog.text.count("takes step writes") == 1, "storage taken for back too soon"
    assert told == [None], f"the run was told {told!r}"
    assert record.state.version == 2


def test_what_landed_is_durable_and_the_changes_made_since_are_still_written():
    """Running landed unanswered; the outcome came while it was held. The read-back makes
    Running durable, not the outcome: the outcome's waiter is told once it is written."""

    async def scenario() -> tuple[list[Any], list[Any], JobStepState, int]:
        inner, lost, writer, clock, prepared = await _writer_over("since", LostAnswers)
        record = Tracked(_running(prepared, at=1))
        running: list[Any] = []
        writer.write(record, running.append)
        await settle()  # written, its answer lost: held
        done = record.state.model_copy(update={"status": JobStepStatus.COMPLETED_SUCCESSFULLY})
        record.state = done
        outcome: list[Any] = []
        writer.write(record, outcome.append)
        assert running == [] and outcome == []
        for _ in range(20):
            await clock.advance(1)
            if outcome:
                break
        return running, outcome, await inner.steps.get("j", "s"), lost.saves

    running, outcome, stored, saves = asyncio.run(scenario())
    assert running == [None] and outcome == [None]
    assert stored.status == JobStepStatus.COMPLETED_SUCCESSFULLY and stored.version == 3
    assert saves == 3  # lost, conflicted, then the outcome expecting the landed version


def test_the_first_unanswered_write_is_kept_past_the_limit():
    """The write in flight as the connection dropped is the one likely to have landed; the
    retries after it mostly found no connection at all."""
    record = Tracked(JobStepState(id="s", job_id="j", type=NoopStep.name))
    for sequence in range(1, 20):
        record.unanswered_write(sequence, record.state)
        record.unanswered_write(sequence, record.state)  # the same change again: no entry
    kept = [sequence for sequence, _ in record.unanswered]
    assert kept[0] == 1 and len(kept) == 8 and kept[-1] == 19
