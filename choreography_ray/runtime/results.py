"""The client's reads of a map's results: `results`, `as_completed` and `gather`.

A base of `AsyncJobs`: each read asks a controller host for pages of the job's steps
(`ReadResults`), which any host reads from storage, and types the results here, through this
process's registry: the step function's module is imported where `jobs.map` was called.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from typing import Any, TypeVar

from ..engine.results import ResultSource, as_completed, gather, in_item_order, typed
from ..jobs.registry import default_registry
from ..jobs.results import ItemResult
from ..jobs.state import DEFAULT_NAMESPACE, DEFAULT_SCOPE, JobState
from .arguments import check_job_id, job_key
from .operations import Operation, ReadResults

T = TypeVar("T")


class ResultCalls(ABC):
    """What a client reads of a job's item outcomes, on top of its `get` and `_ask`."""

    @abstractmethod
    async def get(self, job_id: str, *, scope: str, namespace: str) -> JobState: ...

    @abstractmethod
    async def _ask(self, operation: Operation[T], *, job_type: str | None = None) -> T: ...

    def _source(self, job_id: str, scope: str, namespace: str, interval: float) -> ResultSource:
        key = job_key(scope, namespace)
        check_job_id(job_id)

        async def pause() -> None:
            await asyncio.sleep(interval)

        return ResultSource(
            lambda: self.get(job_id, scope=scope, namespace=namespace),
            lambda query: self._ask(ReadResults(key, job_id, query)),
            pause,
        )

    def results(
        self,
        job_id: str,
        *,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
        interval: float = 0.25,
    ) -> AsyncGenerator[ItemResult, None]:
        """Each item's `(index, result or ItemFailed)` in item order, read from storage a
        page at a time; an item still running is waited for (read again every `interval`
        seconds). Results are typed by the step function's declared result type."""
        source = self._source(job_id, scope, namespace, interval)
        return typed(in_item_order(source), default_registry)

    def as_completed(
        self,
        job_id: str,
        *,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
        interval: float = 0.25,
    ) -> AsyncGenerator[ItemResult, None]:
        """Each item's `(index, result or ItemFailed)` once, as it is stored; the items left
        when the job finishes (stopped, never run) at the end, in item order."""
        source = self._source(job_id, scope, namespace, interval)
        return typed(as_completed(source), default_registry)

    async def gather(
        self,
        job_id: str,
        *,
        return_exceptions: bool = False,
        scope: str = DEFAULT_SCOPE,
        namespace: str = DEFAULT_NAMESPACE,
        interval: float = 0.25,
    ) -> list[Any]:
        """Every item's result as one list in item order, once each item has one, for a job
        of at most `GATHER_LIMIT` items (`ResultsTooLargeError` above). The first failed
        item raises its `ItemFailed`, or stands in its place with `return_exceptions`."""
        source = self._source(job_id, scope, namespace, interval)
        return await gather(source, default_registry, return_exceptions=return_exceptions)
