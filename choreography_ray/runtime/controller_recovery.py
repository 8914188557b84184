"""A controller host's part in recovery: the partitions it recovers (from the configuration
and the key catalog), the membership watch, the reconciliation sweep, and the steps of worker
hosts that were lost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from ..jobs.state import JobKey
from ..recovery.keys import KeyCatalogReader
from ..recovery.membership import Deaths
from ..recovery.retries import Partitions
from ..recovery.watch import MembershipWatch
from .constants import WORKER_PREFIX
from .controller_port import ControllerPort
from .membership import membership_watch

log = logging.getLogger("choreography_ray.runtime")


class ControllerRecovery:
    """What a controller host does for recovery, apart from serving its jobs."""

    def __init__(self, host: ControllerPort) -> None:
        self.host = host
        self.catalog: KeyCatalogReader | None = None
        self.partitions: Partitions[JobKey] = Partitions(
            self._rehydrate_partition, host.clock, what=f"{host.name}: rehydrating partition"
        )
        self.membership: MembershipWatch | None = None
        self.lost_steps = 0
        """Steps sent again (or counted stopped) because their worker host was lost."""
        self._deaths = Deaths()
        self.moved_runs = 0
        """Queued runs moved to worker hosts that joined."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    async def _rehydrate_partition(self, key: JobKey) -> None:
        await self.host.manager(key).rehydrate()

    async def recover(self, configured: list[JobKey]) -> None:
        """Recover the partitions the configuration names and those the key catalog finds
        unfinished jobs in (storage's, which survives a whole-cluster restart, and the user's
        key providers). A partition whose rehydration fails is retried alone."""
        host = self.host
        if self.catalog is None:
            self.catalog = KeyCatalogReader(
                host.provider, names=host.options.key_providers, clock=host.clock
            )
            # A source a pass missed is asked again on its own; what it finds then is recovered.
            self.catalog.found = self.partitions.recover
        found = await self.catalog.read()
        await self.partitions.recover(list(dict.fromkeys([*configured, *found.keys])))

    async def watch_membership(self, worker_class: type) -> None:
        """Start the membership watch (once): from its first reading on, a node that dies or
        joins and a host actor that is killed are noticed within `membership_interval`."""
        if self.membership is None:
            self.membership = membership_watch(self.host, worker_class)
            await self.membership.start()

    def start_sweeping(self) -> None:
        if self._sweeper is None and self.host.options.reconciliation_interval.total_seconds() > 0:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    @property
    def elected(self) -> bool:
        """Whether this controller host is the one the membership watch elects (the oldest
        live controller host): it runs the sweep and makes the autoscaler's request."""
        return self.membership is None or self.membership.elected

    def _sweeps(self) -> bool:
        """Whether this controller host runs the reconciliation sweep (a sweep twice is
        harmless)."""
        return self.elected

    async def _sweep_forever(self) -> None:
        """Every `reconciliation_interval`, on one controller host: claim and resume the
        unfinished jobs of every known partition that no live activation holds."""
        host = self.host
        every = host.options.reconciliation_interval.total_seconds()
        while True:
            await host.clock.sleep(every)
            if not self._sweeps():
                continue
            try:
                keys = set(host.managers)
                if self.catalog is not None:
                    keys.update((await self.catalog.read()).keys)
                for key in sorted(keys, key=lambda k: (k.scope, k.namespace)):
                    await host.manager(key).reconcile()
            except Exception:
                log.exception("%s: the reconciliation sweep failed; it runs again", host.name)

    def hosts_joined(self, names: list[str]) -> None:
        """Worker hosts joined (a node the autoscaler added, a host started again): every job
        here sends them work now, moving a share of the runs queued elsewhere."""
        workers = frozenset(n for n in names if n.startswith(WORKER_PREFIX))
        if workers:
            self._spawn(self._joined(workers))

    async def _joined(self, workers: frozenset[str]) -> None:
        moved = 0
        for manager in list(self.host.managers.values()):
            moved += await manager.workers_joined(workers)
        self.moved_runs += moved

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def host_gone(self, name: str, incarnation: str | None) -> None:
        """A worker host died (Ray said so on a call, or it left Ray's named actors): its
        steps are sent again at once. One that merely did not answer in time is not taken
        for dead: its runs may still be going."""
        if name.startswith(WORKER_PREFIX):
            self._spawn(self.hosts_lost({name: incarnation}))

    async def hosts_lost(self, names: Mapping[str, str | None]) -> int:
        """Worker hosts that are gone (died, killed, or their node was lost), each with the
        incarnation that died: every live job activation here sends the starts they took
        again, or counts them stopped for a job being stopped. Returns how many steps were
        affected.

        The routing table and the membership watch both tell of a death, at their own
        times. A killed host is started again under its name at once, and steps sent again
        after the first telling may go to the new incarnation: a second telling by name
        would take those from a live host and send them once more, to run twice (seen in the
        chaos soak: runs begun after their step's success was stored). So each incarnation's
        death is told once; one not known (None) is told every time."""
        lost = frozenset(
            name
            for name, incarnation in names.items()
            if name.startswith(WORKER_PREFIX) and self._deaths.first(incarnation)
        )
        if not lost:
            return 0
        affected = 0
        for manager in list(self.host.managers.values()):
            affected += await manager.hosts_lost(lost)
        self.lost_steps += affected
        return affected

    def stats(self) -> dict[str, Any]:
        watch = self.membership
        return {
            "lost_steps": self.lost_steps,
            "membership_lost": list(watch.lost) if watch is not None else [],
            "membership_passes": watch.passes if watch is not None else 0,
            "membership_started": list(watch.started) if watch is not None else [],
        }

    def close(self) -> None:
        self.partitions.close()
        if self.catalog is not None:
            self.catalog.close()
        for task in list(self._tasks):
            task.cancel()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.membership is not None:
            self.membership.close()
