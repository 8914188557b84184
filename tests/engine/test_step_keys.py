"""Step-level concurrency keys, in process under the fake clock: places of a key in storage
that every worker host takes from; runs wait for one without a slot, visibly, never fail for
it, get places key by key in turn, and a dead host's places come back when their lease ends."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel, Field

from choreography_ray.cli.output import step_json
from choreography_ray.console.reader import StepListing
from choreography_ray.console.step_pages import steps_page
from choreography_ray.engine.clock import FakeClock
from choreography_ray.engine.step_keys import STEP_KEYS_JOB, holders, record_id, take
from choreography_ray.jobs import (
    ConcurrencyKey,
    Job,
    JobKey,
    JobsOptions,
    JobStatus,
    JobStep,
    StepContext,
    TypeRegistryError,
)
from choreography_ray.storage.protocols import JobsStorage
from choreography_ray.storage.step_query import StepQuery
from choreography_ray.testing import InProcessCluster

CLOCK = FakeClock()
LEASE = 30.0


class Work(BaseModel):
    tenant: str
    name: str
    block: bool = True


class Book:
    """What the steps did: which began in which order, how many of a key performed at once."""

    def __init__(self) -> None:
        self.began: list[str] = []
        self.running: Counter[str] = Counter()
        self.most: Counter[str] = Counter()
        self.gates: dict[str, asyncio.Event] = {}

    def gate(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())

    def open(self, *names: str) -> None:
        for name in names:
            self.gate(name).set()


BOOK = Book()


class CallTenant(JobStep[Work, Work, str], name="scenario.step-keys.call-tenant"):
    concurrency = ConcurrencyKey("tenant", max_running=2)

    def initialize_state(self, request: Work) -> Work:
        return request

    async def perform(self, state: Work, ctx: StepContext) -> str:
        BOOK.began.append(state.name)
        BOOK.running[state.tenant] += 1
        BOOK.most[state.tenant] = max(BOOK.most[state.tenant], BOOK.running[state.tenant])
        try:
            if state.block:
                await BOOK.gate(state.name).wait()
        finally:
            BOOK.running[state.tenant] -= 1
        return state.name


class CallOne(CallTenant, name="scenario.step-keys.call-one"):
    concurrency = ConcurrencyKey(lambda state: state.tenant.upper(), max_running=1)


class Works(BaseModel):
    works: list[Work] = Field(default_factory=list)
    one: bool = False
    """Each key one at a time (`CallOne`), else two (`CallTenant`)."""


class Calls(Job[Works], name="scenario.step-keys.calls"):
    keep_after_completed = True

    def prepare_steps(self, request: Works) -> list[Any]:
        step = CallOne if request.one else CallTenant
        return [self.create_step(step, work, name=work.name) for work in request.works]


def works(tenant: str, count: int, *, block: bool = True, start: int = 0) -> list[Work]:
    return [Work(tenant=tenant, name=f"{tenant}{n}", block=block) for n in range(start, count)]


@pytest.fixture(autouse=True)
def book() -> Iterator[Book]:
    global BOOK
    BOOK = Book()
    yield BOOK


def _cluster(workers: int = 1, slots: int = 4) -> InProcessCluster:
    options = JobsOptions(
        max_parallel_steps=slots,
        step_key_lease=timedelta(seconds=LEASE),
        concurrency_poll_interval=timedelta(seconds=1),
    )
    return InProcessCluster(options=options, clock=CLOCK, workers=workers, max_parallel_steps=slots)


async def _steps(cluster: InProcessCluster, job_id: str) -> dict[str, Any]:
    return {s.name: s for s in await cluster.storage().steps.get_all_for_job(job_id)}


def test_a_key_at_its_limit_holds_on_two_worker_hosts_and_its_places_are_renewed(run, book):
    """Six steps of one key and one of another on two hosts: two of the key perform, the
    others wait on both hosts, the other key's step performs beside them; long past the
    lease they still are two (the hosts renew their places), and once the work ends every
    step completes."""
    cluster = _cluster(workers=2)

    async def scenario() -> Any:
        async with cluster:
            request = Works(works=[*works("acme", 6), *works("globex", 1)])
            job_id = (await cluster.start(Calls, request)).job_id
            await cluster.settle()
            at_first = (dict(book.running), {n: w.keys.waiting for n, w in cluster.workers.items()})
            for _ in range(4):
                await cluster.advance(LEASE)  # four leases: a place not renewed would expire
            later = dict(book.running)
            record = record_id(CallTenant.name, "acme")
            places = await holders(cluster.storage(JobKey()), cluster.registry, record)
            for _ in range(8):
                book.open(*book.began)
                await cluster.advance(1)
            return at_first, later, places, await cluster.wait(job_id)

    (running, waiting), later, places, state = run(scenario())
    assert running == {"acme": 2, "globex": 1}
    assert waiting == {"worker-0": 1, "worker-1": 3}  # both hosts held back by one count
    assert later == {"acme": 2, "globex": 1}
    assert len(places) == 2
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY  # waited, never failed
    assert state.progress.successful_steps == 7
    assert book.most["acme"] == 2


def test_a_waiting_step_says_so_on_its_record_and_holds_no_slot(run, book):
    """Two slots, one place: while acme0 performs, the other acme steps wait without a
    slot, so the globex steps take the second slot and finish. The waiting steps' records
    say why; a step that ran says it no more."""
    cluster = _cluster(slots=2)

    async def scenario() -> Any:
        async with cluster:
            request = Works(works=[*works("acme", 3), *works("globex", 3, block=False)], one=True)
            job_id = (await cluster.start(Calls, request)).job_id
            await cluster.settle()
            waiting = await _steps(cluster, job_id)
            job = await cluster.manager().get(job_id)
            listing = StepListing(list(waiting.values()), len(waiting), None)
            page = steps_page(job, StepQuery(), listing, CLOCK.now())
            began = list(book.began)
            book.open("acme0", "acme1", "acme2")
            await cluster.advance(1)
            return waiting, page, began, await _steps(cluster, job_id), await cluster.wait(job_id)

    waiting, page, began, after, state = run(scenario())
    assert began == ["acme0", "globex0", "globex1", "globex2"]
    wait = waiting["acme1"].waiting_for_key
    assert wait is not None and wait.text() == "waiting: key ACME at its limit 1"
    assert step_json(waiting["acme2"])["waiting_for_key"] == "waiting: key ACME at its limit 1"
    assert page.count("waiting: key ACME at its limit 1") == 2  # the console's steps page
    assert waiting["acme0"].waiting_for_key is None and waiting["globex0"].waiting_for_key is None
    assert all(step.waiting_for_key is None for step in after.values())
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY and book.most["acme"] == 1


def _behind_full_keys(slots: int) -> tuple[InProcessCluster, Any]:
    """A cluster of two worker hosts: "big" (four slots), and "small" with `slots`; and the
    job that fills both keys' places on big (two each of acme and globex), for `scenario` to
    start inside the cluster: whatever starts after it on small waits for those places."""
    cluster = _cluster(workers=0)
    cluster.max_parallel_steps = 4
    cluster.add_worker("big")
    cluster.max_parallel_steps = slots
    cluster.add_worker("small")

    async def hold() -> list[Work]:
        cluster.draining = {"small"}
        holding = [Work(tenant=t, name=f"hold-{t}{n}") for t in ("acme", "globex") for n in "01"]
        await cluster.start(Calls, Works(works=holding))
        await cluster.settle()
        cluster.draining = {"big"}
        return holding

    return cluster, hold


def test_keys_get_their_places_in_turn(run, book):
    """A host of one slot has six runs of acme and two of globex waiting, both keys full
    (their places held on another host). As places free, the keys take turns: globex's two
    do not wait behind all of acme's."""
    cluster, hold = _behind_full_keys(slots=1)
    small = cluster.workers["small"]

    async def scenario() -> Any:
        async with cluster:
            holding = await hold()
            request = Works(
                works=[*works("acme", 6, block=False), *works("globex", 2, block=False)]
            )
            job_id = (await cluster.start(Calls, request)).job_id
            await cluster.settle()
            waiting = small.keys.waiting
            book.open(*(work.name for work in holding))
            for _ in range(4):
                await cluster.advance(1)
            return waiting, await cluster.wait(job_id)

    waiting, state = run(scenario())
    assert waiting == 8
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    ran = [name for name in book.began if not name.startswith("hold")]
    assert ran == ["acme0", "globex0", "acme1", "globex1", "acme2", "acme3", "acme4", "acme5"]


