"""The Jobs client: what a driver, a script or the command line uses.

    jobs = choreography_ray.connect(storage="sqlite:///.choreography/jobs.db")
    job_id = jobs.start(RebuildIndex, RebuildIndexRequest(...), scope="studio")
    state = jobs.wait(job_id, progress=True)

`connect` starts a local Ray when there is none (or joins the cluster at `address`), writes the
cluster configuration once, and makes sure the host actors run. Every call goes to a controller
host by name, so another driver, or this one after a restart, sees the same jobs. `jobs.aio`
offers the same calls as coroutines.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

import ray
from pydantic import BaseModel

from ..engine.job import JobStartResult
from ..jobs.errors import (
    ChoreographyError,
    ConfigurationError,
    JobNotFoundError,
    ResumeJobSuccess,
    StartJobError,
    StartJobFailed,
)
from ..jobs.job import Job
from ..jobs.options import JobsOptions
from ..jobs.registry import default_registry
from ..jobs.state import DEFAULT_NAMESPACE, DEFAULT_SCOPE, JobKey, JobState
from ..storage.protocols import JobQuery
from .config import ClusterConfig, check_same_storage, merge, read_config, write_config
from .constants import NAMESPACE, controller_name
from .placement import start_hosts

T = TypeVar("T")

DEFAULT_STORAGE = "sqlite:///.choreography/jobs.db"


def connect(
    storage: str | None = None,
    *,
    address: str | None = None,
    namespace: str = NAMESPACE,
    options: JobsOptions | None = None,
    modules: list[str] | tuple[str, ...] = (),
    max_parallel_steps: int | None = None,
    workers_per_node: int = 1,
    runtime_env: dict[str, Any] | None = None,
) -> Jobs:
    """Connect to the job system of a Ray cluster, starting what is missing.

    `address`: None lets Ray decide (RAY_ADDRESS, else a cluster started with `ray start` on
    this machine, else a new local Ray); "auto" joins a running cluster on this machine;
    "host:port" or "ray://host:10001" joins that one. `storage` is needed the first time a
    cluster is used (it defaults to SQLite under .choreography/ then); later connections may
    leave it out, and may not name another. `modules` are imported by every host, so the job
    types they define resolve; a job class's own module is added when it is started.
    """
    if not ray.is_initialized():
        _check_reachable(address)
        try:
            ray.init(
                address=address,
                namespace=namespace,
                runtime_env=runtime_env,
                include_dashboard=False,
                logging_level="WARNING",
                log_to_driver=False,
            )
        except ConnectionError as error:
            raise ConfigurationError(
                f"cannot reach the Ray cluster at {address!r}: {error}"
            ) from None
    config = read_config(namespace)
    if config is None:
        config = ClusterConfig(
            storage=storage or DEFAULT_STORAGE,
            options=(options or JobsOptions()).model_dump(mode="json", exclude_unset=True),
            modules=list(modules),
            keys=[JobKey()],  # the default partition is always recovered
        )
        write_config(config, namespace)
    else:
        check_same_storage(config, storage)
        if options is not None:
            wanted = options.model_dump(mode="json", exclude_unset=True)
            if wanted != config.options:
                raise ConfigurationError(
                    f"this Ray cluster's job system already runs with options {config.options}; "
                    f"it cannot switch to {wanted} while its hosts run (use `choreography down` "
                    "first, or another namespace)"
                )
        updated = merge(config, modules=list(modules), keys=[])
        if updated is not config:
            write_config(updated, namespace)
    start_hosts(namespace, max_parallel_steps, workers_per_node)
    return Jobs(namespace)


def _check_reachable(address: str | None, timeout: float = 3.0) -> None:
    """Fail fast, with a clear message, when a cluster address refuses connections.

    Ray itself keeps retrying an unreachable head for minutes before it gives up.
    """
    if not address or address == "auto" or address.startswith("local"):
        return
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigurationError(
            f"cluster address {address!r} is not 'auto', 'host:port' or 'ray://host:port'"
        )
    import socket

    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as error:
        raise ConfigurationError(f"cannot reach the Ray cluster at {address!r}: {error}") from None


_WAIT_CHUNK = 10.0
"""Seconds one call of `wait` may be held by the controller host before it asks again."""


class Jobs:
    """Start, watch, stop, resume and remove jobs. Every call is synchronous; `aio` has the
    same as coroutines."""

    def __init__(self, namespace: str = NAMESPACE) -> None:
        self.namespace = namespace
        self.aio = AsyncJobs(self)

    # -- routing --------------------------------------------------------------------------------

    def _controller(self) -> Any:
        local = controller_name(ray.get_runtime_context().get_node_id())
        try:
            return ray.get_actor(local, namespace=self.namespace)
        except ValueError:
            pass
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry.get("namespace") == self.namespace and entry.get("name", "").startswith(
                "choreography:controller:"
            ):
                return ray.get_actor(entry["name"], namespace=self.namespace)
        raise ConfigurationError(
            "no controller host runs in this cluster; run `choreography up` or connect()"
        )

    def _remember(self, job_type: type[Job[Any]], key: JobKey) -> None:
        """Make every host know the job's module and recover the job's partition."""
        config = read_config(self.namespace)
        if config is None:
            raise ConfigurationError("the cluster has no choreography configuration")
        module = job_type.__module__
        modules = [] if module == "__main__" else [module]
        updated = merge(config, modules=modules, keys=[key])
        if updated is not config:
            write_config(updated, self.namespace)
            hosts = [
                ray.get_actor(e["name"], namespace=self.namespace)
                for e in ray.util.list_named_actors(all_namespaces=True)
                if e.get("namespace") == self.namespace
                and e.get("name", "").startswith(
                    ("choreography:controller:", "choreography:worker:")
                )
            ]
            ray.get([h.refresh.remote() for h in hosts])

    @staticmethod
    def _get(ref: Any, timeout: float | None = None) -> Any:
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.RayTaskError as error:
            cause = error.cause
            if isinstance(cause, ChoreographyError):
                raise cause from None
            raise

    # -- operations -----------------------------------------------------------------------------

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
        that job instead of a second one."""
        key = JobKey(scope=scope, namespace=namespace)
        self._remember(job_type, key)
        payload = default_registry.dump(request)
        result: JobStartResult = self._get(
            self._controller().start.remote(key, job_type.name, payload, job_id)
        )
        return _started(result, job_id)

    def get(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> JobState:
        return self._get(
            self._controller().get.remote(JobKey(scope=scope, namespace=namespace), job_id)
        )

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
        key = JobKey(scope=scope, namespace=namespace)
        return self._get(self._controller().list.remote(key, query or JobQuery()))

    def stop(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> None:
        key = JobKey(scope=scope, namespace=namespace)
        self._get(self._controller().stop.remote(key, job_id))

    def resume(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> ResumeJobSuccess:
        key = JobKey(scope=scope, namespace=namespace)
        return self._get(self._controller().resume.remote(key, job_id))

    def remove(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> None:
        key = JobKey(scope=scope, namespace=namespace)
        self._get(self._controller().remove.remote(key, job_id))

    def events(
        self,
        job_id: str,
        *,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
        interval: float = 0.25,
    ) -> Iterator[JobState]:
        """The job's state each time its progress or status changes, until it is finished
        (terminal, or stopped for good); a job that is cleared ends the iteration."""
        last: tuple[Any, ...] | None = None
        while True:
            state = self.find(job_id, scope=scope, namespace=namespace)
            if state is None:
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
        seconds.

        The controller host holds each call until the job finishes (or the chunk of time
        passes), so the wait ends as the job does, without polling it."""
        from .progress import ProgressBar

        key = JobKey(scope=scope, namespace=namespace)
        deadline = None if timeout is None else time.monotonic() + timeout
        with ProgressBar(enabled=progress) as bar:
            while True:
                chunk = interval if progress else _WAIT_CHUNK
                if deadline is not None:
                    chunk = max(0.0, min(chunk, deadline - time.monotonic()))
                state = self._get(self._controller().wait.remote(key, job_id, chunk))
                if state is None:
                    return None
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

    async def list(self, query: JobQuery | None = None, **kwargs: Any) -> list[JobState]:
        return await self._call(self._jobs.list, query, **kwargs)

    async def stop(self, job_id: str, **kwargs: Any) -> None:
        await self._call(self._jobs.stop, job_id, **kwargs)

    async def resume(self, job_id: str, **kwargs: Any) -> ResumeJobSuccess:
        return await self._call(self._jobs.resume, job_id, **kwargs)

    async def remove(self, job_id: str, **kwargs: Any) -> None:
        await self._call(self._jobs.remove, job_id, **kwargs)

    async def wait(self, job_id: str, **kwargs: Any) -> JobState | None:
        return await self._call(self._jobs.wait, job_id, **kwargs)

    async def events(self, job_id: str, **kwargs: Any) -> AsyncIterator[JobState]:
        iterator = self._jobs.events(job_id, **kwargs)
        while True:
            state = await asyncio.to_thread(next, iterator, None)
            if state is None:
                return
            yield state


def _started(result: JobStartResult, job_id: str | None) -> str:
    if result.succeeded:
        return result.job_id
    if job_id is not None and result.error in (
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
