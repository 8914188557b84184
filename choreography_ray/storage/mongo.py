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
atomically) and looks documents up by `_id` directly instead of scanning the collection.
Data is never shared across processes there, whatever `capabilities` says.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar
from urllib.parse import unquote, urlsplit

from bson.int64 import Int64
from pymongo import ASCENDING, InsertOne, MongoClient, ReplaceOne
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    ConnectionFailure,
    DuplicateKeyError,
    ExecutionTimeout,
    NetworkTimeout,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
    WaitQueueTimeoutError,
)

from ..jobs.errors import ConfigurationError, VersionConflictError
from ..jobs.options import JobsOptions
from ..jobs.registry import TypeRegistry
from ..jobs.state import DEFAULT_NAMESPACE, JobKey, JobState, JobStepState, PlannedStep
from ..jobs.status import TERMINAL_JOB_STATUSES, JobStatus, JobStepStatus
from .codec import (
    JobLookup,
    RecordCodec,
    StepLookup,
    check_batch,
    check_id,
    check_job_key,
    to_micros,
)
from .protocols import JobQuery, JobsStorage, StorageCapabilities
from .provider import ThreadedProvider
from .url import StorageURL, redact

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

JOBS = "jobs"
STEPS = "job-steps"
PLANS = "job-step-plans"

DEFAULT_PREFIX = "choreography"
MAX_DATABASE_NAME_BYTES = 63
PLAN_BATCH = 1_000
"""Plan entries inserted per round trip."""

_HASH_HEX = 24
_FORBIDDEN = re.compile(r'[/\\. "$*<>:|?\x00]')
_HASHED_LOOKALIKE = re.compile(rf"h[0-9a-f]{{{_HASH_HEX}}}")
_MAX_PREFIX_BYTES = MAX_DATABASE_NAME_BYTES - len("+h") - _HASH_HEX

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

_DUPLICATE_KEY = 11000
_INDEX_CONFLICTS = frozenset({85, 86})
"""IndexOptionsConflict, IndexKeySpecsConflict: an equal index exists under another name."""

_INDEXES: dict[str, list[tuple[str, list[tuple[str, int]]]]] = {
    JOBS: [
        ("status", [("status", ASCENDING)]),
        ("type_status", [("type", ASCENDING), ("status", ASCENDING)]),
        (
            "status_created",
            [("status", ASCENDING), ("created", ASCENDING), ("_id", ASCENDING)],
        ),
        (
            "type_status_created",
            [
                ("type", ASCENDING),
                ("status", ASCENDING),
                ("created", ASCENDING),
                ("_id", ASCENDING),
            ],
        ),
        ("status_stopFinalized", [("status", ASCENDING), ("stopFinalized", ASCENDING)]),
        ("created", [("created", ASCENDING), ("_id", ASCENDING)]),
    ],
    STEPS: [
        ("jobId_status", [("jobId", ASCENDING), ("status", ASCENDING)]),
        (
            "jobId_stage_stepId",
            [("jobId", ASCENDING), ("stage", ASCENDING), ("stepId", ASCENDING)],
        ),
    ],
    PLANS: [
        (
            "jobId_incarnation_index",
            [("jobId", ASCENDING), ("incarnation", ASCENDING), ("ordinal", ASCENDING)],
        ),
    ],
}
"""Index name -> keys, per collection. Indexes found under other names are left in place."""


# -- database names ------------------------------------------------------------------------------


