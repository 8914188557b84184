"""Messages between hosts: a job's starts and stops to the worker hosts, step outcomes back
to the controller host of their job. Every call goes through the routing table, so it is
bounded in time and never looks a host up on the event loop."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence

from ..engine.clock import Clock, SystemClock
from ..engine.messages import (
    PackedReport,
    SettledStops,
    StepReport,
    StepStart,
    StopRequest,
    StopResult,
    pack_reports,
    pack_starts,
)
from ..engine.ports import Dispatched
from ..engine.step_types import StepTypes
from ..jobs.errors import HostError, JobOperationError, NoEligibleJobWorker, TypeRegistryError
from ..jobs.registry import TypeKind, TypeRegistry, default_registry
from ..jobs.state import JobKey
from ..jobs.step import JobStep
from ..placement.capability import HostAdvert, moves_work, reads_decisions, reads_positions
from ..placement.choice import Placement
from ..placement.spreading import WorkerLoad, WorkerLoads
from .routes import Routes

AdvertsOf = Callable[[list[str]], Awaitable[dict[str, HostAdvert]]]

log = logging.getLogger("choreography_ray.runtime")


class RayDispatcher:
    """Sends a job's starts to the worker hosts, in batches, and its stops to all of them."""

    def __init__(
        self,
        routes: Routes,
        controller: str,
        adverts: AdvertsOf | None = None,
        placement: Placement | None = None,
        clock: Clock | None = None,
        registry: TypeRegistry = default_registry,
    ) -> None:
        self.routes = routes
        self.controller = controller
        self.adverts = adverts
        """What the worker hosts advertise; None takes every worker as able (tests)."""
        self.placement = placement or Placement()
        self.clock = clock or SystemClock()
        self.registry = registry
        self._kinds: dict[str, bool] = {}
        """Per step type, whether its steps perform on the hosts' event loops (`_on_loop`)."""
        self.loads = WorkerLoads()
        """The worker hosts' loads as last answered, and what was sent since."""
        routes.on_gone(self.loads.forget)
        self._asking: asyncio.Task[None] | None = None

    async def _workers(self) -> list[str]:
        """The worker hosts starts go to now; `routes.on_gone` tells when one leaves."""
        if not self.routes.workers:
            await self.routes.refresh()  # none known: look once more, off the loop
        if not self.routes.workers:
            raise NoEligibleJobWorker("no worker host is running in this cluster")
        return self.routes.workers

    async def start_steps(
        self,
        job_key: JobKey,
        job_id: str,
        job_type: str,
        starts: Sequence[StepStart],
        sticky: Mapping[str, str],
        step_types: StepTypes | None = None,
        points: float | None = None,
    ) -> Dispatched:
        workers = await self._workers()
        adverts: dict[str, HostAdvert] = {}
        if self.adverts is not None:
            adverts = await self.adverts(workers)
            workers = self.placement.eligible_workers(job_type, workers, adverts)
        # Asked before this batch counts as sent: a host's answer is never taken to include it.
        self._ask_loads()
        # Each step on a host that runs its type, by load; a step that ran on a live eligible
        # host goes back there. One call per host.
        spread = self.placement.spread(
            job_type, starts, sticky, workers, adverts, self.loads, step_types, self._on_loop
        )
        shares = spread.shares
        names = list(shares)
        calls = [
            self.routes.worker(name).start_steps(
                self.controller,
                job_key,
                job_id,
                job_type,
                pack_starts(
                    shares[name],
                    urgency=self._moves(name, adverts),
                    positions=self._reads_positions(name, adverts),
                ),
                points,
            )
            for name in names
        ]
        dispatched = Dispatched(undelivered=spread.unplaced, error=spread.error)
        answers = await asyncio.gather(*calls, return_exceptions=True)
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer  # cancelled: not a host's answer
                dispatched.undelivered.extend(shares[name])
                dispatched.error = answer
                continue
            dispatched.results.extend(answer)
            dispatched.hosts[name] = [start.step_id for start in shares[name]]
        return dispatched

    def _on_loop(self, step_type: str) -> bool:
        """Whether `step_type`'s steps perform on a worker host's event loop (async), as this
        host's registry knows the class; a type it does not know counts as synchronous."""
        known = self._kinds.get(step_type)
        if known is None:
            try:
                step_class = self.registry.resolve(step_type, TypeKind.STEP)
            except TypeRegistryError:
                return False
            runs_async = issubclass(step_class, JobStep) and step_class.is_async()
            known = self._kinds[step_type] = runs_async
        return known

    def _reads_positions(self, name: str, adverts: Mapping[str, HostAdvert]) -> bool:
        if self.adverts is None:
            return True  # tests without adverts: every host is this release
        return reads_positions(adverts.get(name))

    def _moves(self, name: str, adverts: Mapping[str, HostAdvert]) -> bool:
        """Whether worker host `name` takes urgent starts and hands back queued runs (a host
        that has not advertised is taken as an older release, without)."""
        advert = adverts.get(name)
        if advert is None:
            return self.adverts is None  # tests without adverts: every host is this release
        return moves_work(advert)

    async def give_up(self, job_key: JobKey, job_id: str, shares: Mapping[str, float]) -> list[str]:
        adverts = await self.adverts(list(shares)) if self.adverts is not None else {}
        # A draining host has left `workers` (it takes no new work) but is asked all the
        # same: its queued runs are exactly what must move.
        reachable = set(self.routes.reachable)
        names = [n for n in shares if n in reachable and self._moves(n, adverts)]
        calls = [
            self.routes.worker(name).give_up_queued(job_key, job_id, shares[name]) for name in names
        ]
        given: list[str] = []
        for name, answer in zip(
            names, await asyncio.gather(*calls, return_exceptions=True), strict=True
        ):
            if isinstance(answer, BaseException):
                log.info("worker host %s kept its queued runs: %s", name, answer)
                continue
            given.extend(answer)
        return given

    def _ask_loads(self) -> None:
        """Ask every worker host its load, in the background, at most every cadence and only
        while there is a choice: a batch never waits for it."""
        workers = self.routes.workers
        if len(workers) < 2 or (self._asking is not None and not self._asking.done()):
            return
        now = self.clock.now().timestamp()
        if self.loads.due(now):
            asked = self.loads.asking(now, workers)
            self._asking = asyncio.get_running_loop().create_task(self._read_loads(asked))

    async def _read_loads(self, asked: dict[str, int]) -> None:
        names = list(asked)
        answers = await asyncio.gather(
            *(self.routes.worker(name).load() for name in names), return_exceptions=True
        )
        for name, answer in zip(names, answers, strict=True):
            try:
                runs, capacity = answer  # type: ignore[misc]  # an error: TypeError, skipped below
                self.loads.answered(name, WorkerLoad(int(runs), int(capacity)), asked[name])
            except (TypeError, ValueError):
                # No answer, or not one of this release (an older host has no `load`): the
                # last answer stands.
                continue

    async def check_placement(
        self, job_key: JobKey, job_type: str, step_types: Sequence[str] = ()
    ) -> None:
        workers = await self._workers()
        if self.adverts is not None:
            adverts = await self.adverts(workers)
            workers = self.placement.eligible_workers(job_type, workers, adverts)
            for step_type in step_types:
                self.placement.step_hosts(job_type, step_type, workers, adverts)

    async def prioritize(self, job_key: JobKey, job_id: str, points: float) -> None:
        names = self.routes.reachable
        calls = [self.routes.worker(name).prioritize(job_key, job_id, points) for name in names]
        for name, answer in zip(
            names, await asyncio.gather(*calls, return_exceptions=True), strict=True
        ):
            if isinstance(answer, BaseException):  # its queued runs keep their old priority
                log.info("worker host %s kept the job's old priority: %s", name, answer)

    async def stop_steps(self, request: StopRequest) -> StopResult:
        names = self.routes.reachable  # a draining host's runs are stopped too
        calls = [self.routes.worker(name).stop_steps(request) for name in names]
        merged = StopResult()
        silent: list[BaseException] = []
        for name, answer in zip(
            names, await asyncio.gather(*calls, return_exceptions=True), strict=True
        ):
            if isinstance(answer, BaseException):
                log.warning("worker host %s did not answer a stop: %s", name, answer)
                silent.append(answer)
                continue
            merged.stopping.extend(answer.stopping)
            merged.hosts[name] = list(answer.stopping)
        if silent:
            # Its runs may still work: none of its steps may be taken as not running. The job
            # tells every host again (a stop is idempotent); a host that is gone has left the
            # routing table by then.
            raise HostError(f"{len(silent)} worker host(s) did not answer the stop: {silent[0]}")
        if request.step_ids is not None:
            merged.not_running = sorted(set(request.step_ids) - set(merged.stopping))
        return merged

    async def locate(self, job_key: JobKey, job_id: str) -> dict[str, str]:
        names = self.routes.reachable  # a draining host's runs are where they are
        calls = [self.routes.worker(name).held_steps(job_key, job_id) for name in names]
        held: dict[str, str] = {}
        answers = await asyncio.gather(*calls, return_exceptions=True)
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning("worker host %s did not say which runs it holds: %s", name, answer)
                continue
            held.update(dict.fromkeys(answer, name))
        return held

    async def unheld(
        self, job_key: JobKey, job_id: str, by_host: Mapping[str, Sequence[str]]
    ) -> list[str]:
        reachable = set(self.routes.reachable)
        names = [name for name in by_host if name in reachable]
        calls = [
            self.routes.worker(name).running_steps(job_key, job_id, list(by_host[name]))
            for name in names
        ]
        gone: list[str] = []
        for name, answer in zip(
            names, await asyncio.gather(*calls, return_exceptions=True), strict=True
        ):
            if isinstance(answer, BaseException):
                continue  # no answer: its runs may live
            _, running = answer
            held = set(running)
            gone.extend(step_id for step_id in by_host[name] if step_id not in held)
        return gone

    async def stop_and_wait(self, request: StopRequest, within: float) -> SettledStops:
        """Every worker host stops its runs of the steps and waits for them. A step a host
        that did not answer may run is timed out, never taken as not running."""
        calls = [
            self.routes.worker(name).stop_and_wait(request, within)
            for name in self.routes.reachable
        ]
        merged = SettledStops()
        silent = False
        for answer in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(answer, BaseException):
                log.warning("a worker host did not answer a drain: %s", answer)
                silent = True
                continue
            merged.settled.extend(answer.settled)
            merged.timed_out.extend(answer.timed_out)
        if silent and request.step_ids is not None:
            answered = {report.step_id for report in merged.settled}
            merged.timed_out = sorted(set(request.step_ids) - answered)
        return merged


