"""The host actors: the only Ray actors the job system creates.

A controller host runs jobs managers and job activations; a worker host runs step activations
and the node's step throttle. Both are named, detached, one per role per node, pinned to their
node, and addressable from any driver. Everything they know comes from storage and the
cluster configuration, so a host that dies is replaced by a fresh one that reads it back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import ray

from ..engine.clock import SystemClock
from ..engine.context import EngineContext
from ..engine.job import JobStartResult
from ..engine.manager import JobsManager
from ..engine.messages import (
    PackedReport,
    PackedStart,
    SettledStops,
    StartResult,
    StopRequest,
    StopResult,
    exceptional,
    unpack_reports,
    unpack_starts,
)
from ..engine.worker import StepWorker
from ..jobs.errors import DrainOutcome, OwnedElsewhereError
from ..jobs.registry import Payload, TypeKind, default_registry
from ..jobs.state import JobKey, JobOwner, JobState
from ..placement.capability import PLAN_STORAGE, HostAdvert, hosts_of_type_have
from ..placement.choice import Placement
from ..recovery.explicit import RehydrationSummary, rehydrate_within
from ..recovery.keys import KeyCatalogReader
from ..recovery.liveness import owner_alive
from ..recovery.rehydration import Rehydration
from ..recovery.retries import Partitions, Startup
from ..recovery.watch import MembershipWatch
from ..storage.protocols import JobQuery, StepCounts
from ..testing.hooks import hooked_storage
from .adverts import Adverts, advertised_capabilities, delete_advert, node_of, write_advert
from .config import import_modules
from .constants import WORKER_PREFIX, controller_name, worker_name
from .directory import RayDirectory
from .dispatch import RayDispatcher, RayReporter
from .host_process import cluster_config, configure_logging, rss_kb, tune_gc
from .membership import membership_watch
from .metrics import Metrics
from .remote_storage import RemoteMemoryStorage, open_cluster_storage
from .routes import Routes
from .sync_steps import RaySyncStepRunner

log = logging.getLogger("choreography_ray.runtime")


class _Host:
    """What both roles share: identity, configuration, job modules and storage."""

    def __init__(self, namespace: str, node_id: str, name: str) -> None:
        configure_logging()
        tune_gc()
        self.namespace = namespace
        self.node_id = node_id
        self.name = name
        self.epoch = time.time_ns()
        """Tells this host apart from an earlier one of the same name (job ownership)."""
        config = cluster_config(namespace)
        self.modules, failed = import_modules(config.modules)
        self.failed_modules: dict[str, str] = _by_module(failed)
        """Modules this host could not import, with the reason: advertised, never fatal."""
        self.options = config.jobs_options()
        self.clock = SystemClock()
        self.routes = Routes(
            RayDirectory(namespace),
            timeout=self.options.host_call_timeout.total_seconds(),
            clock=self.clock,
        )
        self.provider = open_cluster_storage(
            config.storage, namespace=namespace, modules=config.modules, options=self.options
        )
        self._startup = Startup(self._start, self.clock, what=name)
        self._node: tuple[dict[str, str], dict[str, float]] | None = None

    async def ready(self) -> int:
        """Wait until the host has started (storage open, routing table read, and for a
        controller host known partitions rehydrated); the host's epoch. A start that failed
        is begun again by the next call, and retried meanwhile."""
        await self._startup.wait()
        return self.epoch

    async def _start(self) -> None:
        await self.provider.initialize()
        await self.routes.start()
        await self._advertise()

    def advert(self) -> HostAdvert:
        """What this host can run: the types its imports registered, and what failed; its
        node's labels and resources, for directors (read once: they do not change)."""
        if self._node is None:
            self._node = node_of(self.node_id)
        labels, resources = self._node
        return HostAdvert(
            labels=labels,
            resources=resources,
            name=self.name,
            node_id=self.node_id,
            job_types=default_registry.names(TypeKind.JOB),
            step_types=default_registry.names(TypeKind.STEP),
            failed_modules=self.failed_modules,
            capabilities=advertised_capabilities(),
        )

    async def _advertise(self) -> None:
        await asyncio.to_thread(lambda: write_advert(self.advert(), self.namespace))

    async def ping(self) -> int:
        return self.epoch

    async def _import_new_modules(self) -> tuple[Any, list[str]]:
        """Import the job modules added to the configuration; the configuration and failures."""
        config = await asyncio.to_thread(cluster_config, self.namespace)  # Ray's control store
        new = [m for m in config.modules if m not in self.modules]
        imported, failed = import_modules(new)
        self.modules += imported
        self.failed_modules = _by_module(failed)
        if imported and isinstance(self.provider, RemoteMemoryStorage):
            await self.provider.import_modules(imported)
        await self._advertise()
        return config, failed


def _by_module(failed: list[str]) -> dict[str, str]:
    """`import_modules`' failures ("module: reason") by module."""
    return dict(failure.split(": ", 1) if ": " in failure else (failure, "") for failure in failed)


