"""The elected controller host's resource request to Ray's autoscaler, and the worker nodes it
gives back (placement/autoscale.py says how many and why).

Every `membership_interval` (at least a second) the elected controller host asks each
controller host how many steps of its running jobs have no outcome yet, and when the number of
worker nodes they need changes it calls `ray.autoscaler.sdk.request_resources` with one
`choreography_worker` bundle per node — with none once nothing is outstanding, so the cluster
is never left pinned up. Only the elected host asks: a request replaces the one before it,
whoever made it. The call writes to Ray's control store, so it runs off the event loop.

While an autoscaler runs, a worker-only node whose hosts have run nothing for
`worker_idle_timeout` is given back when fewer worker nodes are wanted than have hosts: it is
marked retired (so no host is started there again) and its worker hosts leave, which lets the
autoscaler see it idle and remove it. When more nodes are wanted again, a retired node still
there gets its hosts back before a new one is asked for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..placement.autoscale import Demand, Idleness, bundles, to_restore, to_retire
from ..recovery.membership import ClusterSnapshot
from .config import mark_retired, retired_nodes
from .constants import host_node
from .control_calls import control_store_call
from .controller_port import ControllerPort

log = logging.getLogger("choreography_ray.runtime")


def autoscaler_runs() -> bool:
    """Whether Ray's autoscaler runs for this cluster (its v1 monitor writes its status to
    the control store; v2 is Ray's own flag): only then are idle nodes given back."""
    try:
        from ray.autoscaler.v2.utils import is_autoscaler_v2

        if is_autoscaler_v2():
            return True
    except Exception:  # an older Ray, or no answer: look for v1's status
        pass
    from ray.experimental import internal_kv

    return bool(internal_kv._internal_kv_exists(b"__autoscaling_status"))


def request_worker_nodes(nodes: int) -> None:
    """Ask Ray's autoscaler for `nodes` worker nodes in all (blocking: the control store)."""
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=bundles(nodes))


class AutoscaleRequests:
    """Keeps the autoscaler's resource request to what the unfinished steps need."""

    def __init__(
        self,
        host: ControllerPort,
        elected: Callable[[], bool],
        outstanding: Callable[[], int],
        per_node: int,
        snapshot: Callable[[], ClusterSnapshot | None] = lambda: None,
        start_hosts_of: Callable[[str], None] = lambda node_id: None,
        request: Callable[[int], None] = request_worker_nodes,
        autoscaler: Callable[[], bool] = autoscaler_runs,
    ) -> None:
        """`snapshot` is the membership watch's latest reading (which nodes live);
        `start_hosts_of` starts a node's hosts again."""
        self.host = host
        self.elected = elected
        self.outstanding = outstanding
        self.snapshot = snapshot
        self.start_hosts_of = start_hosts_of
        self.request = request
        self.autoscaler = autoscaler
        self.demand = Demand.of(per_node, host.options.autoscale_max_worker_nodes)
        self.every = max(1.0, host.options.membership_interval.total_seconds())
        # Readings three checks apart say nothing of the time between them.
        self.idleness = Idleness.of(gap=3 * self.every)
        self.retired: list[str] = []
        """Every node given back, in order (tests, stats)."""
        self.requests: list[int] = []
        """Every number of nodes asked for, in order (tests, stats)."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None and self.demand.cap > 0:
            self._task = asyncio.get_running_loop().create_task(self._keep())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _keep(self) -> None:
        while True:
            await self.host.clock.sleep(self.every)
            try:
                await self.check()
            except Exception:
                log.exception("%s: the autoscaler's request was not updated", self.host.name)

    async def check(self) -> int | None:
        """Ask again if the nodes needed changed; the nodes needed (None: not elected)."""
        if not self.elected():
            self.demand.requested = None  # another host asks; if this one is elected again,
            return None  # it replaces whatever was asked meanwhile
        routes = self.host.routes
        others = [name for name in routes.controllers if name != self.host.name]
        answers: dict[str, int | None] = {self.host.name: self.outstanding()}
        for name, answer in zip(
            others,
            await asyncio.gather(
                *(routes.controller(name).outstanding_steps() for name in others),
                return_exceptions=True,
            ),
            strict=True,
        ):
            answers[name] = answer if isinstance(answer, int) else None
        nodes = self.demand.heard(answers, {self.host.name, *routes.controllers})
        if self.demand.due(nodes):
            await control_store_call(self.request, nodes)
            log.info(
                "%s: asked Ray's autoscaler for %d worker node(s) (%d step(s) outstanding)",
                self.host.name,
                nodes,
                sum(self.demand.answers.values()),
            )
            self.demand.requested = nodes
            self.requests.append(nodes)
        if await control_store_call(self.autoscaler):
            await self._fit(nodes)
        return nodes

    async def _fit(self, wanted: int) -> None:
        """Give back idle worker nodes beyond `wanted`, or take back retired ones."""
        routes = self.host.routes
        controllers = {host_node(name) for name in routes.controllers}
        hosts: dict[str, list[str]] = {}
        for name in routes.reachable:  # a drained node idles too
            node = host_node(name)
            if node not in controllers:  # a node that runs controllers stays whole
                hosts.setdefault(node, []).append(name)
        names = [name for node_hosts in hosts.values() for name in node_hosts]
        loads = await asyncio.gather(
            *(routes.worker(name).load() for name in names), return_exceptions=True
        )
        busy = dict.fromkeys(hosts, False)
        for name, load in zip(names, loads, strict=True):
            if not isinstance(load, tuple) or load[0]:  # runs, or no answer: busy
                busy[host_node(name)] = True
        idle = self.idleness.seen(busy, self.host.clock.now().timestamp())
        timeout = self.host.options.worker_idle_timeout.total_seconds()
        for node in to_retire(idle, wanted, timeout):
            await self._retire(node, hosts[node])
        snapshot = self.snapshot()
        retired = await control_store_call(retired_nodes, self.host.namespace)
        alive = {n for n in retired if snapshot is not None and snapshot.alive(n)}
        for node in sorted(retired - alive):  # removed by the autoscaler: forget the mark
            await control_store_call(mark_retired, self.host.namespace, node, False)
        for node in to_restore(sorted(alive - set(hosts)), len(hosts), wanted):
            await control_store_call(mark_retired, self.host.namespace, node, False)
            self.start_hosts_of(node)
            log.info("%s: node %s gets its hosts back: more work came", self.host.name, node)

    async def _retire(self, node: str, names: list[str]) -> None:
        await control_store_call(mark_retired, self.host.namespace, node)
        answers = await asyncio.gather(
            *(self.host.routes.worker(name).retire() for name in names), return_exceptions=True
        )
        if any(answer is False for answer in answers):  # work arrived meanwhile: it stays
            await control_store_call(mark_retired, self.host.namespace, node, False)
            self.idleness.worked(node)
            return
        self.retired.append(node)
        log.info(
            "%s: node %s ran no step for %s; its hosts left it so that Ray's autoscaler can "
            "remove it",
            self.host.name,
            node,
            self.host.options.worker_idle_timeout,
        )

    def stats(self) -> dict[str, Any]:
        return {"autoscale_requested": self.demand.requested, "retired_nodes": self.retired}