class _Recent(OrderedDict[tuple[JobKey, str], str]):
    """The controller host of recently dispatched jobs; old entries fall off (they are hints:
    any live controller host takes a job over)."""

    def __init__(self, size: int = 10_000) -> None:
        super().__init__()
        self.size = size

    def __setitem__(self, key: tuple[JobKey, str], value: str) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class RayReporter:
    """Sends step outcomes to the controller host of their job."""

    def __init__(self, routes: Routes, adverts: AdvertsOf | None = None) -> None:
        self.routes = routes
        self.adverts = adverts
        """What the controller hosts advertise, so that each is sent reports in the shape its
        release reads; None takes every host as this release (tests)."""
        self.controllers = _Recent()

    async def reads_decisions(self, controller: str) -> bool:
        """Whether controller host `controller` reads a stored decision in a report (one that
        has not advertised is taken as the previous release, which reads a flag there)."""
        if self.adverts is None:
            return True
        names = self.routes.controllers
        adverts = await self.adverts(names if controller in names else [*names, controller])
        return reads_decisions(adverts.get(controller))

    async def _packed(
        self, names: Iterator[str], reports: Sequence[StepReport]
    ) -> AsyncIterator[tuple[str, list[PackedReport]]]:
        """Each host of `names`, with `reports` packed as its release reads them."""
        for name in names:
            yield name, pack_reports(reports, decisions=await self.reads_decisions(name))

    async def report(self, job_key: JobKey, job_id: str, reports: Sequence[StepReport]) -> None:
        name = self.controllers.get((job_key, job_id))

        def candidates() -> Iterator[str]:
            if name is not None:
                yield name
            # The others only once the known one failed (it has left the table by then).
            # The list is replaced, never changed in place, when the table changes.
            yield from (n for n in self.routes.controllers if n != name)

        last: BaseException | None = None
        async for candidate, packed in self._packed(candidates(), reports):
            try:
                await self.routes.controller(candidate).deliver(job_key, job_id, packed)
                if candidate != name:
                    self.controllers[(job_key, job_id)] = candidate  # it took the job over
                return
            except Exception as error:  # that host is gone: any live one takes the job over
                if isinstance(getattr(error, "cause", error), JobOperationError):
                    raise  # the job answered (its removal's finish failed): report again later
                last = error
        raise ConnectionError(f"no controller host took the outcomes of job {job_id}: {last}")
