"""The host actors: the only Ray actors the job system creates.

A controller host runs jobs managers and job activations; a worker host runs step activations
and the node's step throttle. Both are named, detached, one per role per node, pinned to their
node, and addressable from any driver. Everything they know comes from storage and the
cluster configuration, so a host that dies is replaced by a fresh one that reads it back.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import ray

from ..engine.clock import SystemClock
from ..engine.context import EngineContext
from ..engine.job import JobStartResult
from ..engine.manager import JobsManager
from ..engine.messages import (
    PackedReport,
    PackedStart,
    StartResult,
    StepReport,
    StepStart,
    StopRequest,
    StopResult,
    exceptional,
    pack_reports,
    pack_starts,
    unpack_reports,
    unpack_starts,
)
from ..engine.worker import StepWorker
from ..jobs.errors import OwnedElsewhereError, ShuttingDownError
from ..jobs.registry import Payload, TypeKind, default_registry
from ..jobs.state import JobKey, JobOwner, JobState
from ..storage.protocols import JobQuery
from .config import import_modules, read_config
from .constants import controller_name, worker_name
from .metrics import Metrics
from .remote_storage import RemoteMemoryStorage, open_cluster_storage
from .sync_steps import RaySyncStepRunner

log = logging.getLogger("choreography_ray.runtime")


class _Ids(logging.Filter):
    """Gives every record the job and step ids the format names ("-" when it has none)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.job_id = getattr(record, "job_id", "-")
        record.step_id = getattr(record, "step_id", "-")
        return True


def _configure_logging() -> None:
    """Our own messages at INFO, with job and step ids as fields; other libraries at WARNING."""
    handler = logging.StreamHandler()
    handler.addFilter(_Ids())
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s job=%(job_id)s step=%(step_id)s %(message)s"
        )
    )
    ours = logging.getLogger("choreography_ray")
    if not any(isinstance(f, _Ids) for h in ours.handlers for f in h.filters):
        ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False


_GC_THRESHOLDS = (50_000, 20, 20)
"""Young-generation collections after 50,000 allocations, not Python's 700."""


def _tune_gc() -> None:
    """Collect cycles less often than Python's defaults, and never scan start-up objects.

    A host allocates several objects per step while holding thousands of live records; with
    the default thresholds the collector ran so often that it took about a third of the
    worker host's CPU in the fan-out benchmark (2.2 s against 1.4 s for 10,000 steps, same
    run). The engine makes few reference cycles, so garbage still goes at once, by reference
    counting; what the collector finds later costs memory only briefly.
    """
    gc.set_threshold(*_GC_THRESHOLDS)
    gc.freeze()


def _config(namespace: str) -> Any:
    config = read_config(namespace)
    if config is None:
        raise ShuttingDownError(
            f"no choreography configuration in Ray namespace {namespace!r}; start hosts with "
            "choreography_ray.connect(...) or `choreography up`"
        )
    return config


def _rss_kb() -> int:
    """Resident memory now (not the peak), from /proc where there is one."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        import os

        return pages * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return 0


class _Routes:
    """Finds host actors by name, and remembers which ones answered."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._handles: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        handle = self._handles.get(name)
        if handle is None:
            handle = ray.get_actor(name, namespace=self.namespace)
            self._handles[name] = handle
        return handle

    def forget(self, name: str) -> None:
        self._handles.pop(name, None)

    def alive_names(self, prefix: str) -> list[str]:
        names = []
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if isinstance(entry, dict):
                if entry.get("namespace") != self.namespace:
                    continue
                name = entry.get("name", "")
            else:
                name = entry
            if name.startswith(prefix):
                names.append(name)
        return sorted(names)


class RayDispatcher:
    """Sends a job's starts to the worker hosts, in batches, and its stops to all of them."""

    def __init__(self, routes: _Routes, controller: str) -> None:
        self.routes = routes
        self.controller = controller
        self._turn = 0

    def _workers(self) -> list[str]:
        names = self.routes.alive_names("choreography:worker:")
        if not names:
            from ..jobs.errors import NoEligibleJobWorker

            raise NoEligibleJobWorker("no worker host is running in this cluster")
        return names

    async def start_steps(
        self, job_key: JobKey, job_id: str, job_type: str, starts: Sequence[StepStart]
    ) -> list[StartResult]:
        workers = self._workers()
        # Spread a batch over the worker hosts, one call per host.
        shares: dict[str, list[StepStart]] = {}
        for index, start in enumerate(starts):
            name = workers[(self._turn + index) % len(workers)]
            shares.setdefault(name, []).append(start)
        self._turn += len(starts)
        calls = [
            self.routes.get(name).start_steps.remote(
                self.controller, job_key, job_id, job_type, pack_starts(part)
            )
            for name, part in shares.items()
        ]
        results: list[StartResult] = []
        for answer in await asyncio.gather(*calls):
            results.extend(answer)
        return results

    async def stop_steps(self, request: StopRequest) -> StopResult:
        calls = [
            self.routes.get(name).stop_steps.remote(request)
            for name in self.routes.alive_names("choreography:worker:")
        ]
        merged = StopResult()
        for answer in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(answer, BaseException):
                log.warning("a worker host did not answer a stop: %s", answer)
                continue
            merged.stopping.extend(answer.stopping)
        if request.step_ids is not None:
            merged.not_running = sorted(set(request.step_ids) - set(merged.stopping))
        return merged


