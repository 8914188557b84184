"""The Jobs client: what a driver, a script or the command line uses.

    jobs = choreography_ray.connect(storage="sqlite:///.choreography/jobs.db")
    job_id = jobs.start(RebuildIndex, RebuildIndexRequest(...), scope="studio")
    state = jobs.wait(job_id, progress=True)

`connect` (runtime/connection.py) configures the cluster and returns a `Jobs`. Every call goes to
a controller host found by name, so another driver, or this one after a restart, sees the same
jobs; a client whose controller host was replaced finds the new one by name and goes on.
Arguments are checked here, before any remote call, and every failure reaches the caller as one
of the project's exceptions with a one-line message.

`AsyncJobs` (`jobs.aio`) is the client: each call builds one typed request (`operations`) and
awaits the controller host's answer, as Ray's object references are awaitable. `Jobs` runs
those coroutines to the end on one event loop of its own, on a background thread
(`background_loop`), so it works the same in a plain script, a Ray driver, a `ray job submit`
entrypoint and a notebook whose own loop is running.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pydantic import BaseModel

from ..jobs.errors import DrainOutcome, ResumeJobSuccess
from ..jobs.functions import JobFunction, StepFunction
from ..jobs.job import Job
from ..jobs.mapping import MapItems, check_window
from ..jobs.registry import default_registry
from ..jobs.results import ItemResult
from ..jobs.state import DEFAULT_NAMESPACE, DEFAULT_SCOPE, JobState
from ..placement.capability import import_failures
from ..recovery.explicit import RehydrationSummary
from ..storage.protocols import JobQuery, StepCounts
from .adverts import read_adverts
from .async_client import AsyncJobs, AsyncMapped
from .background_loop import BackgroundLoop
from .constants import NAMESPACE
from .directory import actor_names

__all__ = ["AsyncJobs", "AsyncMapped", "Jobs", "Mapped"]


class Jobs:
    """Start, watch, stop, resume and remove jobs; every call blocks until it is answered.
    `aio` is the same client as coroutines: each call here runs its coroutine to the end on the
    process's background loop."""

    def __init__(self, namespace: str = NAMESPACE) -> None:
        self.namespace = namespace
        self.aio = AsyncJobs(namespace)

    def import_failures(self, job_type: str | None = None) -> list[str]:
        """The job modules hosts could not import, one line each naming the node, the host and
        the reason; with `job_type`, only those of hosts that cannot run that type."""
        adverts = read_adverts(self.namespace, actor_names(self.namespace))
        return import_failures(
            advert for advert in adverts.values() if job_type is None or not advert.hosts(job_type)
        )

    def start(
        self,
        job_type: type[Job[Any]] | JobFunction[Any],
        request: BaseModel,
        *,
        job_id: str | None = None,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> str:
        """Start a job (a `Job` class or a `@job` function); returns its id once the job is
        durable (see `AsyncJobs.start`)."""
        return _run(
            self.aio.start(job_type, request, job_id=job_id, scope=scope, namespace=namespace)
        )

    def map(
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
    ) -> Mapped:
        """Start one durable job that runs the `@step` function `function` once per item, and
        return once its plan is saved (the steps run on; see `Mapped`).

        `items` is any iterable, a generator of millions included: it is drawn here a chunk
        at a time, each item checked to read back from JSON as given (else `StartJobFailed`,
        INVALID_STEP_PLAN, naming the item) and kept as JSON only. `stages` gives an item's
        stage (0 first; a stage starts once the one before it has an outcome for every item);
        `max_active_steps` bounds the steps active at once; `name` is shown in listings. With
        `job_id`, mapping again returns that job instead of a second one. The job is any job:
        stop, drain, resume and remove it by its id; it keeps its results until removed."""
        window = check_window(max_active_steps)
        mapped = MapItems.of(function, items, default_registry, stages)  # in this thread
        started = self.aio.start_map(
            function,
            mapped,
            name=name,
            job_id=job_id,
            max_active_steps=window,
            scope=scope,
            namespace=namespace,
        )
        return Mapped(_run(started))

    def get(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> JobState:
        return _run(self.aio.get(job_id, scope=scope, namespace=namespace))

    def step_counts(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> StepCounts:
        """The job's step records per status as storage holds them (see
        `AsyncJobs.step_counts`)."""
        return _run(self.aio.step_counts(job_id, scope=scope, namespace=namespace))

    def find(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> JobState | None:
        return _run(self.aio.find(job_id, scope=scope, namespace=namespace))

    def list(
        self,
        query: JobQuery | None = None,
        *,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> list[JobState]:
        return _run(self.aio.list(query, scope=scope, namespace=namespace))

    def stop(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> None:
        _run(self.aio.stop(job_id, scope=scope, namespace=namespace))

    def drain(
        self,
        job_id: str,
        *,
        timeout: float = 30.0,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> DrainOutcome:
        """Stop the job and wait, up to `timeout` seconds, for every step to answer (see
        `AsyncJobs.drain`)."""
        return _run(self.aio.drain(job_id, timeout=timeout, scope=scope, namespace=namespace))

    def resume(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> ResumeJobSuccess:
        return _run(self.aio.resume(job_id, scope=scope, namespace=namespace))

    def remove(
        self, job_id: str, *, scope: str = DEFAULT_SCOPE, namespace: str = DEFAULT_NAMESPACE
    ) -> None:
        _run(self.aio.remove(job_id, scope=scope, namespace=namespace))

    def rehydrate(
        self,
        *,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
        timeout: float = 60.0,
    ) -> RehydrationSummary:
        """Resume the partition's interrupted jobs now (see `AsyncJobs.rehydrate`)."""
        return _run(self.aio.rehydrate(scope=scope, namespace=namespace, timeout=timeout))

    def events(
        self,
        job_id: str,
        *,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
        interval: float = 0.25,
    ) -> Iterator[JobState]:
        """The job's state each time its progress or status changes (see `AsyncJobs.events`)."""
        return _BACKGROUND.iterate(
            self.aio.events(job_id, scope=scope, namespace=namespace, interval=interval)
        )

    def results(
        self,
        job_id: str,
        *,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
        interval: float = 0.25,
    ) -> Iterator[ItemResult]:
        """Each item's `(index, result or ItemFailed)` in item order, a page at a time (see
        `AsyncJobs.results`)."""
        results = self.aio.results(job_id, scope=scope, namespace=namespace, interval=interval)
        return _BACKGROUND.iterate(results)

    def as_completed(
        self,
        job_id: str,
        *,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
        interval: float = 0.25,
    ) -> Iterator[ItemResult]:
        """Each item's `(index, result or ItemFailed)` as it is stored (see
        `AsyncJobs.as_completed`)."""
        completed = self.aio.as_completed(
            job_id, scope=scope, namespace=namespace, interval=interval
        )
        return _BACKGROUND.iterate(completed)

    def gather(
        self,
        job_id: str,
        *,
        return_exceptions: bool = False,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
        interval: float = 0.25,
    ) -> builtins.list[Any]:
        """Every item's result as one list, for a job of at most `GATHER_LIMIT` items (see
        `AsyncJobs.gather`)."""
        gathering = self.aio.gather(
            job_id,
            return_exceptions=return_exceptions,
            scope=scope,
            namespace=namespace,
            interval=interval,
        )
        return _run(gathering)

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
        """Wait until the job is finished and return its last state, or None when it was
        cleared (see `AsyncJobs.wait`)."""
        waiting = self.aio.wait(
            job_id,
            timeout=timeout,
            progress=progress,
            scope=scope,
            namespace=namespace,
            interval=interval,
        )
        return _run(waiting)


class Mapped:
    """A started map job: its `job_id`, and its outcome as a map's caller reads it."""

    def __init__(self, started: AsyncMapped) -> None:
        self.aio = started
        self.job_id = started.job_id

    def wait(self, *, timeout: float | None = None) -> JobState | None:
        """Wait until the job is finished (see `Jobs.wait`)."""
        return _run(self.aio.wait(timeout=timeout))

    def as_completed(self, *, interval: float = 0.25) -> Iterator[ItemResult]:
        """Each item's `(index, result or ItemFailed)` as it is stored (see
        `Jobs.as_completed`)."""
        return _BACKGROUND.iterate(self.aio.as_completed(interval=interval))

    def __repr__(self) -> str:
        return f"Mapped(job_id={self.job_id!r})"


_BACKGROUND = BackgroundLoop("choreography-client")
"""The one loop every `Jobs` of the process runs its calls on."""
_run = _BACKGROUND.run
