"""The worker host: a node's step activations and its throttle, as a Ray actor."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import ray

from ..engine.limits import step_limits
from ..engine.messages import (
    PackedStart,
    SettledStops,
    StartResult,
    StopRequest,
    StopResult,
    exceptional,
    unpack_starts,
)
from ..engine.worker import StepWorker
from ..jobs.registry import default_registry
from ..jobs.state import JobKey
from .adverts import Adverts, delete_advert, node_of
from .constants import worker_name
from .control_calls import control_store_call
from .dispatch import RayReporter
from .host import Host
from .host_process import rss_kb
from .metrics import Metrics
from .sync_steps import RaySyncStepRunner

log = logging.getLogger("choreography_ray.runtime")


class WorkerHost(Host):
    """Step activations of one node, and its throttle."""

    def __init__(
        self,
        namespace: str,
        node_id: str,
        max_parallel_steps: int | None,
        index: int = 0,
        hosts: int = 1,
    ) -> None:
        """Worker host `index` of the node's `hosts`, which share the node's
        `max_parallel_steps` (None: derived from the node's CPUs)."""
        super().__init__(namespace, node_id, worker_name(node_id, index))
        self.reporter = RayReporter(self.routes, Adverts(namespace, self.clock).of)
        self.metrics = Metrics("worker")
        # The node's own CPUs, not this machine's: nodes of a test cluster share one machine.
        cpus = node_of(node_id)[1].get("CPU") or os.cpu_count()
        limits = step_limits(max_parallel_steps, cpus, hosts, index)
        self.worker = StepWorker(
            storage_for=self.provider.for_key,
            registry=default_registry,
            options=self.options,
            clock=self.clock,
            reporter=self.reporter,
            max_parallel_steps=limits.performing,
            max_parallel_sync_steps=limits.synchronous,
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
        self._drain: asyncio.Task[None] | None = None

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
        points: float | None = None,
    ) -> list[StartResult]:
        """Accept a batch of starts (`points`: the job's priority points, when it has any).
        Only the results of starts that did not simply start come back: the job takes a
        start with no result as started."""
        await self.ready()
        self.reporter.controllers[(job_key, job_id)] = controller
        unpacked = unpack_starts(starts)
        results = await self.worker.start_steps(job_key, job_id, job_type, unpacked, points)
        return exceptional(results, decisions=await self.reporter.reads_decisions(controller))

    async def load(self) -> tuple[int, int]:
        """The runs this host holds (performing and queued) and how many it performs at once:
        what dispatchers spread steps by. Plain ints, asked about once a second."""
        return self.worker.active_runs, self.worker.max_parallel_steps

    async def stop_steps(self, request: StopRequest) -> StopResult:
        await self.ready()
        return await self.worker.stop_steps(request)

    async def prioritize(self, job_key: JobKey, job_id: str, points: float) -> None:
        """The job's priority changed: its runs queued here wait by its new points."""
        await self.ready()
        self.worker.prioritize(job_key, job_id, points)

    async def held_steps(self, job_key: JobKey, job_id: str) -> list[str]:
        """The steps of the job with a run here: a new activation of the job sends them back."""
        await self.ready()
        return self.worker.held(job_key, job_id)

    async def give_up_queued(self, job_key: JobKey, job_id: str, share: float) -> list[str]:
        """Hand back a share of the job's queued runs, not started, for hosts that joined."""
        await self.ready()
        return self.worker.give_up(job_key, job_id, share)

    async def drain(self, deadline: float) -> float:
        """Ray drains this host's node, which goes at `deadline` (seconds since the epoch; 0:
        none): runs that are still here `step_stop_timeout` before it are stopped, so that
        they write their outcome and run again elsewhere before the node dies. Returns in
        how many seconds that is."""
        await self.ready()
        if not deadline:
            return -1.0  # no deadline: the queued runs moved; the rest finish here
        margin = self.options.step_stop_timeout.total_seconds()
        delay = max(0.0, deadline - time.time() - margin)
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._stop_at(delay))
        return delay

    async def _stop_at(self, delay: float) -> None:
        await asyncio.sleep(delay)
        stopped = self.worker.stop_all()
        log.warning(
            "worker host %s: its node goes soon; %d run(s) stopped, to run again elsewhere",
            self.name,
            stopped,
        )

    async def retire(self) -> bool:
        """Leave the node, idle, so that Ray's autoscaler can remove it (a 0-CPU actor keeps
        a node busy in its eyes): the host shuts down and its actor exits. Refused (False)
        while any run is here; the node is marked retired before this is asked."""
        if self.worker.active_runs or self.worker.busy:
            return False
        await self.shutdown()
        self._leaving = asyncio.get_running_loop().create_task(self._leave())
        return True

    async def _leave(self) -> None:
        await asyncio.sleep(0.1)  # the answer to `retire` goes out first
        ray.actor.exit_actor()  # an intended exit: Ray does not restart it

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
        return await self.routes.worker(host).running_steps(job_key, job_id, list(step_ids))

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
            "runs_done": self.worker.runs_done,
            "max_parallel_steps": self.worker.max_parallel_steps,
            "max_parallel_sync_steps": self.worker.max_parallel_sync_steps,
            "rss_peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "rss_kb": rss_kb(),
            "pid": os.getpid(),
            "ready_at": self.ready_at,
            **self.worker.writers.stats(),
        }

    async def shutdown(self) -> None:
        self.fence.stop()
        await control_store_call(delete_advert, self.name, self.namespace)
        self._startup.close()
        # The seed's deactivation: the work and its callbacks end before storage closes.
        await self.worker.deactivate(self.options.deactivation_timeout.total_seconds())
        self.routes.close()
        await self.provider.close()