def database_name(prefix: str, key: JobKey) -> str:
    """The database of one partition.

    `{prefix}+{scope}` for the default namespace, else `{prefix}+{scope}+{namespace}`. When that
    name is not one MongoDB accepts or could be mistaken for another partition's, the name is
    `{prefix}+h{first 24 hex digits of sha256(scope + "\\0" + namespace)}` instead: deterministic,
    so every host finds the same database, and 96 bits against collisions. That happens when
    scope or namespace

    - holds a character MongoDB forbids in database names (``/\\. "$*<>:|?`` or NUL),
    - holds `+`, which would make two partitions share a name (`a+b`/default and `a`/`b`),
    - holds an upper-case letter, since MongoDB refuses two databases whose names differ only
      in case,
    - looks like a hashed name itself (`h` and 24 hex digits, in the default namespace),

    or when the name would be longer than 63 bytes (UTF-8).
    """
    parts = [key.scope] if key.namespace == DEFAULT_NAMESPACE else [key.scope, key.namespace]
    readable = "+".join([prefix, *parts])
    if (
        any(_FORBIDDEN.search(part) or "+" in part or part != part.lower() for part in parts)
        or (len(parts) == 1 and _HASHED_LOOKALIKE.fullmatch(parts[0]))
        or len(readable.encode()) > MAX_DATABASE_NAME_BYTES
    ):
        digest = hashlib.sha256(f"{key.scope}\0{key.namespace}".encode()).hexdigest()
        return f"{prefix}+h{digest[:_HASH_HEX]}"
    return readable


def _prefix_of(url: StorageURL) -> str:
    path = unquote(urlsplit(url.without_query()).path).strip("/")
    prefix = path or DEFAULT_PREFIX
    if _FORBIDDEN.search(prefix) or len(prefix.encode()) > _MAX_PREFIX_BYTES:
        raise ConfigurationError(
            f"storage URL {url.redacted!r}: the database prefix {prefix!r} must be at most "
            f'{_MAX_PREFIX_BYTES} bytes without any of / \\ . space " $ * < > : | ? '
            "(each partition gets a database named after it)"
        )
    return prefix


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


def _accelerate(collection: Any) -> Any:
    """Make a mongomock collection find a document by `_id` without scanning all of them.

    Mongomock matches every filter against every document, which makes a batch of 10,000
    compare-and-set writes quadratic. Only filters with a plain `_id` value take the shortcut;
    the document found still goes through mongomock's own matching.
    """
    try:
        from mongomock.filtering import filter_applies
        from mongomock.helpers import hashdict
    except ImportError:  # pragma: no cover - another mongomock layout: stay correct, slower
        return collection
    scan = getattr(collection, "_iter_documents", None)
    if scan is None:  # pragma: no cover
        return collection

    def iter_documents(filter: Any) -> Iterable[Any]:
        wanted = filter.get("_id") if isinstance(filter, Mapping) else None
        if isinstance(wanted, str) or (
            isinstance(wanted, dict)
            and all(
                isinstance(k, str) and not k.startswith("$") and isinstance(v, str | int)
                for k, v in wanted.items()
            )
        ):
            store = collection._store
            stored_key = hashdict(wanted) if isinstance(wanted, dict) else wanted
            if stored_key not in store:
                return iter(())
            document = store[stored_key]
            return iter([document] if filter_applies(filter, document) else [])
        return scan(filter)

    collection._iter_documents = iter_documents
    return collection


# -- documents ------------------------------------------------------------------------------------