class _Host:
    """What both roles share: identity, configuration, job modules and storage."""

    def __init__(self, namespace: str, node_id: str, name: str) -> None:
        _configure_logging()
        _tune_gc()
        self.namespace = namespace
        self.node_id = node_id
        self.name = name
        self.epoch = time.time_ns()
        """Tells this host apart from an earlier one of the same name (job ownership)."""
        self.routes = _Routes(namespace)
        config = _config(namespace)
        self.modules, _ = import_modules(config.modules)
        self.options = config.jobs_options()
        self.provider = open_cluster_storage(
            config.storage, namespace=namespace, modules=config.modules, options=self.options
        )

    async def ping(self) -> int:
        return self.epoch

    async def _import_new_modules(self) -> tuple[Any, list[str]]:
        """Import the job modules added to the configuration; the configuration and failures."""
        config = _config(self.namespace)
        new = [m for m in config.modules if m not in self.modules]
        imported, failed = import_modules(new)
        self.modules += imported
        if imported and isinstance(self.provider, RemoteMemoryStorage):
            await self.provider.import_modules(imported)
        return config, failed


class ControllerHost(_Host):
    """Jobs managers and job activations of one node."""

    def __init__(self, namespace: str, node_id: str) -> None:
        super().__init__(namespace, node_id, controller_name(node_id))
        self.clock = SystemClock()
        self.dispatcher = RayDispatcher(self.routes, self.name)
        self.me = JobOwner(host=self.name, activation_epoch=self.epoch)
        self.managers: dict[JobKey, JobsManager] = {}
        self.metrics = Metrics("controller")
        self._keys: set[JobKey] = set()
        self._ready: asyncio.Task[None] | None = None

    async def _start(self) -> None:
        await self.provider.initialize()
        await self.refresh()

    async def ready(self) -> int:
        """Wait until storage is open and known partitions were rehydrated; the host's epoch."""
        if self._ready is None:
            self._ready = asyncio.get_running_loop().create_task(self._start())
        await asyncio.shield(self._ready)
        return self.epoch

    async def refresh(self) -> list[str]:
        """Read the configuration again: import new job modules, recover new partitions.

        Returns the modules that failed to import, with the reasons."""
        config, failed = await self._import_new_modules()
        for key in config.keys:
            if key not in self._keys:
                self._keys.add(key)
                await self.manager(key).rehydrate()
        return failed

    async def _alive(self, owner: JobOwner) -> bool:
        if owner.host == self.name:
            return owner.activation_epoch == self.epoch
        try:
            epoch = await self.routes.get(owner.host).ping.remote()
        except Exception:
            self.routes.forget(owner.host)
            return False
        return bool(epoch == owner.activation_epoch)

    def manager(self, key: JobKey) -> JobsManager:
        manager = self.managers.get(key)
        if manager is None:
            manager = self.managers[key] = JobsManager(
                EngineContext(
                    key=key,
                    storage=self.provider.for_key(key),
                    registry=default_registry,
                    options=self.options,
                    clock=self.clock,
                    dispatcher=self.dispatcher,
                    owner=self.me,
                    owner_alive=self._alive,
                    on_status=self.metrics.job_status,
                )
            )
            self._keys.add(key)
        return manager

    # -- what clients ask -----------------------------------------------------------------------

    async def start(
        self, key: JobKey, job_type: str, request: Payload, job_id: str | None
    ) -> JobStartResult:
        await self.ready()
        job_class = default_registry.resolve(job_type, TypeKind.JOB)
        typed = default_registry.load(request, TypeKind.REQUEST)
        result = await self.manager(key).start(job_class, typed, job_id=job_id)  # type: ignore[arg-type]
        self.metrics.job_started(job_type, result.succeeded)
        return result

    async def get(self, key: JobKey, job_id: str) -> JobState:
        await self.ready()
        return await self.manager(key).get(job_id)

    async def wait(self, key: JobKey, job_id: str, within: float) -> JobState | None:
        """The job's state once it finishes, or as it stands after `within` seconds."""
        await self.ready()
        return await self.manager(key).wait_finished(job_id, within)

    async def list(self, key: JobKey, query: JobQuery) -> list[JobState]:
        await self.ready()
        return await self.manager(key).list(query)

    async def _owned(self, key: JobKey, job_id: str, operation: str, *args: Any) -> Any:
        await self.ready()
        try:
            return await getattr(self.manager(key), operation)(job_id, *args)
        except OwnedElsewhereError as elsewhere:
            owner = self.routes.get(elsewhere.host)
            return await getattr(owner, operation).remote(key, job_id, *args)

    async def stop(self, key: JobKey, job_id: str) -> None:
        return await self._owned(key, job_id, "stop")

    async def resume(self, key: JobKey, job_id: str) -> Any:
        return await self._owned(key, job_id, "resume")

    async def remove(self, key: JobKey, job_id: str) -> None:
        return await self._owned(key, job_id, "remove")

    async def deliver(self, key: JobKey, job_id: str, packed: list[PackedReport]) -> None:
        """Step outcomes from a worker host, already durable."""
        reports = unpack_reports(packed)
        self.metrics.outcomes(reports)
        return await self._owned(key, job_id, "deliver", reports)

    async def stats(self) -> dict[str, Any]:
        """Peak memory and the storage writes of released job activations (benchmarks)."""
        import resource

        writes = {"job_writes": 0, "step_batches": 0, "step_rows": 0}
        for manager in self.managers.values():
            for name, count in manager.writes.items():
                writes[name] += count
        return {
            "rss_peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            **writes,
            "rss_kb": _rss_kb(),
        }

    async def rehydrate(self, key: JobKey) -> None:
        await self.ready()
        await self.manager(key).rehydrate()

    async def shutdown(self) -> None:
        for manager in self.managers.values():
            manager.close()
        await self.provider.close()


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

    def __init__(self, routes: _Routes) -> None:
        self.routes = routes
        self.controllers = _Recent()

    async def report(self, job_key: JobKey, job_id: str, reports: Sequence[StepReport]) -> None:
        name = self.controllers.get((job_key, job_id))
        packed = pack_reports(reports)

        def candidates() -> Iterator[str]:
            if name is not None:
                yield name
            # Listing the hosts asks Ray's control store: only once the known one failed.
            yield from (n for n in self.routes.alive_names("choreography:controller:") if n != name)

        last: BaseException | None = None
        for candidate in candidates():
            try:
                await self.routes.get(candidate).deliver.remote(job_key, job_id, packed)
                return
            except Exception as error:  # that host is gone: any live one takes the job over
                self.routes.forget(candidate)
                last = error
        raise ConnectionError(f"no controller host took the outcomes of job {job_id}: {last}")


