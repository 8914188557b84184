"""The Jobs client: what a driver, a script or the command line uses.

    jobs = choreography_ray.connect(storage="sqlite:///.choreography/jobs.db")
    job_id = jobs.start(RebuildIndex, RebuildIndexRequest(...), scope="studio")
    state = jobs.wait(job_id, progress=True)

`connect` (runtime/connection.py) configures the cluster and returns a `Jobs`. Every call goes to
a controller host found by name, so another driver, or this one after a restart, sees the same
jobs; a client whose controller host was replaced finds the new one by name and goes on.
Arguments are checked here, before any remote call, and every failure reaches the caller as one
of the project's exceptions with a one-line message. `jobs.aio` offers the same calls as
coroutines.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

import ray
from pydantic import BaseModel

from ..engine.job import JobStartResult
from ..jobs.errors import (
    DrainOutcome,
    JobNotFoundError,
    ResumeJobSuccess,
    StartJobError,
    StartJobFailed,
)
from ..jobs.job import Job
from ..jobs.registry import default_registry
from ..jobs.state import DEFAULT_NAMESPACE, DEFAULT_SCOPE, JobKey, JobState
from ..placement.capability import import_failures
from ..recovery.explicit import RehydrationSummary, check_timeout
from ..storage.protocols import JobQuery, StepCounts
from .adverts import read_adverts
from .arguments import check_job_id, check_query, job_key
from .config import merge, require_config, write_config
from .constants import NAMESPACE
from .controller_routing import ControllerRouting
from .directory import actor_names
from .packages import runtime_packages
from .remote import is_host_gone, project_error

T = TypeVar("T")

_WAIT_CHUNK = 10.0
"""Seconds one call of `wait` may be held by the controller host before it asks again."""

_STARTED_MEMORY = 10_000
"""How many ids of jobs it started a client remembers, to tell "cleared" from "never was"."""


class Jobs:
    """Start, watch, stop, resume and remove jobs. Every call is synchronous; `aio` has the
    same as coroutines."""

    def __init__(self, namespace: str = NAMESPACE) -> None:
        self.namespace = namespace
        self.aio = AsyncJobs(self)
        self._routing = ControllerRouting(namespace)
        self._started: OrderedDict[tuple[JobKey, str], None] = OrderedDict()
        self._remembered: set[tuple[str, JobKey]] = set()
        """(module, partition) pairs the cluster's configuration is known to hold: the
        configuration only grows, so a start of a known pair does not read it again."""

    # -- routing --------------------------------------------------------------------------------

    def _call(self, what: str, method: str, *args: Any, job_type: str | None = None) -> Any:
        """`method` of the controller host (one that runs `job_type`, when given); once more
        on the host that runs now when the one this client knew died or was replaced (every
        call is keyed by a job id or reads, so asking again is safe)."""
        for attempt in (1, 2):
            routing = self._routing
            handle = routing.controller() if job_type is None else routing.controller_for(job_type)
            try:
                return ray.get(getattr(handle, method).remote(*args))
            except ray.exceptions.RayError as error:
                if not is_host_gone(error):
                    raise project_error(error, what) from None
                self._routing.forget()
                if attempt == 2:
                    raise project_error(error, what) from None
        raise AssertionError("unreachable")

    def _remember(self, job_type: type[Job[Any]], key: JobKey) -> None:
        """Make every host know the job's module and recover the job's partition."""
        module = job_type.__module__
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
                ray.get([h.refresh.remote() for h in hosts])
            except ray.exceptions.RayError as error:
                raise project_error(error, "refreshing the hosts") from None
        self._remembered.add((module, key))

    # -- operations -----------------------------------------------------------------------------

    def import_failures(self, job_type: str | None = None) -> list[str]:
        """The job modules hosts could not import, one line each naming the node, the host and
        the reason; with `job_type`, only those of hosts that cannot run that type."""
        adverts = read_adverts(self.namespace, actor_names(self.namespace))
        return import_failures(
            advert for advert in adverts.values() if job_type is None or not advert.hosts(job_type)
        )

    def start(
        self,
        job_type: type[Job[Any]],
        request: BaseModel,
        *,
        job_id: str | None = None,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> str:
        """Start a job; returns its id once the job is durable (and its steps dispatched,
        unless the job starts them in the background). With `job_id`, starting again returns
        that job instead of a second one.

        Without `job_id` the client names the job itself, so that asking a replaced controller
        host again cannot start a second job."""
        key = job_key(scope, namespace)
        job_id = uuid.uuid4().hex if job_id is None else check_job_id(job_id)
        payload = default_registry.dump_request(request)
        self._remember(job_type, key)
        result: JobStartResult = self._call(
            "jobs.start", "start", key, job_type.name, payload, job_id, job_type=job_type.name
        )
        started = _started(result)
        self._started[(key, started)] = None
        if len(self._started) > _STARTED_MEMORY:
            self._started.popitem(last=False)
        return started

    def get(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> JobState:
        key = job_key(scope, namespace)
        return self._call("jobs.get", "get", key, check_job_id(job_id))

    def step_counts(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> StepCounts:
        """The job's step records per status as storage holds them, with the records that
        cannot be read counted apart (`.unreadable`): a job with any is never resumed."""
        key = job_key(scope, namespace)
        return self._call("jobs.step_counts", "step_counts", key, check_job_id(job_id))

    def find(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> JobState | None:
        try:
            return self.get(job_id, scope=scope, namespace=namespace)
        except JobNotFoundError:
            return None

    def list(
        self,
        query: JobQuery | None = None,
        *,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> list[JobState]:
        key = job_key(scope, namespace)
        return self._call("jobs.list", "list", key, check_query(query or JobQuery()))

    def stop(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> None:
        key = job_key(scope, namespace)
        self._call("jobs.stop", "stop", key, check_job_id(job_id))

    def drain(
        self,
        job_id: str,
        *,
        timeout: float = 30.0,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> DrainOutcome:
        """Stop the job and wait, up to `timeout` seconds, until every step that could still
        run has stopped, persisted its outcome and answered. `.result` is DRAINED only then
        (and `on_stopped` has run); TIMED_OUT names the steps that did not answer in
        `.not_drained`. The job cannot be resumed until its drain is complete."""
        from ..recovery.explicit import check_timeout

        key = job_key(scope, namespace)
        within = check_timeout(timeout)
        return self._call("jobs.drain", "drain", key, check_job_id(job_id), within)

    def resume(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> ResumeJobSuccess:
        key = job_key(scope, namespace)
        return self._call("jobs.resume", "resume", key, check_job_id(job_id))

    def remove(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> None:
        key = job_key(scope, namespace)
        self._call("jobs.remove", "remove", key, check_job_id(job_id))

    def rehydrate(
        self,
        *,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
        timeout: float = 60.0,
    ) -> RehydrationSummary:
        """Resume the partition's interrupted jobs and finish its unfinished stops now, as
        after a restart; what the pass did once its jobs resumed, or, after `timeout` seconds,
        that it is still under way (the jobs keep resuming in the background)."""
        key = job_key(scope, namespace)
        within = check_timeout(timeout)
        return self._call("jobs.rehydrate", "rehydrate", key, within)

    def _gone(self, key: JobKey, job_id: str) -> None:
        """A job found nowhere when a wait began: cleared, if this client started it; else it
        never existed here (or was removed before anyone asked), which is an error."""
        if (key, job_id) not in self._started:
            raise JobNotFoundError(job_id)

    def events(
        self,
        job_id: str,
        *,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
        interval: float = 0.25,
    ) -> Iterator[JobState]:
        """The job's state each time its progress or status changes, until it is finished
        (terminal, or stopped for good); a job that is cleared ends the iteration. Raises
        JobNotFoundError for a job that is not there when the iteration begins (unless this
        client started it)."""
        key = job_key(scope, namespace)
        check_job_id(job_id)
        last: tuple[Any, ...] | None = None
        while True:
            state = self.find(job_id, scope=scope, namespace=namespace)
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
            time.sleep(interval)

    def wait(
        self,
        job_id: str,
        *,
        timeout: float | None = None,
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
                state = self._call("jobs.wait", "wait", key, job_id, chunk)
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


class AsyncJobs:
    """The client's calls as coroutines, for async drivers."""

    def __init__(self, jobs: Jobs) -> None:
        self._jobs = jobs

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def start(self, job_type: type[Job[Any]], request: BaseModel, **kwargs: Any) -> str:
        return await self._call(self._jobs.start, job_type, request, **kwargs)

    async def get(self, job_id: str, **kwargs: Any) -> JobState:
        return await self._call(self._jobs.get, job_id, **kwargs)

    async def step_counts(self, job_id: str, **kwargs: Any) -> StepCounts:
        return await self._call(self._jobs.step_counts, job_id, **kwargs)

    async def list(self, query: JobQuery | None = None, **kwargs: Any) -> list[JobState]:
        return await self._call(self._jobs.list, query, **kwargs)

    async def stop(self, job_id: str, **kwargs: Any) -> None:
        await self._call(self._jobs.stop, job_id, **kwargs)

    async def drain(self, job_id: str, **kwargs: Any) -> DrainOutcome:
        return await self._call(self._jobs.drain, job_id, **kwargs)

    async def resume(self, job_id: str, **kwargs: Any) -> ResumeJobSuccess:
        return await self._call(self._jobs.resume, job_id, **kwargs)

    async def remove(self, job_id: str, **kwargs: Any) -> None:
        await self._call(self._jobs.remove, job_id, **kwargs)

    async def wait(self, job_id: str, **kwargs: Any) -> JobState | None:
        return await self._call(self._jobs.wait, job_id, **kwargs)

    async def rehydrate(self, **kwargs: Any) -> RehydrationSummary:
        return await self._call(self._jobs.rehydrate, **kwargs)

    async def events(self, job_id: str, **kwargs: Any) -> AsyncIterator[JobState]:
        iterator = self._jobs.events(job_id, **kwargs)
        while True:
            state = await asyncio.to_thread(next, iterator, None)
            if state is None:
                return
            yield state


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
