"""An in-process cluster: the engine with its managers and one worker, no Ray.

Tests (yours and ours) run whole job lifecycles here in milliseconds, with a `FakeClock` that
they move by hand, and can crash the "cluster" — drop every activation and run without writing
anything — and bring it back from storage.

    cluster = InProcessCluster()
    async with cluster:
        result = await cluster.start(MyJob, MyRequest(...))
        state = await cluster.wait(result.job_id)
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from ..engine.clock import Clock, FakeClock, settle
from ..engine.context import EngineContext
from ..engine.job import JobStartResult
from ..engine.manager import JobsManager
from ..engine.messages import SettledStops, StepReport, StepStart, StopRequest, StopResult
from ..engine.ports import Dispatched
from ..engine.results import ResultSource, as_completed, gather, in_item_order, typed
from ..engine.run_host import SyncStepRunner
from ..engine.step_types import StepTypes
from ..engine.worker import StepWorker
from ..jobs.errors import JobNotFoundError, NoEligibleJobWorker
from ..jobs.functions import JobFunction, StepFunction, job_class
from ..jobs.job import Job
from ..jobs.mapping import MapItems, MapJob, MapRequest, check_window
from ..jobs.options import JobsOptions
from ..jobs.registry import TypeRegistry, default_registry
from ..jobs.results import ItemResult
from ..jobs.state import JobKey, JobState, check_job_id
from ..recovery import Rehydration
from ..storage.protocols import JobsStorage
from ..storage.provider import StorageProvider
from ..storage.schemes import open_storage


class InProcessCluster:
    """Managers per (scope, namespace) and worker hosts (one by default), wired directly to
    each other. A worker host can be lost (`lose_worker`) and added (`add_worker`)."""

    def __init__(
        self,
        storage: str | StorageProvider | None = None,
        *,
        options: JobsOptions | None = None,
        registry: TypeRegistry | None = None,
        clock: Clock | None = None,
        max_parallel_steps: int | None = None,
        wrap_storage: Any = None,
        workers: int = 1,
    ) -> None:
        self.registry = registry or default_registry
        self.options = options or JobsOptions()
        self.clock = clock if clock is not None else FakeClock()
        if isinstance(storage, StorageProvider):
            self.provider = storage
        else:
            url = storage or f"memory://in-process-{uuid.uuid4().hex}"
            self.provider = open_storage(url, registry=self.registry, options=self.options)
        self.max_parallel_steps = max_parallel_steps
        self.wrap_storage = wrap_storage
        self._storages: dict[JobKey, JobsStorage] = {}
        self.managers: dict[JobKey, JobsManager] = {}
        self.workers: dict[str, StepWorker] = {}
        for index in range(workers):
            self.add_worker(f"worker-{index}")
        self._turn = 0
        self.dispatch_fault: BaseException | None = None
        self.plans_apart: Callable[[str], Awaitable[bool]] | None = None
        """Whether every host of a job type could read a plan stored apart (rolling upgrades:
        set it to answer False as while an older release runs)."""
        self.placement_fault: BaseException | None = None
        """Raised when a job asks, before preparing its steps, whether a worker qualifies."""
        self.report_fault: BaseException | None = None
        self.start_batches: list[int] = []
        self.sent: list[tuple[str, str]] = []
        self.draining: set[str] = set()
        """Worker hosts whose node drains: no start goes there (`drain_worker`)."""
        """(worker host, step id) of every start sent, in order."""

    # -- wiring ---------------------------------------------------------------------------------

    def storage(self, key: JobKey | None = None) -> JobsStorage:
        key = key or JobKey()
        storage = self._storages.get(key)
        if storage is None:
            storage = self.provider.for_key(key)
            if self.wrap_storage is not None:
                storage = self.wrap_storage(storage)
            self._storages[key] = storage
        return storage

    def manager(self, key: JobKey | None = None) -> JobsManager:
        key = key or JobKey()
        manager = self.managers.get(key)
        if manager is None:
            manager = self.managers[key] = JobsManager(
                EngineContext(
                    key=key,
                    storage=self.storage(key),
                    registry=self.registry,
                    options=self.options,
                    clock=self.clock,
                    dispatcher=self,
                    active_hosts=self.active_hosts,
                    plans_apart=self._plans_apart,
                ),
                recovery=Rehydration,
            )
        return manager

    @property
    def worker(self) -> StepWorker:
        """The first worker host (the only one unless the cluster was given more)."""
        return next(iter(self.workers.values()))

    async def join_worker(self, name: str | None = None) -> StepWorker:
        """A worker host joins a running cluster: every manager hears of it, as the routing
        table tells them on Ray, and sends it work."""
        worker = self.add_worker(name)
        for manager in list(self.managers.values()):
            await manager.workers_joined(frozenset({worker.host}))
        return worker

    def add_worker(self, name: str | None = None) -> StepWorker:
        """Start a worker host (a new incarnation when `name` was lost before)."""
        name = name or f"worker-{len(self.workers)}"
        worker = self.workers[name] = StepWorker(
            storage_for=self.storage,
            registry=self.registry,
            options=self.options,
            clock=self.clock,
            reporter=self,
            max_parallel_steps=self.max_parallel_steps,
            sync_runner=SyncStepRunner(),
            host=name,
            activation_id=uuid.uuid4().hex,
            peers=self,
        )
        return worker

    async def lose_worker(self, name: str, *, tell: bool = True) -> None:
        """The worker host dies: its runs end unwritten and unreported. With `tell`, every
        manager hears of it, as the membership watch tells them on Ray."""
        worker = self.workers.pop(name)
        await worker.close()
        if tell:
            await self.hosts_lost({name})

    async def drain_worker(self, name: str) -> int:
        """Ray drains the worker host's node: it takes no new start, and every manager moves
        the runs of its jobs queued there to the other hosts. Returns how many moved."""
        self.draining.add(name)
        moved = 0
        for manager in list(self.managers.values()):
            moved += await manager.hosts_draining(frozenset({name}))
        return moved

    async def partition_worker(self, name: str) -> StepWorker:
        """The worker host is declared dead while its process runs on (a partition, a frozen
        node): it leaves the cluster and every manager sends its steps again elsewhere, but
        its runs go on, and may still write and report. Returns it, for the test to close."""
        worker = self.workers.pop(name)
        await self.hosts_lost({name})
        return worker

    async def hosts_lost(self, names: set[str]) -> int:
        affected = 0
        for manager in list(self.managers.values()):
            affected += await manager.hosts_lost(frozenset(names))
        return affected

    # StepDispatcher
    async def start_steps(
        self,
        job_key: JobKey,
        job_id: str,
        job_type: str,
        starts: Sequence[StepStart],
        sticky: Mapping[str, str],
        step_types: StepTypes | None = None,
    ) -> Dispatched:
        if self.dispatch_fault is not None:
            raise self.dispatch_fault
        if not self.workers:
            raise NoEligibleJobWorker("no worker host is running in this cluster")
        self.start_batches.append(len(starts))
        names = [name for name in self.workers if name not in self.draining] or list(self.workers)
        shares: dict[str, list[StepStart]] = {}
        for start in starts:
            host = sticky.get(start.step_id)
            if host not in names:
                host = names[self._turn % len(names)]
                self._turn += 1
            shares.setdefault(host, []).append(start)
            self.sent.append((host, start.step_id))
        dispatched = Dispatched()
        for host, part in shares.items():
            dispatched.results.extend(
                await self.workers[host].start_steps(job_key, job_id, job_type, part)
            )
            dispatched.hosts[host] = [start.step_id for start in part]
        return dispatched

    async def stop_steps(self, request: StopRequest) -> StopResult:
        merged = StopResult()
        for name, worker in list(self.workers.items()):
            answer = await worker.stop_steps(request)
            merged.stopping.extend(answer.stopping)
            merged.hosts[name] = list(answer.stopping)
        if request.step_ids is not None:
            merged.not_running = sorted(set(request.step_ids) - set(merged.stopping))
        return merged

    async def active_hosts(self) -> frozenset[str]:
        """The worker hosts alive now (the watchdog's membership)."""
        return frozenset(self.workers)

    async def locate(self, job_key: JobKey, job_id: str) -> dict[str, str]:
        return {
            step_id: name
            for name, worker in self.workers.items()
            for step_id in worker.held(job_key, job_id)
        }

    async def unheld(
        self, job_key: JobKey, job_id: str, by_host: Mapping[str, Sequence[str]]
    ) -> list[str]:
        gone: list[str] = []
        for name, step_ids in by_host.items():
            worker = self.workers.get(name)
            if worker is not None:
                held = set(worker.running(job_key, job_id, step_ids))
                gone.extend(s for s in step_ids if s not in held)
        return gone

    async def give_up(self, job_key: JobKey, job_id: str, shares: Mapping[str, float]) -> list[str]:
        given: list[str] = []
        for name, share in shares.items():
            worker = self.workers.get(name)
            if worker is not None:
                given.extend(worker.give_up(job_key, job_id, share))
        return given

    # StepPeers
    async def running(
        self, host: str, job_key: JobKey, job_id: str, step_ids: Sequence[str]
    ) -> tuple[str, list[str]]:
        worker = self.workers.get(host)
        if worker is None:
            raise ConnectionError(f"host {host} is gone")
        return worker.activation_id, worker.running(job_key, job_id, step_ids)

    async def _plans_apart(self, job_type: str) -> bool:
        return True if self.plans_apart is None else await self.plans_apart(job_type)

    async def check_placement(
        self, job_key: JobKey, job_type: str, step_types: Sequence[str] = ()
    ) -> None:
        if self.placement_fault is not None:
            raise self.placement_fault

    async def stop_and_wait(self, request: StopRequest, within: float) -> SettledStops:
        answers = await asyncio.gather(
            *(worker.stop_and_wait(request, within) for worker in list(self.workers.values()))
        )
        merged = SettledStops()
        for answer in answers:
            merged.settled.extend(answer.settled)
            merged.timed_out.extend(answer.timed_out)
        return merged

    # JobReporter
    async def report(self, job_key: JobKey, job_id: str, reports: Sequence[StepReport]) -> None:
        if self.report_fault is not None:
            raise self.report_fault
        await self.manager(job_key).deliver(job_id, reports)

    # -- what tests do --------------------------------------------------------------------------

    async def __aenter__(self) -> InProcessCluster:
        await self.provider.initialize()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for manager in self.managers.values():
            manager.close()
        for worker in self.workers.values():
            await worker.close()
        await self.provider.close()

    async def start(
        self,
        job_type: type[Job[Any]] | JobFunction[Any],
        request: BaseModel,
        *,
        key: JobKey | None = None,
        job_id: str | None = None,
    ) -> JobStartResult:
        """Start a job (a `Job` class or a `@job` function), as `Jobs.start` does: a caller's
        `job_id` is checked first, so an id the client would refuse is refused here too
        (`InvalidJobIdError`)."""
        if job_id is not None:
            check_job_id(job_id)
        return await self.manager(key).start(job_class(job_type), request, job_id=job_id)

    async def map(
        self,
        function: StepFunction[Any],
        items: Iterable[Any],
        *,
        key: JobKey | None = None,
        job_id: str | None = None,
        name: str | None = None,
        max_active_steps: int | None = None,
        stages: Callable[[Any], int] | None = None,
    ) -> JobStartResult:
        """Start one job with a step of `function` per item, as `Jobs.map` does: the items
        are checked and drawn a chunk at a time (`MapItems`), then planned by the job."""
        if job_id is not None:
            check_job_id(job_id)
        window = check_window(max_active_steps)
        mapped = MapItems.of(function, items, self.registry, stages)
        request = MapRequest(step=mapped.step, items=mapped.count, name=name or "")
        return await self.manager(key).start(
            MapJob,
            request,
            job_id=job_id,
            steps=mapped.details(self.registry),
            max_active_steps=window,
        )

    def results(self, job_id: str, key: JobKey | None = None) -> AsyncGenerator[ItemResult, None]:
        """Each item's `(index, result or ItemFailed)` in item order, as `Jobs.results`
        reads them; between two reads of an item still running the cluster settles."""
        return typed(in_item_order(self._results(job_id, key)), self.registry)

    def as_completed(
        self, job_id: str, key: JobKey | None = None
    ) -> AsyncGenerator[ItemResult, None]:
        """Each item's outcome as it is stored, as `Jobs.as_completed` reads them."""
        return typed(as_completed(self._results(job_id, key)), self.registry)

    async def gather(
        self, job_id: str, key: JobKey | None = None, *, return_exceptions: bool = False
    ) -> list[Any]:
        """Every item's result as one list, as `Jobs.gather` returns it."""
        source = self._results(job_id, key)
        return await gather(source, self.registry, return_exceptions=return_exceptions)

    def _results(self, job_id: str, key: JobKey | None) -> ResultSource:
        manager = self.manager(key)
        steps = self.storage(key).steps
        return ResultSource.stored(steps, job_id, lambda: manager.get(job_id), self.settle)

    async def settle(self) -> None:
        """Run until nothing moves on by itself: steps that finish at once have finished,
        their outcomes are written and counted; steps blocked on something else keep waiting."""
        quiet = 0
        for _ in range(100_000):
            await asyncio.sleep(0)
            workers = self.workers.values()
            busy = any(w.busy for w in workers) or any(m.busy for m in self.managers.values())
            quiet = 0 if busy else quiet + 1
            if quiet >= 25:
                return
            if busy and any(w.sync_runner.in_flight for w in workers):
                await asyncio.sleep(0.001)  # a synchronous step is working in a thread
        raise TimeoutError("the in-process cluster did not settle")

    async def wait(self, job_id: str, key: JobKey | None = None) -> JobState | None:
        """Settle, then the job's stored state (None once a finished job was cleared)."""
        await self.settle()
        try:
            return await self.manager(key).get(job_id)
        except JobNotFoundError:
            return None

    async def crash(self) -> None:
        """Lose every process: activations vanish, runs end unwritten, nothing is reported."""
        names = list(self.workers)
        for worker in self.workers.values():
            await worker.close()
        for manager in self.managers.values():
            manager.close()
        self.managers.clear()
        self.workers.clear()
        for name in names:
            self.add_worker(name)
        await settle()

    async def advance(self, seconds: float) -> None:
        if not isinstance(self.clock, FakeClock):
            raise TypeError("advance needs a FakeClock")
        await self.settle()  # timers started by what just happened join before time moves
        await self.clock.advance(seconds)
        await self.settle()
