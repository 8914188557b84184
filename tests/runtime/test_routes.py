"""The routing table of a host, in-process: messages never look hosts up, a host that fails or
does not answer within the bound leaves the table, and the table is read off the event loop."""

from __future__ import annotations

import threading

import pytest

from choreography_ray.engine.clock import FakeClock, settle
from choreography_ray.engine.messages import StepReport, StepStart, StopRequest
from choreography_ray.jobs.errors import NoEligibleJobWorker, RemoveJobError, RemoveJobFailed
from choreography_ray.jobs.state import JobKey
from choreography_ray.jobs.status import JobStepStatus
from choreography_ray.recovery.liveness import HostGone
from choreography_ray.runtime.constants import controller_name, worker_name
from choreography_ray.runtime.dispatch import RayDispatcher, RayReporter
from choreography_ray.runtime.routes import Routes

from .host_stubs import DeadHost, DirectoryStub, HostStub, until

KEY = JobKey()
TIMEOUT = 5.0
CONTROLLER = controller_name("a")
OTHER_CONTROLLER = controller_name("b")
WORKERS = [worker_name("a"), worker_name("b")]
STOP = StopRequest(KEY, "job", 1, ("s1",), False)


def cluster() -> tuple[DirectoryStub, Routes, FakeClock, list[str]]:
    directory = DirectoryStub(
        HostStub(CONTROLLER), HostStub(OTHER_CONTROLLER), *(HostStub(n) for n in WORKERS)
    )
    clock = FakeClock()
    routes = Routes(directory, timeout=TIMEOUT, clock=clock, cadence=60)
    gone: list[str] = []
    routes.on_gone(gone.append)
    return directory, routes, clock, gone


def starts(n: int) -> list[StepStart]:
    return [StepStart(f"s{i}", 1) for i in range(n)]


def report() -> list[StepReport]:
    return [StepReport("s1", JobStepStatus.COMPLETED_SUCCESSFULLY, 1, 1)]


def test_messages_read_the_table_and_never_look_hosts_up(run) -> None:
    async def scenario() -> None:
        directory, routes, _, _ = cluster()
        await routes.start()
        dispatcher = RayDispatcher(routes, CONTROLLER)
        reporter = RayReporter(routes)
        reporter.controllers[(KEY, "job")] = CONTROLLER
        for _ in range(100):
            await dispatcher.start_steps(KEY, "job", "type", starts(10), {})
            await reporter.report(KEY, "job", report())
        for _ in range(10):
            await dispatcher.stop_steps(STOP)
        assert directory.name_lookups == 1  # on start only
        assert directory.handle_lookups == 4  # one per host, once
        assert threading.get_ident() not in directory.threads  # off the event loop
        sent = [m for m, _ in directory.hosts[WORKERS[0]].calls]
        assert sent.count("start_steps") == 100 and sent.count("stop_steps") == 10
        routes.close()

    run(scenario())


def test_a_host_that_never_answers_is_gone_after_the_bound(run) -> None:
    async def scenario() -> None:
        directory, routes, clock, gone = cluster()
        await routes.start()
        directory.hosts[WORKERS[1]].hung = True
        dispatcher = RayDispatcher(routes, CONTROLLER)
        call = asyncio_task(dispatcher.start_steps(KEY, "j", "t", starts(2), {}))
        await settle()
        await clock.advance(TIMEOUT - 0.1)
        assert not call.done()
        await clock.advance(0.2)
        answer = await call  # the share of the silent host was not delivered
        assert isinstance(answer.error, HostGone) and "no answer within 5s" in str(answer.error)
        assert [s.step_id for s in answer.undelivered] == ["s1"]
        assert answer.hosts == {WORKERS[0]: ["s0"]}
        assert gone == [WORKERS[1]]
        assert routes.workers == [WORKERS[0]]
        # The table is read again at once; the silent host must answer a ping to come back.
        silent = directory.hosts[WORKERS[1]]
        # the load question and the start (both unanswered), then the reading's ping
        await until(lambda: silent.asked == 3)
        await clock.advance(TIMEOUT * 1.25)  # its ping is given up within 1.25 bounds
        assert routes.workers == [WORKERS[0]]
        directory.hosts[WORKERS[1]].hung = False
        await routes.refresh()
        # the ping that takes it back runs apart from the reading
        await until(lambda: routes.workers == WORKERS)
        routes.close()

    run(scenario())


def test_the_owner_ping_is_bounded_too(run) -> None:
    async def scenario() -> None:
        directory, routes, clock, gone = cluster()
        await routes.start()
        directory.hosts[OTHER_CONTROLLER].hung = True
        ping = asyncio_task(routes.controller(OTHER_CONTROLLER).ping())
        await settle()
        await clock.advance(TIMEOUT)
        with pytest.raises(HostGone):
            await ping
        assert gone == [OTHER_CONTROLLER] and routes.controllers == [CONTROLLER]
        await until(lambda: directory.name_lookups == 2)
        for _ in range(10):  # still silent: gone at once, without a reading per call
            with pytest.raises(HostGone, match="has not answered since"):
                await routes.controller(OTHER_CONTROLLER).ping()
        assert directory.name_lookups == 2
        routes.close()

    run(scenario())


