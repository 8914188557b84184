"""The advertisements a host reads before each dispatch and report, in-process: an old reading
answers at once while the next one is made in the background, one at a time, so a control store
that hangs (a GCS restart) never holds up the steps; and the control store's calls have
threads of their own, so a step's `asyncio.to_thread` never waits behind them."""

from __future__ import annotations

import asyncio
import threading

from choreography_ray.engine.clock import FakeClock
from choreography_ray.placement.capability import HostAdvert
from choreography_ray.runtime.adverts import Adverts
from choreography_ray.runtime.control_calls import CONTROL_STORE_THREADS, control_store_call

from .host_stubs import until

HOSTS = ["choreography:worker:a", "choreography:worker:b"]
CADENCE = 10.0
BOUND = 5.0  # seconds: a wait that would only end when the hanging reading is let go


class Store:
    """Ray's key-value store as a reading sees it: it counts readings, and hangs while
    `away` is set (the control store restarting), until `back`."""

    def __init__(self) -> None:
        self.readings = 0
        self.away = False
        self.fail = False
        self.returned = threading.Event()
        self.returned.set()
        self.node = "n1"

    def read(self, namespace: str, hosts: list[str]) -> dict[str, HostAdvert]:
        self.readings += 1
        if self.away:
            self.returned.wait(30)
        if self.fail:
            raise ConnectionError("the control store did not answer")
        return {name: HostAdvert(name=name, node_id=self.node) for name in hosts}

    def go_away(self) -> None:
        self.away = True
        self.returned.clear()

    def back(self) -> None:
        self.away = False
        self.returned.set()


def adverts() -> tuple[Adverts, Store, FakeClock]:
    store = Store()
    clock = FakeClock()
    return Adverts("ns", clock, cadence=CADENCE, read=store.read), store, clock


def test_the_first_reading_is_waited_for(run):
    found, store, _ = adverts()
    answer = run(found.of(HOSTS))
    assert sorted(answer) == HOSTS and store.readings == 1


def test_a_reading_within_the_cadence_reads_nothing(run):
    found, store, clock = adverts()

    async def twice() -> None:
        await found.of(HOSTS)
        await clock.advance(CADENCE / 2)
        await found.of(HOSTS)

    run(twice())
    assert store.readings == 1


def test_an_old_reading_answers_at_once_while_the_control_store_hangs(run):
    found, store, clock = adverts()

    async def scenario() -> tuple[dict[str, HostAdvert], int]:
        await found.of(HOSTS)
        await clock.advance(CADENCE)
        store.go_away()
        try:
            # Every dispatch and report asks; none waits, and one reading is under way.
            answers = [await asyncio.wait_for(found.of(HOSTS), BOUND) for _ in range(50)]
            await until(lambda: store.readings == 2)
            await clock.advance(CADENCE)
            answers += [await asyncio.wait_for(found.of(HOSTS), BOUND) for _ in range(50)]
            readings = store.readings
        finally:
            store.back()
        return answers[-1], readings

    last, readings = run(scenario())
    assert sorted(last) == HOSTS
    assert readings == 2, "a second reading began while one hung"


def test_the_background_reading_replaces_the_old_one_once_it_lands(run):
    found, store, clock = adverts()

    async def scenario() -> str:
        await found.of(HOSTS)
        await clock.advance(CADENCE)
        store.node = "n2"
        await found.of(HOSTS)  # answers from the old reading, starts the next
        await until(lambda: found._reading is None)
        return (await found.of(HOSTS))[HOSTS[0]].node_id

    assert run(scenario()) == "n2"


def test_a_failed_reading_keeps_the_last_one_and_the_next_tries_again(run):
    found, store, clock = adverts()

    async def scenario() -> dict[str, HostAdvert]:
        await found.of(HOSTS)
        await clock.advance(CADENCE)
        store.fail = True
        await found.of(HOSTS)
        await until(lambda: found._reading is None)
        store.fail = False
        answer = await found.of(HOSTS)  # still old: tried again in the background
        await until(lambda: found._reading is None)
        return answer

    answer = run(scenario())
    assert sorted(answer) == HOSTS and store.readings == 3


def test_a_host_not_read_yet_is_waited_for(run):
    found, store, _ = adverts()

    async def scenario() -> dict[str, HostAdvert]:
        await found.of(HOSTS[:1])
        return await found.of(HOSTS)

    assert sorted(run(scenario())) == HOSTS and store.readings == 2


def test_a_step_thread_never_waits_behind_hanging_control_store_calls(run):
    """As many control-store calls hang as the loop's default executor has threads, and
    more: a step's `asyncio.to_thread` still runs at once."""
    gone = threading.Event()

    def hang() -> None:
        gone.wait(30)

    async def scenario() -> str:
        loop = asyncio.get_running_loop()
        calls = [
            loop.create_task(control_store_call(hang)) for _ in range(CONTROL_STORE_THREADS + 8)
        ]
        await asyncio.sleep(0.05)
        try:
            ran = await asyncio.wait_for(asyncio.to_thread(threading.current_thread), BOUND)
            return ran.name
        finally:
            gone.set()
            await asyncio.gather(*calls)

    assert not run(scenario()).startswith("choreography-gcs")