class WorkerHost(_Host):
    """Step activations of one node, and its throttle."""

    def __init__(
        self, namespace: str, node_id: str, max_parallel_steps: int | None, index: int = 0
    ) -> None:
        super().__init__(namespace, node_id, worker_name(node_id, index))
        self.reporter = RayReporter(self.routes)
        self.metrics = Metrics("worker")
        self.worker = StepWorker(
            storage_for=self.provider.for_key,
            registry=default_registry,
            options=self.options,
            clock=SystemClock(),
            reporter=self.reporter,
            max_parallel_steps=max_parallel_steps,
            sync_runner=RaySyncStepRunner(node_id, namespace, self.name),
            node_id=node_id,
            activation_id=str(self.epoch),
        )
        self.worker.metrics = self.metrics
        self._ready: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[None] | None = None

    async def ready(self) -> int:
        if self._ready is None:
            self._ready = asyncio.get_running_loop().create_task(self.provider.initialize())
        await asyncio.shield(self._ready)
        return self.epoch

    async def refresh(self) -> list[str]:
        """Import job modules added to the configuration; the ones that failed, with reasons."""
        _, failed = await self._import_new_modules()
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_metrics())
        return failed

    async def _flush_metrics(self) -> None:
        """Hand counted step events to Ray every second, so the last ones are never held."""
        while True:
            await asyncio.sleep(1.0)
            self.metrics.flush()

    async def start_steps(
        self,
        controller: str,
        job_key: JobKey,
        job_id: str,
        job_type: str,
        starts: list[PackedStart],
    ) -> list[StartResult]:
        """Accept a batch of starts. Only the results of starts that did not simply start
        come back: the job takes a start with no result as started."""
        await self.ready()
        self.reporter.controllers[(job_key, job_id)] = controller
        results = await self.worker.start_steps(job_key, job_id, job_type, unpack_starts(starts))
        return exceptional(results)

    async def stop_steps(self, request: StopRequest) -> StopResult:
        await self.ready()
        return await self.worker.stop_steps(request)

    async def step_callback(
        self, job_key: JobKey, job_id: str, step_id: str, kind: str, value: Any
    ) -> bool:
        """Checkpoint, progress and cancellation checks from synchronous steps in Ray tasks."""
        return self.worker.callback(job_key, job_id, step_id, kind, value)

    async def stats(self) -> dict[str, Any]:
        """Peak memory, parallelism and the step writes of this worker (benchmarks)."""
        import resource

        return {
            "active_runs": self.worker.active_runs,
            "peak_parallel": self.worker.peak_parallel,
            "max_parallel_steps": self.worker.max_parallel_steps,
            "rss_peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "rss_kb": _rss_kb(),
            **self.worker.write_stats(),
        }

    async def shutdown(self) -> None:
        await self.worker.close()
        await self.provider.close()
