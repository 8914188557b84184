"""The advertisements a host reads before each dispatch and report, in-process: an old reading
answers at once while the next one is made in the background, one at a time, so a control store
that hangs (a GCS restart) never holds up the steps; and the control store's calls have
threads of their own, so a step's `asyncio.to_thread` never waits behind them."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

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
        self.silent: set[str] = set()
        """Hosts that never advertised (an older release)."""
        self.asked: list[list[str]] = []

    def read(self, namespace: str, hosts: list[str]) -> dict[str, HostAdvert]:
        self.readings += 1
        self.asked.append(hosts)
        if self.away:
            self.returned.wait(30)
        if self.fail:
            raise ConnectionError("the control store did not answer")
        return {
            name: HostAdvert(name=name, node_id=self.node)
            for name in hosts
            if name not in self.silent
        }

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


def test_callers_asking_for_other_hosts_meanwhile_each_get_theirs(run):
    found, store, _ = adverts()

    async def scenario() -> list[list[str]]:
        store.go_away()
        first = asyncio.ensure_future(found.of(["x"]))
        await until(lambda: store.readings == 1)
        others = [asyncio.ensure_future(found.of([name])) for name in ("y", "z")]
        await asyncio.sleep(0.01)
        store.back()
        answers = await asyncio.wait_for(asyncio.gather(first, *others), BOUND)
        return [sorted(answer) for answer in answers]

    assert run(scenario()) == [["x"], ["y"], ["z"]]
    assert store.asked == [["x"], ["y", "z"]]  # the two asked meanwhile: one reading


def test_a_reading_of_some_hosts_keeps_what_is_known_of_the_others(run):
    found, store, clock = adverts()

    async def scenario() -> dict[str, HostAdvert]:
        await found.of(HOSTS)
        await clock.advance(CADENCE)
        await found.of(HOSTS[:1])  # old: read again in the background, this host only
        await until(lambda: found._reading is None)
        store.go_away()
        try:
            return await asyncio.wait_for(found.of(HOSTS), BOUND)
        finally:
            store.back()

    assert sorted(run(scenario())) == HOSTS
    assert store.asked == [HOSTS, HOSTS[:1]]


def test_a_host_that_never_advertised_is_not_read_again_for_each_call(run):
    found, store, _ = adverts()
    store.silent = {HOSTS[1]}

    async def scenario() -> list[dict[str, HostAdvert]]:
        return [await found.of(order) for order in (HOSTS, HOSTS[::-1], HOSTS[1:], HOSTS)]

    answers = run(scenario())
    assert all(sorted(answer) == HOSTS[:1] for answer in answers[:2]) and answers[2] == {}
    assert store.readings == 1


def test_a_step_thread_never_waits_behind_hanging_control_store_calls():
    """More control-store calls hang than the loop's default executor has threads: a step's
    `asyncio.to_thread` still runs at once."""
    gone = threading.Event()

    def hang() -> None:
        gone.wait(30)

    async def scenario() -> str:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(2))  # as on two CPUs: any machine fails it
        calls = [
            loop.create_task(control_store_call(hang)) for _ in range(CONTROL_STORE_THREADS + 4)
        ]
        await asyncio.sleep(0.05)
        try:
            ran = await asyncio.wait_for(asyncio.to_thread(threading.current_thread), BOUND)
            return ran.name
        finally:
            gone.set()
            await asyncio.gather(*calls)

    assert not asyncio.run(scenario()).startswith("choreography-gcs")  # a loop of its own
