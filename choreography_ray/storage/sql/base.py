"""What the SQL record calls of a partition share: the provider's units of work they run on.

`SqlStorage` (`provider`) owns connections, threads and transactions; the classes of `jobs`,
`steps` and `plans` turn the storage protocol's calls into statements over the tables of
`schema`, through the `SqlUnits` it offers.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection

from ...jobs.state import JobKey
from ..codec import RecordCodec
from .schema import Statements

T = TypeVar("T")

ANALYZE_AFTER = 1000
"""A PostgreSQL steps table without statistics is analyzed after a batch inserts this many."""


class SqlUnits(Protocol):
    """What the records need of their provider."""

    codec: RecordCodec
    sql: Statements
    is_sqlite: bool

    async def run(self, fn: Callable[..., T], *args: Any) -> T: ...

    async def run_quick(self, fn: Callable[..., T], *args: Any) -> T: ...

    async def run_read(self, fn: Callable[..., T], *args: Any) -> T: ...

    async def read(self, fn: Callable[..., T], *args: Any) -> T: ...

    def autocommit(self) -> Connection: ...

    def transaction(
        self, *, defer_checkpoint: bool = False
    ) -> AbstractContextManager[Connection]: ...

    def analyze_new_steps(self) -> None: ...


class SqlRecords:
    """The base of a partition's job and step storages."""

    def __init__(self, provider: SqlUnits, key: JobKey) -> None:
        self.provider = provider
        self.key = key
        self._codec: RecordCodec = provider.codec
        self._sql = provider.sql
        self._run = provider.run
        self._quick = provider.run_quick
        self._read = provider.run_read
        self._listing = provider.read


def scalar(provider: SqlUnits, statement: Any) -> int:
    with provider.autocommit() as connection:
        return int(connection.execute(statement).scalar() or 0)