def _bson_safe(value: Any) -> bool:
    """Whether BSON holds `value` (JSON data) as a document that reads back equal."""
    if isinstance(value, dict):
        return all(
            isinstance(k, str)
            and not k.startswith("$")
            and "." not in k
            and "\0" not in k
            and _bson_safe(v)
            for k, v in value.items()
        )
    if isinstance(value, list):
        return all(_bson_safe(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, int):
        return True
    return _INT64_MIN <= value <= _INT64_MAX


def _storable(document: dict[str, Any]) -> dict[str, Any] | str:
    return document if _bson_safe(document) else json.dumps(document, separators=(",", ":"))


def _raw(value: Any) -> dict[str, Any] | str:
    """What the codec decodes from a stored `state`/`entry`; anything odd fails as malformed."""
    if isinstance(value, dict | str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "null"


def _version(document: Mapping[str, Any]) -> int:
    value = document.get("version")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def _step_key(job_id: str, step_id: str) -> dict[str, str]:
    return {"jobId": job_id, "stepId": step_id}


# -- provider -------------------------------------------------------------------------------------


class MongoPartition:
    """The collections of one partition's database; creates their indexes on first use."""

    def __init__(self, database: Database[Any], *, mock: bool) -> None:
        self.database = database
        wrap = _accelerate if mock else (lambda collection: collection)
        self.jobs: Collection[Any] = wrap(database[JOBS])
        self.steps: Collection[Any] = wrap(database[STEPS])
        self.plans: Collection[Any] = wrap(database[PLANS])
        self.mock = mock
        self._ready = False
        self._lock = threading.Lock()

    def write_steps(self, operations: list[tuple[dict[str, Any] | None, dict[str, Any]]]) -> Any:
        """One unordered bulk write of `(filter, document)` pairs: no filter inserts, else
        replaces; returns the bulk result's details, or raises `BulkWriteError`.

        Mongomock's bulk writes do not accept what current pymongo passes them, so there the
        operations run one by one (under the provider's lock), with the same details.
        """
        if not self.mock:
            requests: list[InsertOne[Any] | ReplaceOne[Any]] = [
                InsertOne(dict(document)) if filter is None else ReplaceOne(filter, document)
                for filter, document in operations
            ]
            return self.steps.bulk_write(requests, ordered=False).bulk_api_result
        details: dict[str, Any] = {"nInserted": 0, "nMatched": 0, "nModified": 0}
        errors: list[dict[str, Any]] = []
        for index, (filter, document) in enumerate(operations):
            try:
                if filter is None:
                    self.steps.insert_one(dict(document))
                    details["nInserted"] += 1
                else:
                    result = self.steps.replace_one(filter, document)
                    details["nMatched"] += result.matched_count
                    details["nModified"] += result.modified_count
            except OperationFailure as error:
                errors.append({"index": index, "code": error.code, "errmsg": str(error)})
        if errors:
            raise BulkWriteError({**details, "writeErrors": errors, "writeConcernErrors": []})
        return details

    def ensure_indexes(self) -> None:
        """Create the indexes once per process; creating an existing index changes nothing."""
        if self._ready:
            return
        with self._lock:
            if self._ready:
                return
            for name, collection in ((JOBS, self.jobs), (STEPS, self.steps), (PLANS, self.plans)):
                for index_name, keys in _INDEXES[name]:
                    try:
                        collection.create_index(keys, name=index_name)
                    except OperationFailure as error:
                        if error.code not in _INDEX_CONFLICTS:
                            raise
                        log.warning(
                            "%s.%s: index %s exists in another form, keeping it: %s",
                            self.database.name,
                            name,
                            index_name,
                            error,
                        )
            self._ready = True


class MongoStorage(ThreadedProvider):
    """Jobs, steps and plans in MongoDB, through pymongo on the provider's threads.

    `mongomock://` URLs share `capabilities` with real servers, but their data lives in this
    process only.
    """

    capabilities: ClassVar[StorageCapabilities] = StorageCapabilities(
        external_step_plans=True, atomic_batches=False, shared_across_processes=True
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
        self.prefix = _prefix_of(url)
        self.mock = url.scheme == "mongomock"
        client: Any
        if self.mock:
            client, lock = _mongomock_client(url)
            self._serial: contextlib.AbstractContextManager[Any] = lock
        else:
            named = {option.lower() for option in url.query}
            extra = {} if "appname" in named else {"appname": "choreography-ray"}
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


class _Base:
    def __init__(self, provider: MongoStorage, key: JobKey, partition: MongoPartition) -> None:
        self.key = key
        self._provider = provider
        self._p = partition
        self._codec: RecordCodec = provider.codec

    async def _run(self, fn: Callable[[], T]) -> T:
        return await self._provider.run(self._provider.call, self._p, fn)


class MongoJobStorage(JobLookup, _Base):
    async def find(self, job_id: str) -> JobState | None:
        check_id(job_id, "job id")
        document = await self._run(lambda: self._p.jobs.find_one({"_id": job_id}))
        if document is None:
            return None
        return self._codec.decode_job(_raw(document.get("state")), _version(document), job_id)

    async def save(self, state: JobState) -> int:
        check_id(state.id, "job id")
        check_job_key(state, self.key)
        job_id = state.id
        expected = state.version
        token = uuid.uuid4().hex
        document = {
            "_id": job_id,
            "type": state.type,
            "status": int(state.status),
            "created": Int64(to_micros(state.created)),
            "stopFinalized": state.stop_finalized,
            "version": Int64(expected + 1),
            "writeToken": token,
            "state": _storable(self._codec.job_document(state)),
        }
        jobs = self._p.jobs

        def write() -> int:
            if expected == 0:
                try:
                    jobs.insert_one(dict(document))
                    return 1
                except DuplicateKeyError:
                    pass
            else:
                result = jobs.replace_one({"_id": job_id, "version": Int64(expected)}, document)
                if result.matched_count == 1:
                    return expected + 1
            stored = jobs.find_one({"_id": job_id}, {"version": 1, "writeToken": 1})
            if (
                stored is not None
                and stored.get("writeToken") == token
                and _version(stored) == expected + 1
            ):
                return expected + 1  # an earlier attempt of this call was applied
            found = _version(stored) if stored is not None else 0
            raise VersionConflictError(
                f"job {job_id!r}: stored version is {found}, write expected {expected}",
                [job_id],
            )

        return await self._run(write)

    async def remove(self, job_id: str) -> bool:
        check_id(job_id, "job id")
        result = await self._run(lambda: self._p.jobs.delete_one({"_id": job_id}))
        return result.deleted_count == 1

    async def remove_terminal(self, job_id: str) -> bool:
        check_id(job_id, "job id")
        terminal = sorted(int(s) for s in TERMINAL_JOB_STATUSES)
        result = await self._run(
            lambda: self._p.jobs.delete_one({"_id": job_id, "status": {"$in": terminal}})
        )
        return result.deleted_count == 1

    @staticmethod
    def _filter(query: JobQuery) -> dict[str, Any]:
        filter: dict[str, Any] = {}
        if query.type is not None:
            filter["type"] = query.type
        if query.statuses:
            filter["status"] = {"$in": sorted(int(s) for s in query.statuses)}
        if query.created_before is not None:
            filter["created"] = {"$lt": Int64(to_micros(query.created_before))}
        return filter

    def _decode_all(self, documents: Iterable[Mapping[str, Any]]) -> list[JobState]:
        decoded = (
            self._codec.decode_job_or_skip(
                _raw(document.get("state")), _version(document), str(document["_id"])
            )
            for document in documents
        )
        return [state for state in decoded if state is not None]

    async def query(self, query: JobQuery | None = None) -> list[JobState]:
        query = query or JobQuery()
        filter = self._filter(query)

        def read() -> list[JobState]:
            cursor = self._p.jobs.find(filter, {"state": 1, "version": 1})
            cursor = cursor.sort([("created", ASCENDING), ("_id", ASCENDING)])
            if query.skip:
                cursor = cursor.skip(query.skip)
            if query.take > 0:
                cursor = cursor.limit(query.take)
            return self._decode_all(cursor)

        return await self._run(read)

    async def count(self, query: JobQuery | None = None) -> int:
        filter = self._filter(query or JobQuery())
        return await self._run(lambda: self._p.jobs.count_documents(filter))

    async def get_jobs_excluding_finalized_stops(
        self, statuses: Iterable[JobStatus]
    ) -> list[JobState]:
        filter = {
            "status": {"$in": sorted({int(s) for s in statuses})},
            "$nor": [{"status": int(JobStatus.STOPPED), "stopFinalized": True}],
        }

        def read() -> list[JobState]:
            cursor = self._p.jobs.find(filter, {"state": 1, "version": 1})
            return self._decode_all(cursor.sort([("created", ASCENDING), ("_id", ASCENDING)]))

        return await self._run(read)


class MongoJobStepStorage(StepLookup, _Base):
    async def find(self, job_id: str, step_id: str) -> JobStepState | None:
        check_id(job_id, "job id")
        check_id(step_id, "step id")
        document = await self._run(
            lambda: self._p.steps.find_one({"_id": _step_key(job_id, step_id)})
        )
        if document is None:
            return None
        return self._codec.decode_step(_raw(document.get("state")), _version(document), step_id)

    async def get_many(self, job_id: str, step_ids: Sequence[str]) -> list[JobStepState]:
        check_id(job_id, "job id")
        wanted = [check_id(step_id, "step id") for step_id in step_ids]

        def read() -> list[JobStepState]:
            found: dict[str, JobStepState] = {}
            for start in range(0, len(wanted), PLAN_BATCH):
                keys = [
                    _step_key(job_id, step_id) for step_id in wanted[start : start + PLAN_BATCH]
                ]
                for document in self._p.steps.find(
                    {"_id": {"$in": keys}}, {"stepId": 1, "state": 1, "version": 1}
                ):
                    step_id = str(document.get("stepId"))
                    state = self._codec.decode_step_or_skip(
                        _raw(document.get("state")), _version(document), step_id
                    )
                    if state is not None:
                        found[step_id] = state
            return [found[step_id] for step_id in wanted if step_id in found]

        return await self._run(read)

    async def save(self, state: JobStepState) -> int:
        return (await self.save_many([state]))[0]

    async def save_many(self, states: Sequence[JobStepState]) -> list[int]:
        if not states:
            return []
        pairs = check_batch(states)
        token = uuid.uuid4().hex
        expected = [state.version for state in states]
        documents = [
            {
                "_id": _step_key(state.job_id, state.id),
                "jobId": state.job_id,
                "stepId": state.id,
                "status": int(state.status),
                "stage": state.stage,
                "version": Int64(state.version + 1),
                "writeToken": token,
                "state": _storable(self._codec.step_document(state)),
            }
            for state in states
        ]

        def write() -> list[int]:
            operations = [
                (
                    None if version == 0 else {"_id": document["_id"], "version": Int64(version)},
                    document,
                )
                for document, version in zip(documents, expected, strict=True)
            ]
            try:
                details = self._p.write_steps(operations)
            except BulkWriteError as error:
                details = error.details
                unexpected = [
                    e for e in details.get("writeErrors", ()) if e.get("code") != _DUPLICATE_KEY
                ]
                if unexpected or details.get("writeConcernErrors"):
                    raise
            suspects = {int(e["index"]) for e in details.get("writeErrors", ())}
            replaces = [i for i, version in enumerate(expected) if version != 0]
            if details.get("nMatched", 0) < len(replaces):
                suspects.update(replaces)
            conflicts = self._conflicts(sorted(suspects), pairs, expected, token)
            if conflicts:
                lost = set(conflicts)
                raise VersionConflictError(
                    f"{len(conflicts)} step record(s) changed since they were read "
                    f"(first: {conflicts[0]!r}); the other records of the batch were written",
                    conflicts,
                    applied={
                        state.id: version + 1
                        for state, version in zip(states, expected, strict=True)
                        if state.id not in lost
                    },
                )
            return [version + 1 for version in expected]

        return await self._run(write)

    def _conflicts(
        self,
        suspects: list[int],
        pairs: list[tuple[str, str]],
        expected: list[int],
        token: str,
    ) -> list[str]:
        """The step ids among `suspects` that this call did not write."""
        if not suspects:
            return []
        stored: dict[tuple[str, str], Mapping[str, Any]] = {}
        for start in range(0, len(suspects), PLAN_BATCH):
            ids = [_step_key(*pairs[i]) for i in suspects[start : start + PLAN_BATCH]]
            for document in self._p.steps.find(
                {"_id": {"$in": ids}}, {"jobId": 1, "stepId": 1, "version": 1, "writeToken": 1}
            ):
                stored[(document.get("jobId"), document.get("stepId"))] = document
        conflicts = []
        for i in suspects:
            document = stored.get(pairs[i])
            applied = (
                document is not None
                and document.get("writeToken") == token
                and _version(document) == expected[i] + 1
            )
            if not applied:
                conflicts.append(pairs[i][1])
        return conflicts

    @staticmethod
    def _filter(job_id: str, statuses: Iterable[JobStepStatus] | None) -> dict[str, Any]:
        check_id(job_id, "job id")
        filter: dict[str, Any] = {"jobId": job_id}
        if statuses is not None:
            filter["status"] = {"$in": sorted({int(s) for s in statuses})}
        return filter

    async def get_for_job(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> list[JobStepState]:
        filter = self._filter(job_id, statuses)

        def read() -> list[JobStepState]:
            cursor = self._p.steps.find(filter, {"stepId": 1, "state": 1, "version": 1})
            cursor = cursor.sort([("stage", ASCENDING), ("stepId", ASCENDING)])
            decoded = (
                self._codec.decode_step_or_skip(
                    _raw(document.get("state")), _version(document), str(document.get("stepId"))
                )
                for document in cursor
            )
            return [state for state in decoded if state is not None]

        return await self._run(read)

    async def count_for_job(
        self, job_id: str, statuses: Iterable[JobStepStatus] | None = None
    ) -> int:
        filter = self._filter(job_id, statuses)
        return await self._run(lambda: self._p.steps.count_documents(filter))

    async def count_by_status(self, job_id: str) -> dict[JobStepStatus, int]:
        filter = self._filter(job_id, None)
        pipeline = [{"$match": filter}, {"$group": {"_id": "$status", "n": {"$sum": 1}}}]
        groups = await self._run(lambda: list(self._p.steps.aggregate(pipeline)))
        return {JobStepStatus(group["_id"]): int(group["n"]) for group in groups}

    async def remove(self, job_id: str, step_id: str) -> bool:
        check_id(job_id, "job id")
        check_id(step_id, "step id")
        result = await self._run(
            lambda: self._p.steps.delete_one({"_id": _step_key(job_id, step_id)})
        )
        return result.deleted_count == 1

    async def remove_all_for_job(self, job_id: str) -> int:
        filter = self._filter(job_id, None)
        result = await self._run(lambda: self._p.steps.delete_many(filter))
        return result.deleted_count

    async def remove_all_non_failed_for_job(self, job_id: str) -> int:
        filter = self._filter(job_id, None)
        kept = sorted(int(s) for s in (JobStepStatus.FAILED, JobStepStatus.COMPLETED_WITH_FAILURE))
        filter["status"] = {"$nin": kept}
        result = await self._run(lambda: self._p.steps.delete_many(filter))
        return result.deleted_count


class MongoStepPlanStorage(_Base):
    async def save_plan(self, job_id: str, incarnation: int, steps: Sequence[PlannedStep]) -> None:
        """Delete this incarnation's earlier (possibly partial) attempt, then insert in batches.

        The whole of it is one retried unit: a retry starts again with the delete, and each
        entry's `_id` names its place in the plan, so no attempt can leave two copies of one.
        """
        check_id(job_id, "job id")
        entries = [_storable(json.loads(self._codec.encode_planned(planned))) for planned in steps]
        plans = self._p.plans

        def write() -> None:
            plans.delete_many({"jobId": job_id, "incarnation": incarnation})
            for start in range(0, len(entries), PLAN_BATCH):
                plans.insert_many(
                    [
                        {
                            "_id": {"jobId": job_id, "incarnation": incarnation, "ordinal": n},
                            "jobId": job_id,
                            "incarnation": incarnation,
                            "ordinal": n,
                            "entry": entries[n],
                        }
                        for n in range(start, min(start + PLAN_BATCH, len(entries)))
                    ],
                    ordered=True,
                )

        await self._run(write)

    async def load_plan(self, job_id: str, incarnation: int) -> list[PlannedStep]:
        check_id(job_id, "job id")

        def read() -> list[PlannedStep]:
            cursor = self._p.plans.find(
                {"jobId": job_id, "incarnation": incarnation}, {"entry": 1, "_id": 0}
            ).sort("ordinal", ASCENDING)
            return [self._codec.decode_planned(_raw(document.get("entry"))) for document in cursor]

        return await self._run(read)

    async def delete_plan(self, job_id: str, incarnation: int) -> int:
        check_id(job_id, "job id")
        result = await self._run(
            lambda: self._p.plans.delete_many({"jobId": job_id, "incarnation": incarnation})
        )
        return result.deleted_count
