"""Each death of a worker host is told to the jobs once, however many readers notice it (no
Ray: the controller host is a stand-in).

The routing table (a failed call) and the membership watch (a reading of Ray's actor table)
both notice a death, at their own times. A killed host is started again under its name at
once, and steps sent again after the first notice may go to the new incarnation; a second
notice by name took them from the live host and sent them once more, so they ran twice —
in the chaos soak, runs began after their step's success was stored."""

from __future__ import annotations

import asyncio

from choreography_ray.engine.clock import FakeClock
from choreography_ray.jobs import JobKey
from choreography_ray.recovery.membership import Deaths
from choreography_ray.runtime.constants import worker_name
from choreography_ray.runtime.controller_recovery import ControllerRecovery

WORKER = worker_name("node-a")


class _Manager:
    def __init__(self) -> None:
        self.lost: list[set[str]] = []

    async def hosts_lost(self, hosts: frozenset[str]) -> int:
        self.lost.append(set(hosts))
        return len(hosts)


class _Host:
    name = "choreography:controller:me"

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.manager = _Manager()
        self.managers = {JobKey(): self.manager}


def _recovery() -> tuple[ControllerRecovery, _Manager]:
    host = _Host()
    return ControllerRecovery(host), host.manager  # type: ignore[arg-type]


def test_a_death_noticed_twice_is_told_once() -> None:
    recovery, manager = _recovery()
    asyncio.run(recovery.hosts_lost({WORKER: "incarnation-1"}))  # a failed call
    asyncio.run(recovery.hosts_lost({WORKER: "incarnation-1"}))  # the membership reading
    assert manager.lost == [{WORKER}]


def test_the_next_incarnations_death_is_told_too() -> None:
    recovery, manager = _recovery()
    asyncio.run(recovery.hosts_lost({WORKER: "incarnation-1"}))
    asyncio.run(recovery.hosts_lost({WORKER: "incarnation-2"}))  # started again, then died
    assert manager.lost == [{WORKER}, {WORKER}]


def test_a_death_whose_incarnation_is_not_known_is_told_every_time() -> None:
    recovery, manager = _recovery()
    asyncio.run(recovery.hosts_lost({WORKER: None}))
    asyncio.run(recovery.hosts_lost({WORKER: None}))
    assert manager.lost == [{WORKER}, {WORKER}]


def test_deaths_are_remembered_within_a_bound() -> None:
    deaths = Deaths()
    assert all(deaths.first(f"i{n}") for n in range(Deaths.LIMIT + 1))
    assert deaths.first("i0")  # the oldest was forgotten
    assert not deaths.first(f"i{Deaths.LIMIT}")
