"""Ray's node drains, honoured: the notice an autoscaler (v2, KubeRay) or `ray drain-node` gives
before a node goes — a spot preemption, an idle termination — with the time it goes.

Every controller host's membership watch reads Ray's draining-node table; when a node begins
to drain, each controller host here:

- takes the node's worker hosts out of dispatch (no new step goes there) and moves every run
  of its jobs queued there, not started, to the hosts that stay, ahead of their waiting steps;
- if it is the elected controller, tells those worker hosts when the node goes: runs still
  there `step_stop_timeout` before the deadline are stopped, write their outcome, and run
  again elsewhere under the same identity, before the node dies rather than after Ray
  declares it dead;
- if its own node drains, hands each of its jobs to another controller host: ownership moves
  by compare-and-set on the job's record, and the new owner recovers the job from storage
  and finds its runs where they are (nothing runs twice).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

from ..engine.manager import JobsManager
from ..jobs.state import JobKey, JobOwner
from .constants import host_node
from .routes import Routes

log = logging.getLogger("choreography_ray.runtime")


class DrainingHost(Protocol):
    """What drains need of their controller host."""

    @property
    def name(self) -> str: ...

    @property
    def node_id(self) -> str: ...

    @property
    def routes(self) -> Routes: ...

    @property
    def managers(self) -> Mapping[JobKey, JobsManager]: ...

    @property
    def elected(self) -> bool: ...


class Drains:
    """A controller host's part in Ray's node drains."""

    def __init__(self, host: DrainingHost) -> None:
        self.host = host
        self.leaving = False
        """This host's own node drains: new jobs go to another controller host."""
        self.moved = 0
        """Queued runs moved off draining worker hosts."""
        self.drained: set[str] = set()
        """Draining worker hosts this host gives no new work and whose queued runs it moved."""
        self.handed_over: list[str] = []
        """Jobs this host handed to another, in order."""
        self.handover_seconds: float | None = None

    async def nodes_draining(self, drains: Mapping[str, float]) -> None:
        """Nodes Ray began to drain, with when each goes (seconds since the epoch, 0: none)."""
        host = self.host
        routes = host.routes
        workers = [name for name in routes.workers if host_node(name) in drains]
        if workers:
            routes.drain(workers)
            for manager in list(host.managers.values()):
                self.moved += await manager.hosts_draining(frozenset(workers))
            self.drained.update(workers)
            log.warning(
                "%s: worker host(s) %s drain; they take no new step (%d queued run(s) moved)",
                host.name,
                ", ".join(workers),
                self.moved,
            )
            if host.elected:
                for name in workers:
                    try:
                        await routes.worker(name).drain(drains[host_node(name)])
                    except Exception as error:  # gone already: its runs were lost with it
                        log.warning("%s: %s not told of its drain: %s", host.name, name, error)
        if host.node_id in drains:
            await self.hand_over(drains[host.node_id])

    def successors(self) -> list[str]:
        """The controller hosts that stay."""
        return [name for name in self.host.routes.controllers if name != self.host.name]

    async def hand_over(self, deadline: float) -> None:
        """This host's node goes: every job it runs moves to a controller host that stays."""
        self.leaving = True
        began = time.monotonic()
        successors = self.successors()
        if not successors:
            log.error(
                "%s: its node drains and no other controller host runs: its jobs stay until "
                "the node goes, then recovery takes them",
                self.host.name,
            )
            return
        owners: dict[str, JobOwner] = {}
        for name in successors:
            try:
                epoch = await self.host.routes.controller(name).ping()
            except Exception:
                continue
            owners[name] = JobOwner(host=name, activation_epoch=epoch)
        names = sorted(owners)
        turn = 0
        for key, manager in list(self.host.managers.items()):
            for job_id in list(manager.active_jobs):
                if not names:
                    break
                owner = owners[names[turn % len(names)]]
                turn += 1
                if await manager.hand_over(job_id, owner):
                    self.handed_over.append(job_id)
                    await self._adopt(owner.host, key, job_id)
        self.handover_seconds = time.monotonic() - began
        left = deadline - time.time() if deadline else float("inf")
        log.warning(
            "%s: its node drains (%.0f s left); %d job(s) handed over in %.2f s",
            self.host.name,
            left,
            len(self.handed_over),
            self.handover_seconds,
        )

    async def _adopt(self, successor: str, key: JobKey, job_id: str) -> None:
        try:
            await self.host.routes.controller(successor).adopt(key, job_id)
        except Exception as error:  # it owns the job: its next report or sweep recovers it
            log.warning("%s: %s did not adopt %s yet: %s", self.host.name, successor, job_id, error)

    def stats(self) -> dict[str, Any]:
        return {
            "moved_off_draining": self.moved,
            "drained_workers": sorted(self.drained),
            "handed_over": len(self.handed_over),
            "handover_seconds": self.handover_seconds,
        }