def test_the_keys_places_of_one_pass_start_in_turn(run, book):
    """A host of two slots has two runs of acme and two of globex, of one job, waiting, both
    keys full (their places held on another host). The places free together, and one pass
    takes two of each key: the job's runs that got them are queued one key after the other
    in turn, so the two slots go to acme and globex, not both to acme."""
    cluster, hold = _behind_full_keys(slots=2)
    small = cluster.workers["small"]

    async def scenario() -> Any:
        async with cluster:
            holding = await hold()
            request = Works(works=[*works("acme", 2), *works("globex", 2)])
            job_id = (await cluster.start(Calls, request)).job_id
            await cluster.settle()
            waiting = small.keys.waiting
            book.open(*(work.name for work in holding))
            await cluster.advance(1)  # the places are free when small asks again
            first = [name for name in book.began if not name.startswith("hold")]
            for _ in range(3):
                book.open(*book.began)
                await cluster.advance(1)
            return waiting, first, await cluster.wait(job_id)

    waiting, first, state = run(scenario())
    assert waiting == 4
    assert [name.rstrip("01") for name in first] == ["acme", "globex"]
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_a_dead_hosts_place_comes_back_when_its_lease_ends(run, book):
    """One place, held by a step on worker-0; worker-0 dies. Its step is sent to worker-1,
    where it waits with the others: the dead host's place still counts until its lease ends
    (it is not renewed), then one of them performs."""
    cluster = _cluster(workers=2)

    async def scenario() -> Any:
        async with cluster:
            job_id = (await cluster.start(Calls, Works(works=works("acme", 3), one=True))).job_id
            await cluster.settle()
            first = list(book.began)
            record = record_id(CallOne.name, "ACME")
            [place] = await holders(cluster.storage(JobKey()), cluster.registry, record)
            await cluster.lose_worker(place.host.split("#")[0])
            await cluster.settle()
            await cluster.advance(LEASE / 2)
            within = dict(book.running)
            await cluster.advance(LEASE / 2 + 1)
            after = dict(book.running)
            for _ in range(6):
                book.open(*book.began)
                await cluster.advance(1)
            return first, within, after, await cluster.wait(job_id)

    first, within, after, state = run(scenario())
    assert len(first) == 1
    assert within["acme"] == 0  # the dead host's place still counts
    assert after["acme"] == 1  # given back by its lease: one performs again
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert book.most["acme"] == 1