def test_outcomes_go_to_another_controller_when_theirs_died(run) -> None:
    async def scenario() -> None:
        directory, routes, _, gone = cluster()
        await routes.start()
        directory.hosts[CONTROLLER].dead = True
        reporter = RayReporter(routes)
        reporter.controllers[(KEY, "job")] = CONTROLLER
        await reporter.report(KEY, "job", report())
        assert [m for m, _ in directory.hosts[OTHER_CONTROLLER].calls] == ["deliver"]
        assert gone == [CONTROLLER] and routes.controllers == [OTHER_CONTROLLER]
        del directory.hosts[CONTROLLER]  # Ray no longer lists it
        await routes.refresh()
        readings = directory.name_lookups
        for _ in range(10):  # later outcomes go straight to the controller that took over
            await reporter.report(KEY, "job", report())
        assert directory.name_lookups == readings
        assert len(directory.hosts[OTHER_CONTROLLER].calls) == 11
        routes.close()

    run(scenario())


def test_a_jobs_answer_to_outcomes_is_raised_not_sent_to_another_controller(run) -> None:
    """A job whose removal's finish failed answers the report with an error: the worker is
    to report again later, not to hand the outcomes to every other controller meanwhile."""

    async def scenario() -> None:
        directory, routes, _, gone = cluster()
        await routes.start()
        directory.hosts[CONTROLLER].failing = RemoveJobFailed(
            "finishing the removal failed", code=RemoveJobError.UNKNOWN
        )
        reporter = RayReporter(routes)
        reporter.controllers[(KEY, "job")] = CONTROLLER
        with pytest.raises(RemoveJobFailed):
            await reporter.report(KEY, "job", report())
        assert directory.hosts[OTHER_CONTROLLER].asked == 0
        assert gone == []
        routes.close()

    run(scenario())


def test_an_error_of_the_call_itself_leaves_the_host_in_the_table(run) -> None:
    async def scenario() -> None:
        directory, routes, _, gone = cluster()
        await routes.start()
        directory.hosts[OTHER_CONTROLLER].failing = LookupError("no such job")
        with pytest.raises(LookupError):
            await routes.controller(OTHER_CONTROLLER).adopt(KEY, "job")
        assert gone == [] and OTHER_CONTROLLER in routes.controllers
        assert directory.name_lookups == 1
        routes.close()

    run(scenario())


def test_a_host_the_table_does_not_know_is_looked_up_once(run) -> None:
    async def scenario() -> None:
        directory, routes, _, _ = cluster()
        await routes.start()
        late = directory.add(HostStub(controller_name("late"), epoch=7))
        assert await routes.controller(late.name).ping() == 7
        assert await routes.controller(late.name).ping() == 7
        assert directory.name_lookups == 2
        with pytest.raises(HostGone, match="no such host"):
            await routes.controller(controller_name("nowhere")).ping()
        routes.close()

    run(scenario())


def test_a_host_is_looked_up_by_a_reading_that_began_after_it_was_asked_for(run) -> None:
    """A reading under way may predate the host: an owner that wrote its record after that
    reading began must not be taken for gone (its job would be taken over)."""

    async def scenario() -> None:
        directory, routes, _, _ = cluster()
        await routes.start()
        directory.held = threading.Event()
        early = asyncio_task(routes.refresh())
        await until(lambda: directory.name_lookups == 2)  # the early reading has its list
        late = directory.add(HostStub(controller_name("late"), epoch=7))
        asking = asyncio_task(routes.controller(late.name).ping())
        await settle()
        directory.held.set()
        await early
        assert await asking == 7
        routes.close()

    run(scenario())


def test_the_table_is_read_again_at_the_cadence(run) -> None:
    async def scenario() -> None:
        directory, routes, clock, gone = cluster()
        await routes.start()
        await settle()  # the keeper waits out the cadence from here
        del directory.hosts[WORKERS[0]]
        await clock.advance(59)
        assert directory.name_lookups == 1
        await clock.advance(1)
        await until(lambda: directory.name_lookups == 2 and routes.workers == WORKERS[1:])
        assert gone == [WORKERS[0]]
        routes.close()
        await settle()

    run(scenario())