class ControllerHost(_Host):
    """Jobs managers and job activations of one node."""

    def __init__(self, namespace: str, node_id: str) -> None:
        super().__init__(namespace, node_id, controller_name(node_id))
        self.placement = Placement(self.options.job_director, self.options.step_director)
        self.adverts = Adverts(namespace, self.clock)
        self.dispatcher = RayDispatcher(self.routes, self.name, self.adverts.of, self.placement)
        self.me = JobOwner(host=self.name, activation_epoch=self.epoch)
        self.managers: dict[JobKey, JobsManager] = {}
        self.metrics = Metrics("controller")
        self.catalog: KeyCatalogReader | None = None
        self.partitions: Partitions[JobKey] = Partitions(
            self._rehydrate_partition, self.clock, what=f"{self.name}: rehydrating partition"
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.lost_steps = 0
        """Steps sent again (or counted stopped) because their worker host was lost."""
        self.membership: MembershipWatch | None = None
        self.partition = hooked_storage(self.provider.for_key, self.name)  # tests may wrap it

    async def _start(self) -> None:
        self.routes.on_dead(self._host_gone)
        await super()._start()
        await self._watch_membership()
        await self._refresh()
        if self._sweeper is None and self.options.reconciliation_interval.total_seconds() > 0:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    def _sweeps(self) -> bool:
        """Whether this controller host runs the reconciliation sweep: the one the membership
        watch elects (the oldest live controller host; a sweep twice is harmless)."""
        return self.membership is None or self.membership.elected

    async def _sweep_forever(self) -> None:
        """Every `reconciliation_interval`, on one controller host: claim and resume the
        unfinished jobs of every known partition that no live activation holds."""
        every = self.options.reconciliation_interval.total_seconds()
        while True:
            await self.clock.sleep(every)
            if not self._sweeps():
                continue
            try:
                keys = set(self.managers)
                if self.catalog is not None:
                    keys.update((await self.catalog.read()).keys)
                for key in sorted(keys, key=lambda k: (k.scope, k.namespace)):
                    await self.manager(key).reconcile()
            except Exception:
                log.exception("%s: the reconciliation sweep failed; it runs again", self.name)

    async def _watch_membership(self) -> None:
        """Start the membership watch (once): from its first reading on, a node that dies or
        joins and a host actor that is killed are noticed within `membership_interval`."""
        if self.membership is None:
            self.membership = membership_watch(self, WorkerHost)
            await self.membership.start()

    def _membership_stats(self) -> dict[str, Any]:
        watch = self.membership
        if watch is None:
            return {"membership_lost": [], "membership_passes": 0, "membership_started": []}
        return {
            "membership_lost": list(watch.lost),
            "membership_passes": watch.passes,
            "membership_started": list(watch.started),
        }

    def _host_gone(self, name: str) -> None:
        """A worker host died (Ray said so on a call, or it left Ray's named actors): its
        steps are sent again at once. One that merely did not answer in time is not taken
        for dead: its runs may still be going."""
        if name.startswith(WORKER_PREFIX):
            task = asyncio.get_running_loop().create_task(self.hosts_lost({name}))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def hosts_lost(self, names: set[str]) -> int:
        """Worker hosts that are gone (died, killed, or their node was lost): every live job
        activation here sends the starts they took again, or counts them stopped for a job
        being stopped. Returns how many steps were affected. Called by the routing table and
        by the membership watch; a second call for the same loss finds nothing left."""
        lost = frozenset(n for n in names if n.startswith(WORKER_PREFIX))
        if not lost:
            return 0
        affected = 0
        for manager in list(self.managers.values()):
            affected += await manager.hosts_lost(lost)
        self.lost_steps += affected
        return affected

    async def refresh(self) -> list[str]:
        """Read the configuration again: import new job modules, recover new partitions.

        A partition whose rehydration fails is retried alone in the background and does not
        hold up the others. Returns the modules that failed to import, with the reasons."""
        await self.ready()  # recovery needs the storage open: a failed start is begun again
        return await self._refresh()

    async def _refresh(self) -> list[str]:
        """The partitions to recover: those the cluster's configuration names, and those the
        key catalog finds unfinished jobs in (storage's, which survives a whole-cluster
        restart, and the user's key providers)."""
        config, failed = await self._import_new_modules()
        if self.catalog is None:
            self.catalog = KeyCatalogReader(
                self.provider, names=self.options.key_providers, clock=self.clock
            )
        found = await self.catalog.read()
        await self.partitions.recover(list(dict.fromkeys([*config.keys, *found.keys])))
        return failed

    async def _rehydrate_partition(self, key: JobKey) -> None:
        await self.manager(key).rehydrate()

    async def _plans_apart(self, job_type: str) -> bool:
        """Whether every host that may run `job_type` can read a plan stored apart: while an
        older release runs one, plans stay inline (rolling upgrades)."""
        if not self.routes.controllers and not self.routes.workers:
            await self.routes.refresh()
        live = [*self.routes.controllers, *self.routes.workers]
        return hosts_of_type_have(live, await self.adverts.of(live), job_type, PLAN_STORAGE)

    async def _alive(self, owner: JobOwner) -> bool:
        return await owner_alive(owner, self.me, self._ping)

    async def _active_workers(self) -> frozenset[str]:
        """The worker hosts in the routing table (read off the loop, kept fresh)."""
        return frozenset(self.routes.workers)

    async def _ping(self, host: str) -> int:
        epoch: int = await self.routes.call(host, "ping")
        return epoch

    def manager(self, key: JobKey) -> JobsManager:
        manager = self.managers.get(key)
        if manager is None:
            manager = self.managers[key] = JobsManager(
                EngineContext(
                    key=key,
                    storage=self.partition(key),
                    registry=default_registry,
                    options=self.options,
                    clock=self.clock,
                    dispatcher=self.dispatcher,
                    plans_apart=self._plans_apart,
                    owner=self.me,
                    owner_alive=self._alive,
                    on_status=self.metrics.job_status,
                    active_hosts=self._active_workers,
                ),
                recovery=Rehydration,
            )
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

    async def step_counts(self, key: JobKey, job_id: str) -> StepCounts:
        await self.ready()
        return await self.manager(key).step_counts(job_id)

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
            return await self.routes.call(elsewhere.host, operation, key, job_id, *args)

    async def stop(self, key: JobKey, job_id: str) -> None:
        return await self._owned(key, job_id, "stop")

    async def resume(self, key: JobKey, job_id: str) -> Any:
        return await self._owned(key, job_id, "resume")

    async def remove(self, key: JobKey, job_id: str) -> None:
        return await self._owned(key, job_id, "remove")

    async def drain(self, key: JobKey, job_id: str, within: float) -> DrainOutcome:
        return await self._owned(key, job_id, "drain", within)

    async def deliver(self, key: JobKey, job_id: str, packed: list[PackedReport]) -> None:
        """Step outcomes from a worker host, already durable."""
        reports = unpack_reports(packed)
        self.metrics.outcomes(reports)
        return await self._owned(key, job_id, "deliver", reports)

    async def activations(self) -> int:
        """How many jobs this host runs now: its part of a controller's headroom."""
        return sum(len(manager.active_jobs()) for manager in self.managers.values())

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
            "lost_steps": self.lost_steps,
            "live_jobs": sum(len(manager.active_jobs) for manager in self.managers.values()),
            **self._membership_stats(),
            "rss_kb": rss_kb(),
        }

    async def rehydrate(self, key: JobKey, within: float) -> RehydrationSummary:
        """An explicit rehydration pass of the partition, summarized once its jobs resumed or
        after `within` seconds."""
        await self.ready()
        return await rehydrate_within(self.manager(key), within, self.clock)

    async def shutdown(self) -> None:
        await asyncio.to_thread(delete_advert, self.name, self.namespace)
        self._startup.close()
        self.partitions.close()
        for task in list(self._tasks):
            task.cancel()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.membership is not None:
            self.membership.close()
        for manager in self.managers.values():
            manager.close()
        self.routes.close()
        await self.provider.close()


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
            clock=self.clock,
            reporter=self.reporter,
            max_parallel_steps=max_parallel_steps,
            sync_runner=RaySyncStepRunner(
                node_id,
                ray.get_runtime_context().current_actor,
                modules=lambda: self.modules,
                call_timeout=self.options.host_call_timeout.total_seconds(),
            ),
            node_id=node_id,
            activation_id=str(self.epoch),
            host=self.name,
            peers=self,
        )
        self.worker.metrics = self.metrics
        self._flusher: asyncio.Task[None] | None = None

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

    async def load(self) -> tuple[int, int]:
        """The runs this host holds (performing and queued) and how many it performs at once:
        what dispatchers spread steps by. Plain ints, asked about once a second."""
        return self.worker.active_runs, self.worker.max_parallel_steps

    async def stop_steps(self, request: StopRequest) -> StopResult:
        await self.ready()
        return await self.worker.stop_steps(request)

    async def held_steps(self, job_key: JobKey, job_id: str) -> list[str]:
        """The steps of the job with a run here: a new activation of the job sends them back."""
        await self.ready()
        return self.worker.held(job_key, job_id)

    async def running_steps(
        self, job_key: JobKey, job_id: str, step_ids: list[str]
    ) -> tuple[str, list[str]]:
        """This host's activation id and which of the steps it runs: asked by another worker
        host before it starts a step whose record names this host."""
        return str(self.epoch), self.worker.running(job_key, job_id, step_ids)

    async def running(
        self, host: str, job_key: JobKey, job_id: str, step_ids: Sequence[str]
    ) -> tuple[str, list[str]]:
        """`StepPeers`: ask worker host `host` (bounded, through the routing table)."""
        answer: tuple[str, list[str]] = await self.routes.call(
            host, "running_steps", job_key, job_id, list(step_ids)
        )
        return answer

    async def stop_and_wait(self, request: StopRequest, within: float) -> SettledStops:
        await self.ready()
        return await self.worker.stop_and_wait(request, within)

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
            "rss_kb": rss_kb(),
            **self.worker.write_stats(),
        }

    async def shutdown(self) -> None:
        await asyncio.to_thread(delete_advert, self.name, self.namespace)
        self._startup.close()
        await self.worker.close()
        self.routes.close()
        await self.provider.close()
