"""Synchronous steps run as Ray tasks pinned to their worker host's node.

A `def perform` is CPU-bound work: it must not block the worker host's event loop, so it runs in
a Ray task with the step's declared resources, on the node of the host that runs the step. Its
context calls back to that host for checkpoints, progress and whether the run was stopped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import ray
from pydantic import BaseModel
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..engine.run_host import SyncRun
from ..jobs.registry import TypeKind, default_registry
from ..jobs.state import JobKey
from ..jobs.step import JobStep, StepContext

_CANCEL_POLL_SECONDS = 0.5


class TaskStepWork:
    """What the context of a synchronous step inside its Ray task calls: the worker host
    that runs the step (`StepWork`)."""

    def __init__(
        self,
        host: Any,
        job_key: JobKey,
        job_id: str,
        step_id: str,
        attempt: int,
        call_timeout: float,
    ) -> None:
        self.host = host
        self.call_timeout = call_timeout
        """Bound of each call back to the host (`host_call_timeout`): one that is gone does
        not hold the task forever."""
        self.job_key = job_key
        self.job_id = job_id
        self.step_id = step_id
        self.attempt = attempt
        self._cancelled = False
        self._checked = 0.0

    def _call(self, kind: str, value: Any) -> bool:
        cancelled = ray.get(
            self.host.step_callback.remote(self.job_key, self.job_id, self.step_id, kind, value),
            timeout=self.call_timeout,
        )
        self._cancelled = self._cancelled or bool(cancelled)
        self._checked = time.monotonic()
        return self._cancelled

    def checkpoint(self, state: BaseModel | None = None) -> None:
        self._call("checkpoint", state)

    def progress(self, percentage: float, message: str = "") -> None:
        self._call("progress", (percentage, message))

    @property
    def cancelled(self) -> bool:
        if not self._cancelled and time.monotonic() - self._checked > _CANCEL_POLL_SECONDS:
            self._call("cancelled", None)
        return self._cancelled

    async def wait_cancelled(self) -> None:
        raise TypeError("a synchronous step cannot await; check ctx.cancelled instead")

    def now(self) -> datetime:
        return datetime.now(UTC)


def _perform(
    modules: list[str],
    host: Any,
    step_type: str,
    state: BaseModel | None,
    job_key: JobKey,
    job_id: str,
    step_id: str,
    attempt: int,
    call_timeout: float,
) -> Any:
    from .config import import_modules

    import_modules(modules)
    step_class = default_registry.resolve(step_type, TypeKind.STEP)
    work = TaskStepWork(host, job_key, job_id, step_id, attempt, call_timeout)
    return step_class().perform(state, StepContext(work))


_perform_remote = ray.remote(_perform)


class RaySyncStepRunner:
    """Runs `def perform` in a Ray task on this node, with the step's resources."""

    def __init__(
        self,
        node_id: str,
        host: Any,
        *,
        modules: Callable[[], list[str]],
        call_timeout: float,
    ) -> None:
        self.node_id = node_id
        self.host = host
        """The worker host's own actor handle, passed to each task: looking the host up by
        name would cost every step a blocking call to Ray's control store."""
        self.modules = modules
        """The job modules the host imported: the task imports them too (read from the host,
        not from Ray's control store, which would block the host's loop for every step)."""
        self.call_timeout = call_timeout
        self.in_flight = 0

    async def run(self, step: JobStep[Any, Any, Any], state: BaseModel | None, run: SyncRun) -> Any:
        resources = dict(type(step).resources)
        options: dict[str, Any] = {
            "scheduling_strategy": NodeAffinitySchedulingStrategy(self.node_id, soft=False),
            "num_cpus": resources.pop("num_cpus", 1),
            "max_retries": 0,
        }
        if "num_gpus" in resources:
            options["num_gpus"] = resources.pop("num_gpus")
        if "memory" in resources:
            options["memory"] = resources.pop("memory")
        if resources:
            options["resources"] = resources
        ref = _perform_remote.options(**options).remote(
            self.modules(),
            self.host,
            type(step).name,
            state,
            run.key.job_key,
            run.key.job_id,
            run.key.step_id,
            run.attempt,
            self.call_timeout,
        )
        run.cancel_work = lambda: ray.cancel(ref)
        self.in_flight += 1
        try:
            return await ref
        except ray.exceptions.TaskCancelledError:
            raise asyncio.CancelledError() from None
        except ray.exceptions.RayTaskError as error:
            cause = error.cause
            if isinstance(cause, BaseException):
                raise cause from None
            raise
        finally:
            self.in_flight -= 1
            run.cancel_work = None

    def close(self) -> None:
        """Nothing to release: tasks belong to Ray."""