def test_no_worker_host_is_refused_after_one_more_look(run) -> None:
    async def scenario() -> None:
        directory = DirectoryStub(HostStub(CONTROLLER))
        routes = Routes(directory, timeout=TIMEOUT, clock=FakeClock())
        await routes.start()
        with pytest.raises(NoEligibleJobWorker):
            await RayDispatcher(routes, CONTROLLER).start_steps(KEY, "j", "t", starts(1), {})
        assert directory.name_lookups == 2
        routes.close()

    run(scenario())


def test_a_failed_reading_keeps_the_table_as_it_was(run) -> None:
    async def scenario() -> None:
        directory, routes, _, gone = cluster()
        await routes.start()

        def unreachable() -> list[str]:
            raise ConnectionError("control store unreachable")

        directory.names = unreachable  # type: ignore[method-assign]
        await routes.refresh()
        assert routes.workers == WORKERS and gone == []
        routes.close()

    run(scenario())


def test_a_dead_host_is_not_a_suspect_forever(run) -> None:
    async def scenario() -> None:
        directory, routes, _, _ = cluster()
        await routes.start()
        directory.hosts[WORKERS[0]].dead = True
        with pytest.raises(DeadHost):
            await routes.worker(WORKERS[0]).stop_steps(STOP)
        await routes.refresh()  # still listed but not answering: stays out
        assert routes.workers == WORKERS[1:]
        directory.hosts[WORKERS[0]] = HostStub(WORKERS[0], epoch=2)  # a replacement
        await routes.refresh()
        await until(lambda: routes.workers == WORKERS)
        routes.close()

    run(scenario())


def test_a_replacement_is_pinged_while_the_old_host_s_ping_hangs(run) -> None:
    async def scenario() -> None:
        directory, routes, _, _ = cluster()
        await routes.start()
        old = directory.hosts[WORKERS[0]]
        old.dead = True
        with pytest.raises(DeadHost):
            await routes.worker(WORKERS[0]).stop_steps(STOP)
        old.dead, old.hung = False, True
        await routes.refresh()  # its ping hangs
        await until(lambda: old.asked == 2)
        directory.hosts[WORKERS[0]] = HostStub(WORKERS[0], epoch=2)  # a replacement
        await routes.refresh()
        await until(lambda: routes.workers == WORKERS)
        routes.close()

    run(scenario())


def test_a_hung_suspect_does_not_hold_up_a_reading(run) -> None:
    async def scenario() -> None:
        directory, routes, clock, gone = cluster()
        await routes.start()
        silent = directory.hosts[WORKERS[1]]
        silent.hung = True
        routes.forget(WORKERS[1])  # a call to it timed out; it stays listed, and hangs
        await until(lambda: silent.asked == 1)  # the reading forget began pings it
        directory.add(HostStub(worker_name("c")))
        # Every reading returns at once, without waiting for the suspect's ping to give up.
        for _ in range(3):
            reading = asyncio_task(routes.refresh())
            await until(reading.done)  # the fake clock never moves: no bound runs out
        assert routes.workers == [WORKERS[0], worker_name("c")] and gone == [WORKERS[1]]
        assert silent.asked == 1  # one ping in flight at a time, not one per reading
        silent.hung = False
        await clock.advance(TIMEOUT * 1.25)  # that ping is given up
        await routes.refresh()
        await settle()
        assert routes.workers == [*WORKERS, worker_name("c")]
        routes.close()

    run(scenario())


def asyncio_task(coroutine):  # type: ignore[no-untyped-def]
    import asyncio

    return asyncio.get_running_loop().create_task(coroutine)


def test_only_a_host_known_dead_is_announced_dead_and_only_once(run) -> None:
    """A host that did not answer in time may still be running its steps: it is not taken
    for dead (its steps would run twice). One that Ray says died, or that vanished from Ray's
    named actors, is announced once."""

    async def scenario() -> None:
        directory, routes, clock, _ = cluster()
        dead: list[tuple[str, str | None]] = []
        routes.on_dead(lambda name, died: dead.append((name, died)))
        await routes.start()
        directory.hosts[WORKERS[1]].hung = True
        dispatcher = RayDispatcher(routes, CONTROLLER)
        call = asyncio_task(dispatcher.start_steps(KEY, "j", "t", starts(2), {}))
        await settle()
        await clock.advance(TIMEOUT * 1.25)
        await call
        await routes.refresh()
        assert dead == []  # silent, still listed: a suspect, not dead
        directory.hosts[WORKERS[0]].dead = True
        with pytest.raises(DeadHost):
            await routes.worker(WORKERS[0]).ping()
        assert dead == [(WORKERS[0], f"{WORKERS[0]}#1")]  # with the incarnation that died
        del directory.hosts[WORKERS[1]]
        del directory.hosts[WORKERS[0]]
        await routes.refresh()
        await routes.refresh()
        assert dead == [(WORKERS[0], f"{WORKERS[0]}#1"), (WORKERS[1], f"{WORKERS[1]}#1")]
        routes.close()
        await settle()

    run(scenario())
