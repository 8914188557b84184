"""MongoDB storage (`mongodb://`, `mongodb+srv://`), and `mongomock://` for tests.

Layout
------
One database per partition (scope, namespace), named from a prefix: the database in the URL
path, or `choreography` when the URL names none (see `database_name`). Each database holds:

- `jobs`: `_id` = job id, `type`, `status` (int), `created` (int64 microseconds since the
  epoch), `stopFinalized`, `version` (int64) and `state`, the job record.
- `job-steps`: `_id` = `{"jobId", "stepId"}`, the same two values as top-level `jobId` and
  `stepId` (which the indexes and sorts use), `status`, `stage`, `version` and `state`.
- `job-step-plans`: one document per planned step, `_id` = `{"jobId", "incarnation",
  "ordinal"}`, with top-level `jobId`, `incarnation`, `ordinal` and `entry`.

The partitions that hold unfinished jobs (`keys_with_jobs`) are found by listing the databases
named with the prefix; no catalog collection is kept (docs/decisions.md says why).

`state` and `entry` are sub-documents, so a record can be read in the shell. A value BSON
cannot hold as such (a key starting with `$` or holding `.` or NUL, an integer beyond 64 bits)
is stored as its JSON text instead; reading accepts both forms.

Writes
------
Every job and step write is compare-and-set on `version`, as `protocols` describes. MongoDB has
no multi-document atomicity without transactions, so `save_many` is not atomic: the records of
a batch that do not conflict are written, and those that do are listed in the raised
`VersionConflictError`. Each write carries a `writeToken` unique to the call, so that a write
retried after a dropped connection recognises what its own earlier attempt already applied
instead of reporting it as a conflict. A record of ours that another writer overwrote before we
could look is reported as a conflict, which is the safe answer.

`mongomock://host/prefix` runs the same code against mongomock, in process: providers opened on
one such URL share data, like `memory://`. Mongomock is not a server, so this provider
serialises the operations on one mongomock client (a server applies each single-document write
atomically). Data is never shared across processes there, whatever `capabilities` says.

The partition's collections and indexes are in `partition`, database names in `names`, the
document form of records in `documents`, and the record calls in `jobs`, `steps` and `plans`
(modules of this package).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, TypeVar

from pymongo import MongoClient
from pymongo.errors import (
    AutoReconnect,
    ConnectionFailure,
    ExecutionTimeout,
    NetworkTimeout,
    PyMongoError,
    ServerSelectionTimeoutError,
    WaitQueueTimeoutError,
)

from ...jobs.errors import ConfigurationError
from ...jobs.options import JobsOptions
from ...jobs.registry import TypeRegistry
from ...jobs.state import JobKey
from ...jobs.status import JobStatus
from ..protocols import JobsStorage, StorageCapabilities
from ..provider import ThreadedProvider
from ..retry import one_line
from ..url import StorageURL, redact
from .documents import raw_record
from .jobs import MongoJobStorage, excluding_finalized_stops
from .names import database_name, prefix_of
from .partition import JOBS, PLANS, STEPS, MongoPartition
from .plans import MongoStepPlanStorage
from .steps import MongoJobStepStorage

__all__ = [
    "JOBS",
    "PLANS",
    "STEPS",
    "MongoStorage",
    "database_name",
    "forget_mongomock_store",
]

log = logging.getLogger("choreography_ray.storage")

T = TypeVar("T")


# -- mongomock ------------------------------------------------------------------------------------


_MOCK_CLIENTS: dict[str, tuple[Any, threading.RLock]] = {}
_MOCK_LOCK = threading.Lock()


def _mongomock_client(url: StorageURL) -> tuple[Any, threading.RLock]:
    try:
        import mongomock
    except ImportError as error:
        raise ConfigurationError(
            f"storage URL {url.redacted!r} needs mongomock, which is not installed "
            "(pip install mongomock; it is part of the dev extra)"
        ) from error
    with _MOCK_LOCK:
        entry = _MOCK_CLIENTS.get(url.without_query())
        if entry is None:
            entry = (mongomock.MongoClient(), threading.RLock())
            _MOCK_CLIENTS[url.without_query()] = entry
        return entry


def forget_mongomock_store(url: str) -> None:
    """Drop the data of a `mongomock://` URL in this process."""
    with _MOCK_LOCK:
        _MOCK_CLIENTS.pop(StorageURL(url).without_query(), None)


def _stored_key(database: str, document: Mapping[str, Any]) -> JobKey | None:
    """The partition a job document names in its record; None, logged, when unreadable."""
    try:
        state = raw_record(document.get("state"))
        if isinstance(state, str):
            state = json.loads(state)
        if not isinstance(state, dict):
            raise ValueError("the record is not a JSON object")
        return JobKey.model_validate(state.get("key") or {})
    except ValueError as error:  # pydantic's ValidationError and JSONDecodeError are ValueErrors
        log.warning(
            "database %s: job %r does not say which partition it belongs to, so the "
            "partition is left out of the catalog: %s",
            database,
            document.get("_id"),
            one_line(error),
        )
        return None


class MongoStorage(ThreadedProvider):
    """Jobs, steps and plans in MongoDB, through pymongo on the provider's threads.

    `mongomock://` URLs share `capabilities` with real servers, but their data lives in this
    process only.
    """

    capabilities: ClassVar[StorageCapabilities] = StorageCapabilities(
        external_step_plans=True,
        atomic_batches=False,
        shared_across_processes=True,
        partition_catalog=True,
    )

    def __init__(
        self,
        url: StorageURL,
        *,
        registry: TypeRegistry | None = None,
        options: JobsOptions | None = None,
        threads: int = 4,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.prefix = prefix_of(url)
        self.mock = url.scheme == "mongomock"
        client: Any
        if self.mock:
            client, lock = _mongomock_client(url)
            self._serial: contextlib.AbstractContextManager[Any] = lock
        else:
            named = {option.lower() for option in url.query}
            extra: dict[str, Any] = {} if "appname" in named else {"appname": "choreography-ray"}
            try:
                client = MongoClient(url.raw, **extra)
            except (PyMongoError, ValueError, TypeError) as error:
                raise ConfigurationError(
                    f"storage URL {url.redacted!r} is not usable: {redact(str(error))}"
                ) from error
            self._serial = contextlib.nullcontext()
        self.client: MongoClient[Any] = client
        super().__init__(url, registry=registry, options=options, threads=threads, sleep=sleep)
        self._databases: dict[JobKey, MongoPartition] = {}

    def database_name(self, key: JobKey) -> str:
        return database_name(self.prefix, key)

    def partition(self, key: JobKey) -> MongoPartition:
        """The collections of `key`'s partition (for tools and tests)."""
        with self._partitions_lock:
            return self._partition(key)

    def _partition(self, key: JobKey) -> MongoPartition:
        partition = self._databases.get(key)
        if partition is None:
            partition = MongoPartition(self.client[self.database_name(key)], mock=self.mock)
            self._databases[key] = partition
        return partition

    async def keys_with_jobs(self, statuses: Iterable[JobStatus]) -> list[JobKey]:
        """The databases named with this provider's prefix, and in each one indexed look-up.

        A hashed database name cannot be read back, so the key comes from the job found, and
        is kept only if it names that very database: a database of another prefix (`p+a`'s
        `p+a+b` looks like `p`'s partition `a`/`b`) is never taken for one of ours.
        """
        wanted = list(statuses)
        if not wanted:
            return []
        return await self.run(self._keys_with_jobs, excluding_finalized_stops(wanted))

    def _keys_with_jobs(self, filter: dict[str, Any]) -> list[JobKey]:
        with self._serial:
            names = self.client.list_database_names()
        keys = []
        for name in sorted(n for n in names if n.startswith(f"{self.prefix}+")):
            jobs = self.client[name][JOBS]
            with self._serial:
                found = jobs.find_one(filter, {"state.key": 1})
                if found is not None and not isinstance(found.get("state"), dict):
                    found = jobs.find_one({"_id": found["_id"]}, {"state": 1})
            if found is None:
                continue
            key = _stored_key(name, found)
            if key is not None and self.database_name(key) == name:
                keys.append(key)
        return sorted(keys, key=lambda key: (key.scope, key.namespace))

    def _open_partition(self, key: JobKey) -> JobsStorage:
        partition = self._partition(key)  # for_key holds the partitions lock
        return JobsStorage(
            key=key,
            jobs=MongoJobStorage(self, key, partition),
            steps=MongoJobStepStorage(self, key, partition),
            plans=MongoStepPlanStorage(self, key, partition),
        )

    def call(self, partition: MongoPartition, fn: Callable[[], T]) -> T:
        """Run one storage operation (on a provider thread), indexes first."""
        with self._serial:
            partition.ensure_indexes()
            return fn()

    def is_transient(self, error: BaseException) -> bool:
        # AutoReconnect covers NotPrimaryError, NetworkTimeout and ServerSelectionTimeoutError;
        # ConnectionFailure covers WaitQueueTimeoutError. Duplicate keys, failed commands and
        # bulk write errors are OperationFailures and surface at once, except a server-side
        # time limit (ExecutionTimeout).
        return isinstance(
            error,
            AutoReconnect
            | NetworkTimeout
            | ExecutionTimeout
            | WaitQueueTimeoutError
            | ServerSelectionTimeoutError
            | ConnectionFailure,
        )

    async def initialize(self) -> None:
        """Check the server answers and create the indexes of the partitions opened so far."""
        if not self.mock:
            await self.run(self.client.admin.command, "ping")
        with self._partitions_lock:
            partitions = list(self._databases.values())
        for partition in partitions:
            await self.run(self.call, partition, lambda: None)

    async def close(self) -> None:
        await super().close()
        if not self.mock:
            self.client.close()
