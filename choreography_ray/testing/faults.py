"""Fault injection: storage that fails chosen writes, for testing what survives them.

    faults = WriteFaults(fail_at={3})
    cluster = InProcessCluster(wrap_storage=faults.wrap)

Every write (job save and removal, step saves and removals, plan saves and deletes) is numbered
from 1 across the whole cluster; the writes named in `fail_at` raise `StorageUnavailableError`
without touching storage, as a store that went away mid-operation would.

    outage = StorageOutage()
    cluster = InProcessCluster(wrap_storage=outage.wrap)
    outage.begin(); ...; outage.end()

`StorageOutage` is a store that is down for a while: every call, read or write, fails while it
is on, as against a stopped database server.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..jobs.errors import ConfigurationError, StorageUnavailableError
from ..jobs.state import JobState
from ..jobs.status import JobStatus
from ..storage.protocols import JobsStorage

JOB_WRITES = ("save", "remove", "remove_terminal")
STEP_WRITES = ("save", "save_many", "remove", "remove_all_for_job", "remove_all_non_failed_for_job")
PLAN_WRITES = ("save_plan", "append_plan", "delete_plan")


@dataclass
class WriteFaults:
    fail_at: set[int] = field(default_factory=set)
    fail_from: int | None = None
    """Fail every write from this number on (storage gone for good)."""
    writes: int = 0
    log: list[str] = field(default_factory=list)

    def wrap(self, storage: JobsStorage) -> JobsStorage:
        return JobsStorage(
            key=storage.key,
            jobs=_Faulty(storage.jobs, JOB_WRITES, self, "jobs"),
            steps=_Faulty(storage.steps, STEP_WRITES, self, "steps"),
            plans=_Faulty(storage.plans, PLAN_WRITES, self, "plans") if storage.plans else None,
        )

    def _check(self, what: str) -> None:
        self.writes += 1
        self.log.append(what)
        if self.writes in self.fail_at or (
            self.fail_from is not None and self.writes >= self.fail_from
        ):
            raise StorageUnavailableError(f"injected failure of write #{self.writes} ({what})")


class _Faulty:
    def __init__(self, inner: Any, writes: Iterable[str], faults: WriteFaults, name: str) -> None:
        self._inner = inner
        self._writes = set(writes)
        self._faults = faults
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        target = getattr(self._inner, attribute)
        if attribute not in self._writes:
            return target
        return _failing(target, self._faults, f"{self._name}.{attribute}")


def _failing(target: Callable[..., Any], faults: WriteFaults, what: str) -> Callable[..., Any]:
    async def call(*args: Any, **kwargs: Any) -> Any:
        faults._check(what)
        return await target(*args, **kwargs)

    return call


@dataclass
class StorageOutage:
    """Storage that is down while `down` is set: every call fails with
    `StorageUnavailableError` and touches nothing, as a stopped server's would."""

    down: bool = False
    failed: int = 0
    """Calls refused so far."""
    failed_writes: int = 0

    def begin(self) -> None:
        self.down = True

    def end(self) -> None:
        self.down = False

    def wrap(self, storage: JobsStorage) -> JobsStorage:
        return JobsStorage(
            key=storage.key,
            jobs=_Down(storage.jobs, JOB_WRITES, self, "jobs"),
            steps=_Down(storage.steps, STEP_WRITES, self, "steps"),
            plans=_Down(storage.plans, PLAN_WRITES, self, "plans") if storage.plans else None,
        )


class _Down:
    def __init__(self, inner: Any, writes: Iterable[str], outage: StorageOutage, name: str) -> None:
        self._inner = inner
        self._writes = set(writes)
        self._outage = outage
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        target = getattr(self._inner, attribute)
        if not callable(target) or attribute.startswith("_"):
            return target
        outage = self._outage
        what = f"{self._name}.{attribute}"
        write = attribute in self._writes

        async def call(*args: Any, **kwargs: Any) -> Any:
            if outage.down:
                outage.failed += 1
                outage.failed_writes += write
                raise StorageUnavailableError(f"injected outage: {what} refused")
            return await target(*args, **kwargs)

        return call


LOST_ACKS_ENV = "CHOREOGRAPHY_TESTING_LOST_ACKS"
"""The environment variable naming the `LostAcks` file of the hosts' `lost_acks` wrapper."""
LOST_ACKS_WRAPPER = f"{__name__}:lost_acks"
"""The `module:callable` to name in `testing.hooks.STORAGE_WRAPPER_ENV`."""

_ACKS_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS losing (job_id TEXT PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS lost (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT, at REAL)",
)


class LostAcks:
    """Which jobs lose the acknowledgements of their Running writes, and the ones lost: a
    SQLite file that every process on this machine reads, so a test turns the fault on and off
    while a cluster runs. A write of a chosen job's record whose status is Running is stored,
    then raises `StorageUnavailableError`, as a write whose answer never came back."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with self._connect() as connection:
            for statement in _ACKS_SCHEMA:
                connection.execute(statement)

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(str(self.path), timeout=60)
        connection.execute("PRAGMA journal_mode=WAL")
        return connection

    def lose(self, job_id: str) -> None:
        """From now on, the job's Running writes land but answer as failed."""
        with self._connect() as connection:
            connection.execute("INSERT OR IGNORE INTO losing (job_id) VALUES (?)", (job_id,))

    def restore(self, job_id: str) -> None:
        """The fault is over: the job's writes answer again."""
        with self._connect() as connection:
            connection.execute("DELETE FROM losing WHERE job_id = ?", (job_id,))

    def lost(self, job_id: str) -> list[float]:
        """When each lost acknowledgement of the job's writes was lost (`time.time()`)."""
        with self._connect() as connection:
            rows = connection.execute(
                "SELECT at FROM lost WHERE job_id = ? ORDER BY seq", (job_id,)
            ).fetchall()
        return [float(at) for (at,) in rows]

    def losing(self, job_id: str) -> bool:
        """Whether the job's acknowledgement is lost now; if so, the loss is recorded."""
        with self._connect() as connection:
            found = connection.execute(
                "SELECT 1 FROM losing WHERE job_id = ?", (job_id,)
            ).fetchone()
            if found is not None:
                connection.execute(
                    "INSERT INTO lost (job_id, at) VALUES (?, ?)", (job_id, time.time())
                )
        return found is not None

    def wrap(self, storage: JobsStorage) -> JobsStorage:
        return JobsStorage(
            key=storage.key,
            jobs=_AckLost(storage.jobs, self),
            steps=storage.steps,
            plans=storage.plans,
        )


class _AckLost:
    def __init__(self, inner: Any, acks: LostAcks) -> None:
        self._inner = inner
        self._acks = acks

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._inner, attribute)

    async def save(self, state: JobState) -> int:
        version: int = await self._inner.save(state)
        if state.status == JobStatus.RUNNING and await asyncio.to_thread(
            self._acks.losing, state.id
        ):
            raise StorageUnavailableError(
                f"injected: the acknowledgement of job {state.id}'s Running write was lost "
                "(the write landed)"
            )
        return version


def lost_acks(storage: JobsStorage) -> JobsStorage:
    """The hosts' storage wrapper (`LOST_ACKS_WRAPPER`): `LostAcks` of the file named by the
    environment variable `LOST_ACKS_ENV`."""
    path = os.environ.get(LOST_ACKS_ENV, "").strip()
    if not path:
        raise ConfigurationError(f"{LOST_ACKS_WRAPPER} needs {LOST_ACKS_ENV} to name its file")
    return LostAcks(path).wrap(storage)
