"""The base every storage provider shares; `schemes` chooses one by URL."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

from ..jobs.options import JobsOptions
from ..jobs.registry import TypeRegistry, default_registry
from ..jobs.state import JobKey
from ..jobs.status import JobStatus
from .blocking import BlockingCalls
from .codec import RecordCodec
from .protocols import JobsStorage, StorageCapabilities
from .retry import TransientRetry
from .url import StorageURL

T = TypeVar("T")


class StorageProvider(ABC):
    """Opens the per-(scope, namespace) storages of one URL and shares their resources."""

    capabilities: ClassVar[StorageCapabilities] = StorageCapabilities(
        external_step_plans=False, atomic_batches=False, shared_across_processes=False
    )
    """What the provider does beyond the contract; this default promises nothing more."""

    def __init__(
        self,
        url: StorageURL,
        *,
        registry: TypeRegistry | None = None,
        options: JobsOptions | None = None,
    ) -> None:
        self.url = url
        self.registry = registry or default_registry
        self.options = options or JobsOptions()
        self.codec = RecordCodec(self.registry)
        self._partitions: dict[JobKey, JobsStorage] = {}
        self._partitions_lock = threading.Lock()

    def for_key(self, key: JobKey | None = None, /, **parts: str) -> JobsStorage:
        """The storage of one partition; `for_key(scope=..., namespace=...)` works too."""
        key = key or JobKey(**parts)
        with self._partitions_lock:
            partition = self._partitions.get(key)
            if partition is None:
                partition = self._open_partition(key)
                self._partitions[key] = partition
            return partition

    @abstractmethod
    def _open_partition(self, key: JobKey) -> JobsStorage: ...

    async def keys_with_jobs(self, statuses: Iterable[JobStatus]) -> list[JobKey]:
        """Every partition holding a job in `statuses`, leaving out Stopped jobs whose stop is
        finalized, sorted by scope then namespace: the durable catalog recovery reads.

        The filter is `get_jobs_excluding_finalized_stops`'s, so given the statuses rehydration
        loads it names exactly the partitions where rehydration finds work. The built-in
        providers answer for the whole store (`capabilities.partition_catalog`), so no host has
        to remember a partition. This default, for a provider of your own, can enumerate only
        the partitions this provider opened in this process, and asks each; recovery then
        warns at start-up that its catalog is incomplete unless a key provider is configured.
        """
        wanted = list(statuses)
        with self._partitions_lock:
            opened = list(self._partitions.values())
        keys = [
            partition.key
            for partition in opened
            if wanted and await partition.jobs.get_jobs_excluding_finalized_stops(wanted)
        ]
        return sorted(keys, key=lambda key: (key.scope, key.namespace))

    async def initialize(self) -> None:  # noqa: B027 - most providers need nothing
        """Create what the provider needs (schema, indexes); safe to call more than once."""

    async def close(self) -> None:  # noqa: B027 - most providers hold nothing
        """Release connections and threads."""

    async def __aenter__(self) -> StorageProvider:
        await self.initialize()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url.redacted!r})"


READ_THREADS = 2
"""Threads of a threaded provider that run reads only (listings, counts)."""


class ThreadedProvider(StorageProvider):
    """A provider over a blocking driver: calls run on its own threads, with transient retries.

    A batch costs one thread hop, and the event loop never waits on the database, except
    for the short SQLite calls `SqlStorage.run_quick` and `run_read` run inline.
    """

    def __init__(
        self,
        url: StorageURL,
        *,
        registry: TypeRegistry | None = None,
        options: JobsOptions | None = None,
        threads: int = 4,
        sleep: Callable[[float], None] | None = None,
        after_call: Callable[[], None] | None = None,
        after_call_due: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(url, registry=registry, options=options)
        self._calls = BlockingCalls(
            threads, f"choreography-{url.dialect}", after_call, after_call_due
        )
        self._reads = BlockingCalls(READ_THREADS, f"choreography-{url.dialect}-reads")
        retry_args: dict[str, Any] = {
            "attempts": self.options.transient_retry_attempts,
            "base_delay": self.options.transient_retry_base_delay,
            "max_delay": self.options.max_transient_retry_delay,
            "what": f"storage {url.redacted}",
        }
        if sleep is not None:
            retry_args["sleep"] = sleep
        self.retry = TransientRetry(self.is_transient, **retry_args)

    @abstractmethod
    def is_transient(self, error: BaseException) -> bool:
        """Whether `error` is worth retrying: a dropped connection, a timeout, a busy store."""

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._calls.submit(self.retry.call, fn, *args)

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """A read on threads of its own: never queued behind a write that waits (for a lock,
        or for a server that went away), so readers get an answer or a clear error."""
        return await self._reads.submit(self.retry.call, fn, *args)

    async def close(self) -> None:
        self._calls.shutdown()
        self._reads.shutdown()
