"""The client as coroutines (`AsyncJobs`, `jobs.aio`): what `Jobs` runs, and what async
drivers await.

Each call checks its arguments, builds one typed request (`operations`) and awaits the
controller host's answer: Ray's object references are awaitable, so no thread waits on a call.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from typing import Any, TypeVar

import ray
from pydantic import BaseModel

from ..engine.job import JobStartResult
from ..engine.priority import check_priority
from ..jobs.concurrency import check_key
from ..jobs.errors import (
    DrainOutcome,
    JobNotFoundError,
    ResumeJobSuccess,
    StartJobError,
    StartJobFailed,
)
from ..jobs.functions import JobFunction, StepFunction, job_class
from ..jobs.job import Job, new_job_id
from ..jobs.mapping import MapItems, MapJob, MapRequest, check_window
from ..jobs.registry import default_registry
from ..jobs.results import ItemResult
from ..jobs.state import DEFAULT_NAMESPACE, DEFAULT_SCOPE, JobKey, JobState
from ..recovery.explicit import RehydrationSummary, check_timeout
from ..storage.protocols import JobQuery, StepCounts
from .arguments import check_job_id, check_query, check_step_ids, job_key
from .config import merge, require_config, write_config
from .constants import NAMESPACE
from .controller_routing import ControllerRouting
from .directory import actor_names
from .operations import (
    CountSteps,
    Drain,
    Get,
    ListJobs,
    Operation,
    Rehydrate,
    Remove,
    Resume,
    RetryFailed,
    SetPriority,
    Start,
    Stop,
    Wait,
)
from .packages import runtime_packages
from .remote import is_host_gone, project_error
from .results import ResultCalls
from .wire import send

T = TypeVar("T")

_WAIT_CHUNK = 10.0
"""Seconds one call of `wait` may be held by the controller host before it asks again."""

_STARTED_MEMORY = 10_000
"""How many ids of jobs it started a client remembers, to tell "cleared" from "never was"."""


class AsyncJobs(ResultCalls):
    """Start, watch, stop, resume and remove jobs, and read a map's results, as coroutines:
    the client itself."""

    def __init__(self, namespace: str = NAMESPACE) -> None:
        self.namespace = namespace
        self._routing = ControllerRouting(namespace)
        self._started: OrderedDict[tuple[JobKey, str], None] = OrderedDict()
        self._remembered: set[tuple[str, JobKey]] = set()
        """(module, partition) pairs the cluster's configuration is known to hold: the
        configuration only grows, so a start of a known pair does not read it again."""

    # -- routing --------------------------------------------------------------------------------

    async def _ask(self, operation: Operation[T], *, job_type: str | None = None) -> T:
        """Have the controller host (one that runs `job_type`, when given) perform
        `operation`; once more on the host that runs now when the one this client knew died or
        was replaced (every request is keyed by a job id or reads, so asking again is safe)."""
        for attempt in (1, 2):
            routing = self._routing
            handle = routing.controller() if job_type is None else routing.controller_for(job_type)
            try:
                return await send(handle, operation)
            except ray.exceptions.RayError as error:
                if not is_host_gone(error):
                    raise project_error(error, operation.what) from None
                self._routing.forget()
                if attempt == 2:
                    raise project_error(error, operation.what) from None
        raise AssertionError("unreachable")

    async def _remember(self, module: str, key: JobKey) -> None:
        """Make every host know the module that defines a job's (or a step function's) type,
        and recover the job's partition."""
        if (module, key) in self._remembered:
            return
        config = require_config(self.namespace)
        modules = [] if module == "__main__" else [module]
        updated = merge(config, modules=modules, keys=[key], packages=runtime_packages())
        if updated is not config:
            write_config(updated, self.namespace)
            hosts = [
                ray.get_actor(name, namespace=self.namespace)
                for name in actor_names(self.namespace)
            ]
            try:
                await asyncio.gather(*(h.refresh.remote() for h in hosts))
            except ray.exceptions.RayError as error:
                raise project_error(error, "refreshing the hosts") from None
        self._remembered.add((module, key))

    # -- operations -----------------------------------------------------------------------------

    async def start(
        self,
        job_type: type[Job[Any]] | JobFunction[Any],
        request: BaseModel,
        *,
        job_id: str | None = None,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
        priority: int | None = None,
        concurrency_key: str | None = None,
    ) -> str:
        """Start a job (a `Job` class or a `@job` function); returns its id once the job is
        durable (and its steps dispatched, unless the job starts them in the background). With
        `job_id`, starting again returns that job instead of a second one. `priority`: higher
        goes first while jobs wait for workers; `concurrency_key`: the job's key under its
        class's `concurrency` limit (None: the class's, for both; docs/scheduling.md).

        Without `job_id` the client names the job itself, so that asking a replaced controller
        host again cannot start a second job."""
        key = job_key(scope, namespace)
        job_id = new_job_id() if job_id is None else check_job_id(job_id)
        priority = None if priority is None else check_priority(priority)
        concurrency_key = None if concurrency_key is None else check_key(concurrency_key)
        job_type = job_class(job_type)
        payload = default_registry.dump_request(request)
        await self._remember(job_type.__module__, key)
        operation = Start(
            key,
            job_type.name,
            payload,
            job_id,
            priority=priority,
            concurrency_key=concurrency_key,
        )
        return await self._start(operation)

    async def map(
        self,
        function: StepFunction[Any],
        items: Iterable[Any],
        *,
        name: str | None = None,
        job_id: str | None = None,
        max_active_steps: int | None = None,
        stages: Callable[[Any], int] | None = None,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> AsyncMapped:
        """Start one durable job that runs the `@step` function once per item; returns once
        its plan is saved (see `Jobs.map`). The items are drawn and checked here, a chunk at a
        time, before anything is sent."""
        window = check_window(max_active_steps)
        mapped = MapItems.of(function, items, default_registry, stages)
        return await self.start_map(
            function,
            mapped,
            name=name,
            job_id=job_id,
            max_active_steps=window,
            scope=scope,
            namespace=namespace,
        )

    async def start_map(
        self,
        function: StepFunction[Any],
        items: MapItems,
        *,
        name: str | None,
        job_id: str | None,
        max_active_steps: int | None,
        scope: str,
        namespace: str,
    ) -> AsyncMapped:
        """`map` of items already drawn and checked (`Jobs.map` draws them in its caller's
        thread)."""
        key = job_key(scope, namespace)
        job_id = new_job_id() if job_id is None else check_job_id(job_id)
        request = MapRequest(step=items.step, items=items.count, name=name or "")
        payload = default_registry.dump_request(request)
        await self._remember(function.__module__, key)
        operation = Start(key, MapJob.name, payload, job_id, items, max_active_steps)
        started = await self._start(operation)
        return AsyncMapped(self, started, scope=scope, namespace=namespace)

    async def _start(self, operation: Start) -> str:
        started = _started(await self._ask(operation, job_type=operation.job_type))
        self._started[(operation.key, started)] = None
        if len(self._started) > _STARTED_MEMORY:
            self._started.popitem(last=False)
        return started

    async def get(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> JobState:
        return await self._ask(Get(job_key(scope, namespace), check_job_id(job_id)))

    async def step_counts(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> StepCounts:
        """The job's step records per status as storage holds them, with the records that
        cannot be read counted apart (`.unreadable`): a job with any is never resumed."""
        return await self._ask(CountSteps(job_key(scope, namespace), check_job_id(job_id)))

    async def find(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> JobState | None:
        try:
            return await self.get(job_id, scope=scope, namespace=namespace)
        except JobNotFoundError:
            return None

    async def list(
        self,
        query: JobQuery | None = None,
        *,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> list[JobState]:
        key = job_key(scope, namespace)
        return await self._ask(ListJobs(key, check_query(query or JobQuery())))

    async def stop(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> None:
        await self._ask(Stop(job_key(scope, namespace), check_job_id(job_id)))

    async def drain(
        self,
        job_id: str,
        *,
        timeout: float = 30.0,  # noqa: ASYNC109 - the API's, as on Jobs; it bounds the host
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> DrainOutcome:
        """Stop the job and wait, up to `timeout` seconds, until every step that could still
        run has stopped, persisted its outcome and answered. `.result` is DRAINED only then
        (and `on_stopped` has run); TIMED_OUT names the steps that did not answer in
        `.not_drained`. The job cannot be resumed until its drain is complete."""
        key = job_key(scope, namespace)
        within = check_timeout(timeout)
        return await self._ask(Drain(key, check_job_id(job_id), within))

    async def resume(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> ResumeJobSuccess:
        return await self._ask(Resume(job_key(scope, namespace), check_job_id(job_id)))

    async def retry_failed(
        self,
        job_id: str,
        *,
        steps: Sequence[str] | None = None,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> tuple[str, ...]:
        """Run the failed steps of a job that completed with failures (or stopped, its stop
        finished) again, under their identities: every one, or those named in `steps`. Its
        successes stay as they are, and the failures run again replace theirs in its counts.
        Returns the ids of the steps run again; `RetryFailedRefused` says why not."""
        key = job_key(scope, namespace)
        named = None if steps is None else tuple(check_step_ids(steps))
        return await self._ask(RetryFailed(key, check_job_id(job_id), named))

    async def set_priority(
        self,
        job_id: str,
        priority: int,
        *,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        """Change a job's priority: stored with it, and its steps queued on worker hosts wait
        by it from now on."""
        key = job_key(scope, namespace)
        operation = SetPriority(key, check_job_id(job_id), check_priority(priority))
        await self._ask(operation)

    async def remove(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> None:
        await self._ask(Remove(job_key(scope, namespace), check_job_id(job_id)))

    async def rehydrate(
        self,
        *,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
        timeout: float = 60.0,  # noqa: ASYNC109 - the API's, as on Jobs; it bounds the host
    ) -> RehydrationSummary:
        """Resume the partition's interrupted jobs and finish its unfinished stops now, as
        after a restart; what the pass did once its jobs resumed, or, after `timeout` seconds,
        that it is still under way (the jobs keep resuming in the background)."""
        key = job_key(scope, namespace)
        return await self._ask(Rehydrate(key, check_timeout(timeout)))

    def _gone(self, key: JobKey, job_id: str) -> None:
        """A job found nowhere when a wait began: cleared, if this client started it; else it
        never existed here (or was removed before anyone asked), which is an error."""
        if (key, job_id) not in self._started:
            raise JobNotFoundError(job_id)

    async def events(
        self,
        job_id: str,
        *,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
        interval: float = 0.25,
    ) -> AsyncGenerator[JobState, None]:
        """The job's state each time its progress or status changes, until it is finished
        (terminal, or stopped for good); a job that is cleared ends the iteration. Raises
        JobNotFoundError for a job that is not there when the iteration begins (unless this
        client started it)."""
        key = job_key(scope, namespace)
        check_job_id(job_id)
        last: tuple[Any, ...] | None = None
        while True:
            state = await self.find(job_id, scope=scope, namespace=namespace)
            if state is None:
                if last is None:
                    self._gone(key, job_id)
                return
            mark = (state.status, state.progress.model_dump_json())
            if mark != last:
                last = mark
                yield state
            if state.is_finished:
                return
            await asyncio.sleep(interval)

    async def wait(
        self,
        job_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the API's, as on Jobs
        progress: bool = False,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
        interval: float = 0.25,
    ) -> JobState | None:
        """Wait until the job is finished and return its last state, or None when the job was
        cleared (removed, or completed without keeping its state). `progress=True` shows a live
        progress bar, refreshed every `interval` seconds. Raises TimeoutError after `timeout`
        seconds, and JobNotFoundError for a job that is not there when the wait begins (unless
        this client started it: then it was cleared).

        The controller host holds each call until the job finishes (or the chunk of time
        passes), so the wait ends as the job does, without polling it."""
        from .progress import ProgressBar

        key = job_key(scope, namespace)
        check_job_id(job_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = False
        with ProgressBar(enabled=progress) as bar:
            while True:
                chunk = interval if progress else _WAIT_CHUNK
                if deadline is not None:
                    chunk = max(0.0, min(chunk, deadline - time.monotonic()))
                state = await self._ask(Wait(key, job_id, chunk))
                if state is None:
                    if not seen:
                        self._gone(key, job_id)
                    return None
                seen = True
                bar.update(state)
                if state.is_finished:
                    return state
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"job {job_id} did not finish within {timeout} s")


class AsyncMapped:
    """What `AsyncJobs.map` answers: the started map job's `job_id`, and its outcome as a
    map's caller reads it."""

    def __init__(self, jobs: AsyncJobs, job_id: str, *, scope: str, namespace: str) -> None:
        self.jobs = jobs
        self.job_id = job_id
        self.scope = scope
        self.namespace = namespace

    async def wait(self, *, timeout: float | None = None) -> JobState | None:  # noqa: ASYNC109
        """Wait until the job is finished (see `AsyncJobs.wait`)."""
        return await self.jobs.wait(
            self.job_id, timeout=timeout, scope=self.scope, namespace=self.namespace
        )

    def as_completed(self, *, interval: float = 0.25) -> AsyncGenerator[ItemResult, None]:
        """Each item's `(index, result or ItemFailed)` as it is stored (see
        `AsyncJobs.as_completed`)."""
        return self.jobs.as_completed(
            self.job_id, scope=self.scope, namespace=self.namespace, interval=interval
        )

    def __repr__(self) -> str:
        return f"AsyncMapped(job_id={self.job_id!r})"


def _started(result: JobStartResult) -> str:
    """The id of the started job, or the refusal as an exception. A job started before under
    the same id (the caller's, or the client's own asked again of a replaced host) is that job,
    not a second one."""
    if result.succeeded:
        return result.job_id
    if result.error in (
        StartJobError.ALREADY_BEEN_PREPARED,
        StartJobError.ALREADY_COMPLETED,
    ):
        return result.job_id  # the same id again: that job, not a second one
    name = result.error.name if result.error is not None else "UNKNOWN"
    detail = f": {result.reason}" if result.reason else ""
    error = StartJobFailed(
        f"job {result.job_id} did not start cleanly ({name}){detail}", code=result.error
    )
    error.job_id = result.job_id  # type: ignore[attr-defined]
    raise error