def test_a_stop_takes_the_waiting_runs_back_at_once_and_frees_the_places(run, book):
    """A job's runs wait for the place another job's run holds; stopped, they settle stopped
    at once, never having begun. Stopped too, the other job's run gives its place back."""
    cluster = _cluster()

    async def scenario() -> Any:
        async with cluster:
            jobs = cluster.manager()
            holder = (await cluster.start(Calls, Works(works=works("acme", 1), one=True))).job_id
            await cluster.settle()
            request = Works(works=works("acme", 5, start=1), one=True)
            waiter = (await cluster.start(Calls, request)).job_id
            await cluster.settle()
            await jobs.stop(waiter)
            await cluster.settle()
            stopped = await jobs.get(waiter)
            await jobs.stop(holder)
            await cluster.settle()
            record = record_id(CallOne.name, "ACME")
            places = await holders(cluster.storage(JobKey()), cluster.registry, record)
            return stopped, places, cluster.worker.keys.waiting

    stopped, places, waiting = run(scenario())
    assert stopped.status == JobStatus.STOPPED and stopped.stop_finalized
    assert stopped.progress.stopped_steps == 4
    assert book.began == ["acme0"] and places == [] and waiting == 0


def _slow_key_writes(storage: JobsStorage) -> JobsStorage:
    """Storage whose writes of keys' places take a while (many turns of the loop)."""

    class Steps:
        def __getattr__(self, name: str) -> Any:
            return getattr(storage.steps, name)

        async def save(self, state: Any) -> int:
            if state.job_id == STEP_KEYS_JOB:
                for _ in range(200):
                    await asyncio.sleep(0)
            return await storage.steps.save(state)

    return JobsStorage(storage.key, storage.jobs, Steps(), storage.plans)  # type: ignore[arg-type]


