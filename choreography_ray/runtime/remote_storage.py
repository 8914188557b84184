"""`memory://` shared by every process of a cluster: one named actor holds the data.

Hosts on other processes open the same URL and get a provider whose storages forward every
call to that actor, so all hosts see one store, as they would a database.

The forwarding goes by method name, but only the names the storage protocols declare
(`JobStorage`, `JobStepStorage`, `StepPlanStorage`), on both ends: callers are type-checked
against those protocols, and the actor refuses any other name. Keyword arguments travel too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import ray

from ..engine.clock import SystemClock
from ..jobs.errors import InvalidOperationError, StorageUnavailableError
from ..jobs.options import JobsOptions
from ..jobs.registry import TypeRegistry, default_registry
from ..jobs.state import JobKey
from ..jobs.status import JobStatus
from ..recovery.liveness import Bound, HostGone
from ..storage.memory import MemoryStorage
from ..storage.protocols import (
    JobsStorage,
    JobStepStorage,
    JobStorage,
    StepPlanStorage,
    StorageCapabilities,
)
from ..storage.provider import StorageProvider
from ..storage.schemes import open_storage
from ..storage.url import StorageURL
from .constants import STORAGE_ACTOR

_IMPORT_BOUNDS = 6
"""How many `host_call_timeout`s the storage actor may take to import job modules."""


def _methods(protocol: type) -> frozenset[str]:
    declared = vars(protocol).items()
    return frozenset(name for name, value in declared if callable(value) and name[0] != "_")


PART_METHODS: Mapping[str, frozenset[str]] = {
    "jobs": _methods(JobStorage),
    "steps": _methods(JobStepStorage),
    "plans": _methods(StepPlanStorage),
}
"""The methods a partition's part may be asked for: its protocol's, and no other."""


def _declared(part: str, method: str) -> None:
    if method not in PART_METHODS.get(part, frozenset()):
        raise InvalidOperationError(
            f"storage has no operation {part}.{method}: the storage protocols declare "
            f"{', '.join(sorted(PART_METHODS.get(part, PART_METHODS)))}"
        )


class StorageActor:
    """Holds a `memory://` store for the whole cluster."""

    def __init__(self, url: str, modules: list[str]) -> None:
        from .config import import_modules

        import_modules(modules)
        self.provider = open_storage(url)

    async def call(
        self,
        key: JobKey,
        part: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """`method` of one part of a partition, a method its protocol declares."""
        _declared(part, method)
        storage = self.provider.for_key(key)
        return await getattr(getattr(storage, part), method)(*args, **(kwargs or {}))

    async def keys_with_jobs(self, statuses: list[JobStatus]) -> list[JobKey]:
        return await self.provider.keys_with_jobs(statuses)

    async def import_modules(self, modules: list[str]) -> None:
        """Job modules added later: the store must resolve their type names too."""
        from .config import import_modules

        import_modules(modules)


class _Forward:
    """One part of a partition (jobs, steps, plans) whose calls go to the storage actor, each
    bounded by `host_call_timeout` like every call between the cluster's actors."""

    def __init__(self, actor: Any, key: JobKey, part: str, bound: Bound) -> None:
        self._actor = actor
        self._key = key
        self._part = part
        self._bound = bound

    def __getattr__(self, method: str) -> Any:
        """The forwarding call for `method`, made once and kept (storage calls are hot); a
        name the part's protocol does not declare is no attribute, as on any store."""
        if method not in PART_METHODS[self._part]:
            raise AttributeError(method)

        async def call(*args: Any, **kwargs: Any) -> Any:
            # Without keywords, the previous release's four arguments: its storage actor
            # may still run during a rolling upgrade.
            sent = (self._key, self._part, method, args, *([kwargs] if kwargs else []))
            answer = self._actor.call.remote(*sent)
            try:
                return await self._bound(answer, STORAGE_ACTOR)
            except HostGone:
                raise StorageUnavailableError(
                    f"the storage actor did not answer {self._part}.{method} "
                    f"within {self._bound.seconds:g}s"
                ) from None

        setattr(self, method, call)
        return call


class RemoteMemoryStorage(StorageProvider):
    """A provider whose data lives in the cluster's storage actor."""

    capabilities: ClassVar[StorageCapabilities] = MemoryStorage.capabilities

    def __init__(
        self,
        url: StorageURL,
        *,
        namespace: str,
        modules: list[str],
        registry: TypeRegistry | None = None,
        options: JobsOptions | None = None,
    ) -> None:
        super().__init__(url, registry=registry or default_registry, options=options)
        self.actor: Any = (  # an actor handle: its methods are Ray's, found at run time
            ray.remote(StorageActor)
            .options(
                name=STORAGE_ACTOR,
                namespace=namespace,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=0,
                max_concurrency=1000,
            )
            .remote(url.raw, modules)
        )
        self.bound = Bound(self.options.host_call_timeout.total_seconds(), SystemClock())
        self.import_bound = Bound(_IMPORT_BOUNDS * self.bound.seconds, self.bound.clock)

    async def import_modules(self, modules: list[str]) -> None:
        # Bounded like every call to the actor, but generously: importing job modules may
        # load heavy libraries, and a slow import is not a storage actor that is gone.
        try:
            await self.import_bound(self.actor.import_modules.remote(modules), STORAGE_ACTOR)
        except HostGone:
            raise StorageUnavailableError(
                "the storage actor did not import job modules "
                f"within {self.import_bound.seconds:g}s"
            ) from None

    async def keys_with_jobs(self, statuses: Iterable[JobStatus]) -> list[JobKey]:
        try:
            keys: list[JobKey] = await self.bound(
                self.actor.keys_with_jobs.remote(list(statuses)), STORAGE_ACTOR
            )
        except HostGone:
            raise StorageUnavailableError(
                f"the storage actor did not answer within {self.bound.seconds:g}s"
            ) from None
        return keys

    def _open_partition(self, key: JobKey) -> JobsStorage:
        bound = self.bound
        return JobsStorage(
            key=key,
            jobs=_Forward(self.actor, key, "jobs", bound),
            steps=_Forward(self.actor, key, "steps", bound),
            plans=_Forward(self.actor, key, "plans", bound),
        )
