"""Fault injection: storage that fails chosen writes, for testing what survives them.

    faults = WriteFaults(fail_at={3})
    cluster = InProcessCluster(wrap_storage=faults.wrap)

Every write (job save and removal, step saves and removals, plan saves and deletes) is numbered
from 1 across the whole cluster; the writes named in `fail_at` raise `StorageUnavailableError`
without touching storage, as a store that went away mid-operation would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..jobs.errors import StorageUnavailableError
from ..storage.protocols import JobsStorage

JOB_WRITES = ("save", "remove", "remove_terminal")
STEP_WRITES = ("save", "save_many", "remove", "remove_all_for_job", "remove_all_non_failed_for_job")
PLAN_WRITES = ("save_plan", "delete_plan")


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
