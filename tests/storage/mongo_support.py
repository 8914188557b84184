"""How the contract suite opens the MongoDB provider: on mongomock, and on a real server.

Raw writes insert documents straight into the partition's collections, bypassing the codec.
A raw `document` that is a JSON object is stored as the `state` sub-document, as the provider
stores it; anything else (invalid JSON, a JSON array) is stored as text, which reads back as a
malformed record.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bson.int64 import Int64

from choreography_ray.jobs import JobKey, TypeRegistry
from choreography_ray.storage import StorageProvider, StorageURL
from choreography_ray.storage.mongo import MongoStorage, forget_mongomock_store

from .support import MONGODB_ENV, env


def accelerate_mongomock() -> None:
    """Let mongomock find a document by a plain `_id` without scanning the collection.

    Mongomock matches every filter against every document, which makes a batch of 10,000
    compare-and-set writes quadratic and the large-batch tests minutes long. Only filters with
    a plain `_id` value take the shortcut; the document found still goes through mongomock's own
    matching. A test-only adaptation of mongomock's internals: the provider never relies on it.
    """
    try:
        from mongomock.collection import Collection
        from mongomock.filtering import filter_applies
        from mongomock.helpers import hashdict
    except ImportError:  # pragma: no cover - no mongomock, or another layout: slower, correct
        return
    scan = Collection._iter_documents
    if getattr(scan, "accelerated", False):
        return

    def iter_documents(self: Any, filter: Any) -> Iterable[Any]:
        wanted = filter.get("_id") if isinstance(filter, Mapping) else None
        if isinstance(wanted, str) or (
            isinstance(wanted, dict)
            and all(
                isinstance(k, str) and not k.startswith("$") and isinstance(v, str | int)
                for k, v in wanted.items()
            )
        ):
            stored_key = hashdict(wanted) if isinstance(wanted, dict) else wanted
            if stored_key not in self._store:
                return iter(())
            document = self._store[stored_key]
            return iter([document] if filter_applies(filter, document) else [])
        return scan(self, filter)

    iter_documents.accelerated = True  # type: ignore[attr-defined]
    Collection._iter_documents = iter_documents  # type: ignore[method-assign]


accelerate_mongomock()

RUN_PREFIX = f"ct{uuid.uuid4().hex[:8]}"
"""Database prefix shared by the tests of one run against a real server."""


def _state(document: str) -> Any:
    try:
        parsed = json.loads(document)
    except ValueError:
        return document
    return parsed if isinstance(parsed, dict) else document


async def _write_raw_job(
    provider: Any,
    key: JobKey,
    job_id: str,
    *,
    document: str,
    type: str,
    status: int,
    created_us: int,
) -> None:
    jobs = provider.partition(key).jobs
    record = {
        "_id": job_id,
        "type": type,
        "status": status,
        "created": Int64(created_us),
        "stopFinalized": False,
        "version": Int64(1),
        "state": _state(document),
    }
    await provider.run(provider.call, provider.partition(key), lambda: jobs.insert_one(record))


async def _write_raw_step(
    provider: Any, key: JobKey, job_id: str, step_id: str, *, document: str, status: int, stage: int
) -> None:
    steps = provider.partition(key).steps
    record = {
        "_id": {"jobId": job_id, "stepId": step_id},
        "jobId": job_id,
        "stepId": step_id,
        "status": status,
        "stage": stage,
        "version": Int64(1),
        "state": _state(document),
    }
    await provider.run(provider.call, provider.partition(key), lambda: steps.insert_one(record))


class MockStorage(MongoStorage):
    """Forgets its mongomock data on close, so that a test run does not pile it up."""

    async def close(self) -> None:
        await super().close()
        forget_mongomock_store(self.url.raw)


class ServerStorage(MongoStorage):
    """Drops the databases it opened on close."""

    async def close(self) -> None:
        with self._partitions_lock:
            names = [partition.database.name for partition in self._databases.values()]
        try:
            for name in names:
                await self.run(self.client.drop_database, name)
        finally:
            await super().close()


class MongomockSupport:
    name = "mongomock"

    def available(self) -> str | None:
        try:
            import mongomock  # noqa: F401
        except ImportError:  # pragma: no cover
            return "mongomock is not installed"
        return None

    async def open(self, tmp_path: Path, registry: TypeRegistry) -> StorageProvider:
        url = StorageURL(f"mongomock://localhost/contract_{uuid.uuid4().hex[:16]}")
        provider = MockStorage(url, registry=registry)
        await provider.initialize()
        return provider

    write_raw_job = staticmethod(_write_raw_job)
    write_raw_step = staticmethod(_write_raw_step)


class MongoServerSupport:
    name = "mongodb"

    def available(self) -> str | None:
        if env(MONGODB_ENV) is None:
            return f"{MONGODB_ENV} is not set"
        return None

    def url(self) -> StorageURL:
        """The server's URL with this run's database prefix in place of its path."""
        raw = env(MONGODB_ENV)
        assert raw is not None
        parts = urlsplit(raw)
        return StorageURL(urlunsplit(parts._replace(path=f"/{RUN_PREFIX}")))

    async def open(self, tmp_path: Path, registry: TypeRegistry) -> StorageProvider:
        provider = ServerStorage(self.url(), registry=registry)
        try:
            await provider.initialize()
        except BaseException:
            await provider.close()
            raise
        return provider

    write_raw_job = staticmethod(_write_raw_job)
    write_raw_step = staticmethod(_write_raw_step)
