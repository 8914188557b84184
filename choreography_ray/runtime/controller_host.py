"""The controller host: a node's jobs managers and job activations, as a Ray actor.

It performs what clients ask, one typed request each (`operations`: start, get, stop, resume,
remove, drain, wait, list, ...), hears the outcomes worker hosts report, and takes part in
recovery (`controller_recovery`).
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Mapping
from typing import Any, TypeVar

from ..engine.context import EngineContext
from ..engine.manager import JobsManager
from ..engine.messages import PackedReport
from ..jobs.errors import OwnedElsewhereError
from ..jobs.registry import default_registry
from ..jobs.state import JobKey, JobOwner
from ..placement.capability import PLAN_STORAGE, hosts_of_type_have
from ..placement.choice import Placement
from ..recovery.liveness import owner_alive
from ..recovery.rehydration import Rehydration
from .adverts import Adverts, delete_advert
from .autoscaling import AutoscaleRequests
from .constants import controller_name
from .control_calls import control_store_call
from .controller_recovery import ControllerRecovery
from .dispatch import RayDispatcher
from .draining import Drains
from .host import Host
from .host_process import rss_kb
from .metrics import Metrics
from .operations import Deliver, Operation, checked
from .previous_release import PreviousReleaseCalls
from .storage_hook import hooked_storage
from .worker_host import WorkerHost

T = TypeVar("T")


class ControllerHost(Host, PreviousReleaseCalls):
    """Jobs managers and job activations of one node."""

    def __init__(self, namespace: str, node_id: str) -> None:
        super().__init__(namespace, node_id, controller_name(node_id))
        self.placement = Placement(self.options.job_director, self.options.step_director)
        self.adverts = Adverts(namespace, self.clock)
        self.dispatcher = RayDispatcher(self.routes, self.name, self.adverts.of, self.placement)
        self.me = JobOwner(host=self.name, activation_epoch=self.epoch)
        self.managers: dict[JobKey, JobsManager] = {}
        self.metrics = Metrics("controller")
        self.recovery = ControllerRecovery(self)
        self.drains = Drains(self)
        self.autoscaling = AutoscaleRequests(
            self,
            elected=lambda: self.recovery.elected,
            outstanding=lambda: sum(m.outstanding_steps for m in self.managers.values()),
            per_node=self.options.effective_max_parallel_steps,
            snapshot=lambda: self.recovery.membership.latest if self.recovery.membership else None,
            start_hosts_of=self._start_hosts_of,
        )
        self.partition = hooked_storage(self.provider.for_key, self.name)  # tests may wrap it

    async def _start(self) -> None:
        self.routes.on_dead(self.recovery.host_gone)
        self.routes.on_joined(self.recovery.hosts_joined)
        await super()._start()
        await self.recovery.watch_membership(WorkerHost)
        await self._refresh()
        self.recovery.start_sweeping()
        self.autoscaling.start()

    def _start_hosts_of(self, node_id: str) -> None:
        if self.recovery.membership is not None:
            self.recovery.membership.start_hosts_of(node_id)

    @property
    def elected(self) -> bool:
        return self.recovery.elected

    async def nodes_draining(self, drains: dict[str, float]) -> None:
        """Ray drains these nodes (`runtime/draining.py`)."""
        await self.drains.nodes_draining(drains)

    async def adopt(self, key: JobKey, job_id: str) -> None:
        """A job a controller host whose node drains handed to this one: recover it now."""
        await self.ready()
        await self.manager(key).adopt(job_id)

    async def hosts_lost(self, names: Mapping[str, str | None]) -> int:
        """Worker hosts that are gone: their steps are sent again (`ControllerRecovery`)."""
        return await self.recovery.hosts_lost(names)

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
        await self.recovery.recover(list(config.keys))
        return failed

    async def _plans_apart(self, job_type: str) -> bool:
        """Whether every host that may run `job_type` can read a plan stored apart: while an
        older release runs one, plans stay inline (rolling upgrades)."""
        if not self.routes.controllers and not self.routes.workers:
            await self.routes.refresh()
        live = [*self.routes.controllers, *self.routes.reachable]
        return hosts_of_type_have(live, await self.adverts.of(live), job_type, PLAN_STORAGE)

    async def _alive(self, owner: JobOwner) -> bool:
        return await owner_alive(owner, self.me, self._ping)

    async def _active_workers(self) -> frozenset[str]:
        """The worker hosts in the routing table (read off the loop, kept fresh), draining
        ones included: they live, and their runs renew their leases."""
        return frozenset(self.routes.reachable)

    async def _ping(self, host: str) -> int:
        return await self.routes.controller(host).ping()

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

    async def perform(self, operation: Operation[T]) -> T:
        """Perform a client's request (`runtime.operations`), dispatched by its type; a job
        another live controller host owns is asked of that host."""
        operation = checked(operation)
        await self.ready()
        try:
            return await operation.run(self)
        except OwnedElsewhereError as elsewhere:
            return await self.ask(elsewhere.host, operation)

    async def ask(self, host: str, operation: Operation[T]) -> T:
        return await self.routes.controller(host).ask(operation)

    def successor(self) -> str | None:
        if self.drains.leaving and (successors := self.drains.successors()):
            return successors[0]
        return None

    async def deliver(self, key: JobKey, job_id: str, packed: builtins.list[PackedReport]) -> None:
        """Step outcomes from a worker host, already durable."""
        await self.perform(Deliver(key, job_id, packed))

    async def outstanding_steps(self) -> int:
        """Steps of the running jobs here with no outcome yet: this host's part of the worker
        nodes the elected controller asks Ray's autoscaler for."""
        return self.autoscaling.outstanding()

    async def activations(self) -> int:
        """How many jobs this host runs now: its part of a controller's headroom."""
        return sum(len(manager.active_jobs) for manager in self.managers.values())

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
            "live_jobs": sum(len(manager.active_jobs) for manager in self.managers.values()),
            **self.recovery.stats(),
            **self.autoscaling.stats(),
            **self.drains.stats(),
            "rss_kb": rss_kb(),
            "pid": os.getpid(),
        }

    async def shutdown(self) -> None:
        self.fence.stop()
        await control_store_call(delete_advert, self.name, self.namespace)
        self._startup.close()
        self.recovery.close()
        self.autoscaling.close()
        for manager in self.managers.values():
            manager.close()
        self.routes.close()
        await self.provider.close()