def test_a_host_that_shuts_down_gives_its_places_back(run, book):
    """A host deactivated with runs performing: they stop, and their places are given back
    before it closes (however long the write takes), not left to their lease."""
    cluster = _cluster()
    cluster.wrap_storage = _slow_key_writes

    async def scenario() -> Any:
        async with cluster:
            await cluster.start(Calls, Works(works=works("acme", 3)))
            record = record_id(CallTenant.name, "acme")
            storage = cluster.storage(JobKey())
            for _ in range(20):  # the slow writes of the places: a loop turn at a time
                await cluster.settle()
                before = await holders(storage, cluster.registry, record)
                if len(before) == 2:
                    break
            await cluster.worker.deactivate(5)
            return before, await holders(storage, cluster.registry, record)

    before, after = run(scenario())
    assert len(before) == 2 and after == []


def test_places_are_taken_by_compare_and_set_up_to_the_limit(run):
    """Two hosts ask for more than the limit: they get it between them, no more."""
    cluster = _cluster()

    async def scenario() -> Any:
        async with cluster:
            storage = cluster.storage(JobKey())

            def ask(host: str, runs: list[str]) -> Any:
                return take(
                    storage, cluster.registry, "k", limit=3, host=host, runs=runs, now=0, lease=10
                )

            got = await asyncio.gather(ask("a", ["a1", "a2"]), ask("b", ["b1", "b2"]))
            later = await ask("c", ["c1"])
            expired = await take(
                storage, cluster.registry, "k", limit=3, host="c", runs=["c1"], now=11, lease=10
            )
            return got, later, expired

    got, later, expired = run(scenario())
    assert sum(len(g) for g in got) == 3 and later == []
    assert expired == ["c1"]  # the others' leases ran out


def test_a_key_naming_no_field_of_the_state_is_refused_when_the_class_is_made():
    with pytest.raises(TypeRegistryError, match="not a field of Work"):

        class Wrong(CallTenant, name="scenario.step-keys.wrong"):
            concurrency = ConcurrencyKey("customer", max_running=1)


def test_a_key_that_cannot_be_read_fails_the_job_when_it_is_prepared(run, book):
    cluster = _cluster()

    class Broken(CallTenant, name="scenario.step-keys.broken"):
        concurrency = ConcurrencyKey(lambda state: state.missing, max_running=1)

    class BrokenJob(Job[Works], name="scenario.step-keys.broken-job"):
        keep_after_completed = True

        def prepare_steps(self, request: Works) -> list[Any]:
            return [self.create_step(Broken, work) for work in request.works]

    async def scenario() -> Any:
        async with cluster:
            job_id = (await cluster.start(BrokenJob, Works(works=works("acme", 1)))).job_id
            return await cluster.wait(job_id)

    state = run(scenario())
    assert state.status == JobStatus.FAILED
    assert "could not be read" in state.status_changes[-1].exception_messages[0]
