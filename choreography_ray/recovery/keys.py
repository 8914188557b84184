"""Which partitions a recovery pass visits: storage's durable catalog, plus key providers.

Storage answers which (scope, namespace) pairs hold unfinished jobs, so after a whole-cluster
restart every such partition is found with no user code and no host having to remember it. A
user may add key providers, for partitions storage cannot name (or to recover before storage
can answer): a callable taking nothing and returning an iterable of `(scope, namespace)` pairs
or `JobKey`s, synchronous or asynchronous, passed in code, named as `module:callable`, or
registered under the entry point group `choreography_ray.key_providers`.

Each pass asks every source at once and each within a time bound; one that fails or does not
answer is logged and left out of that pass, the others still count, and the catalog says it is
incomplete. A failed source is then asked again on its own, after 1 s doubling to 60 s, like a
failed rehydration (`retries.Retries`), until it answers; the keys it gives then go to `found`
(the host recovers their partitions), with no membership change or sweep needed. A storage
provider of the user's own that keeps no catalog of its partitions
(`capabilities.partition_catalog` False) names only the partitions it opened in this process:
with no key provider beside it, the catalog is incomplete too, so every host recovers what it
knows (electing one would miss partitions only another opened), and a warning at start-up names
the provider and what to configure: recovery is never silently partial. Entry points and named
callables are loaded again on each ask, so one that failed to import is retried too. Only
callables the user names are imported; nothing read from storage ever is.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from ..engine.clock import Clock, SystemClock
from ..engine.manager import INTERRUPTED_STATUSES
from ..jobs.errors import ConfigurationError
from ..jobs.options import CALLABLE_NAME
from ..jobs.state import JobKey
from ..storage.provider import StorageProvider
from ..storage.retry import one_line
from .liveness import Bound, HostGone
from .retries import Retries

log = logging.getLogger("choreography_ray.recovery")

KEY_PROVIDERS_GROUP = "choreography_ray.key_providers"
"""The entry point group whose entries are key providers."""

STORAGE_SOURCE = "storage"
"""How the storage catalog is named among the sources of a pass."""

ENTRY_POINTS_SOURCE = "entry points"
"""How the listing of installed entry points is named when it fails."""

DEFAULT_TIMEOUT = 30.0
"""Seconds a source has to answer before the pass goes on without it."""

KeyProvider = Callable[[], Any]
"""Returns an iterable (or async iterable, or an awaitable of an iterable) of `JobKey`s or
`(scope, namespace)` pairs."""


@dataclass(frozen=True)
class KeyCatalog:
    """The partitions one pass found, each once, and the sources that failed to answer."""

    keys: tuple[JobKey, ...]
    failed: tuple[str, ...] = ()
    partial: tuple[str, ...] = ()
    """Sources that answered but can name only part of the partitions (asking again would
    not help): a storage provider without a catalog, when no key provider names the rest."""

    @property
    def complete(self) -> bool:
        """Every source answered, and for every partition: none with unfinished jobs is
        missing."""
        return not self.failed and not self.partial


def named_provider(name: str) -> EntryPoint:
    """A key provider the user names as `module:callable`; imported on each pass, not here.

    Raises `ConfigurationError` at once for a name of any other form.
    """
    if not isinstance(name, str) or not CALLABLE_NAME.match(name.strip()):
        raise ConfigurationError(
            f"key provider {name!r}: expected an importable callable as module:callable, "
            "e.g. myapp.recovery:job_keys"
        )
    return EntryPoint(name=name.strip(), value=name.strip(), group=KEY_PROVIDERS_GROUP)


def registered_providers() -> list[EntryPoint]:
    """The entry points installed packages register under `KEY_PROVIDERS_GROUP`."""
    return sorted(entry_points(group=KEY_PROVIDERS_GROUP), key=lambda ep: ep.name)


class KeyCatalogReader:
    """Reads the catalog of a host: storage's, combined with every key provider.

    `providers` are callables given in code; `names` are `module:callable` names the user
    configured; entry points of `KEY_PROVIDERS_GROUP` are read on each pass unless
    `entry_points` is False. The first incomplete pass is warned about once; each failure is
    logged on every pass.
    """

    def __init__(
        self,
        storage: StorageProvider,
        providers: Sequence[KeyProvider] = (),
        *,
        names: Sequence[str] = (),
        entry_points: bool = True,
        timeout: float = DEFAULT_TIMEOUT,
        clock: Clock | None = None,
    ) -> None:
        if not timeout > 0:
            raise ConfigurationError(
                f"key catalog timeout must be a positive number of seconds, got {timeout!r}"
            )
        self.storage = storage
        self.providers = list(providers)
        self.named = [named_provider(name) for name in names]
        self.entry_points = entry_points
        clock = clock or SystemClock()
        self._bound = Bound(timeout, clock)
        self._warned = False
        self._warned_partial = False
        self._sources: dict[str, Callable[[], Awaitable[list[JobKey]]]] = {}
        self._retries: Retries[str] = Retries(self._ask_again, clock, what="key source")
        self.found: Callable[[list[JobKey]], Awaitable[Any]] | None = None
        """Told the keys of a source that answered on its own retry, after a pass missed it."""

    async def read(self) -> KeyCatalog:
        """Ask every source at once; the keys they gave, deduplicated and sorted."""
        sources: dict[str, Callable[[], Awaitable[list[JobKey]]]] = {
            STORAGE_SOURCE: self._storage_keys
        }
        sources.update((_name_of(provider), _calling(provider)) for provider in self.providers)
        sources.update((named.value, _loading(named)) for named in self.named)
        failed = []
        if self.entry_points:
            try:
                sources.update(await _installed())
            except Exception as error:
                log.warning("the installed key providers cannot be listed: %s", one_line(error))
                failed.append(ENTRY_POINTS_SOURCE)
                self._retries.failed(ENTRY_POINTS_SOURCE, error)
            else:
                self._retries.succeeded(ENTRY_POINTS_SOURCE)
        self._sources.update(sources)
        answers = await asyncio.gather(*(self._ask(name, call) for name, call in sources.items()))
        keys: set[JobKey] = set()
        for name, answer in zip(sources, answers, strict=True):
            if isinstance(answer, Exception):
                failed.append(name)
                self._retries.failed(name, answer)
            else:
                keys.update(answer)
                self._retries.succeeded(name)
        catalog = KeyCatalog(
            keys=tuple(sorted(keys, key=lambda key: (key.scope, key.namespace))),
            failed=tuple(failed),
            partial=self._partial(key_providers=len(sources) > 1),
        )
        if catalog.failed and not self._warned:
            self._warned = True
            log.warning(
                "recovery's key catalog is incomplete (%s did not answer): a partition only "
                "they know is not recovered until a pass reads it",
                ", ".join(catalog.failed),
            )
        return catalog

    def _partial(self, *, key_providers: bool) -> tuple[str, ...]:
        """The storage source, when it names only the partitions this process opened and no
        key provider is there to name the rest; warned about once, at the first pass."""
        if self.storage.capabilities.partition_catalog or key_providers:
            return ()
        if not self._warned_partial:
            self._warned_partial = True
            log.warning(
                "recovery is incomplete: storage provider %s keeps no catalog of its "
                "partitions, so a pass finds only the partitions this host opened (and those "
                "configured), and a job in any other is not recovered until a host that "
                "opens its partition runs a pass. Implement keys_with_jobs on %s and set "
                "StorageCapabilities(partition_catalog=True), or configure key providers "
                "(key_providers, CHOREOGRAPHY_KEY_PROVIDERS, or the entry point group %s)",
                self.storage,
                type(self.storage).__name__,
                KEY_PROVIDERS_GROUP,
            )
        return (f"{STORAGE_SOURCE} ({type(self.storage).__name__} keeps no partition catalog)",)

    async def _storage_keys(self) -> list[JobKey]:
        return await self.storage.keys_with_jobs(INTERRUPTED_STATUSES)

    async def _ask(
        self, name: str, call: Callable[[], Awaitable[list[JobKey]]]
    ) -> list[JobKey] | Exception:
        """The source's keys, or why (logged) it failed or did not answer in time."""
        try:
            return await self._bound(call(), name)
        except HostGone as error:
            log.warning(
                "key source %s did not answer within %gs; this pass goes on without it",
                name,
                self._bound.seconds,
            )
            return error
        except Exception as error:
            log.warning(
                "key source %s failed; this pass goes on without it: %s: %s",
                name,
                type(error).__name__,
                one_line(error),
            )
            return error

    async def _ask_again(self, name: str) -> None:
        """A retry of a failed source on its own (raises while it fails); the keys it gives
        go to `found`. The entry point listing, retried, asks every installed provider."""
        if name == ENTRY_POINTS_SOURCE:
            installed = await _installed()
            self._sources.update(installed)
            calls = list(installed.values())
        else:
            calls = [self._sources[name]]
        keys: list[JobKey] = []
        for call in calls:
            keys += await self._bound(call(), name)
        if self.found is not None:
            await self.found(sorted(set(keys), key=lambda key: (key.scope, key.namespace)))

    def close(self) -> None:
        """Stop retrying failed sources (the host stops)."""
        self._retries.close()


async def _installed() -> dict[str, Callable[[], Awaitable[list[JobKey]]]]:
    """The installed entry points, by their name as a source."""
    installed = await asyncio.to_thread(registered_providers)
    return {f"entry point {ep.name}": _loading(ep) for ep in installed}


def _name_of(provider: KeyProvider) -> str:
    module = getattr(provider, "__module__", None) or type(provider).__module__
    qualname = getattr(provider, "__qualname__", None) or type(provider).__qualname__
    return f"{module}:{qualname}"


def _calling(provider: KeyProvider) -> Callable[[], Awaitable[list[JobKey]]]:
    async def call() -> list[JobKey]:
        return await _keys_of(provider)

    return call


def _loading(entry_point: EntryPoint) -> Callable[[], Awaitable[list[JobKey]]]:
    async def call() -> list[JobKey]:
        provider = await asyncio.to_thread(entry_point.load)
        return await _keys_of(provider)

    return call


async def _keys_of(provider: Any) -> list[JobKey]:
    """Call the provider (a synchronous one on a thread: it may do I/O) and read its keys."""
    if not callable(provider):
        raise TypeError(f"{provider!r} is not callable")
    if inspect.iscoroutinefunction(provider):
        answer = await provider()
    else:
        answer = await asyncio.to_thread(_gather_sync, provider)
    if inspect.isawaitable(answer):
        answer = await answer
    if isinstance(answer, AsyncIterable):
        answer = [item async for item in answer]
    if not isinstance(answer, Iterable) or isinstance(answer, str | bytes):
        raise TypeError(f"returned {answer!r}, not an iterable of (scope, namespace) pairs")
    return [_key(item) for item in answer]


def _gather_sync(provider: Callable[[], Any]) -> Any:
    """Call a synchronous provider and, on the same thread, read a plain iterable it returns."""
    answer = provider()
    if inspect.isawaitable(answer) or isinstance(answer, AsyncIterable):
        return answer
    if isinstance(answer, Iterable) and not isinstance(answer, str | bytes):
        return list(answer)
    return answer


def _key(item: Any) -> JobKey:
    if isinstance(item, JobKey):
        return item
    if isinstance(item, tuple | list) and len(item) == 2:
        scope, namespace = item
        try:
            return JobKey(scope=scope, namespace=namespace)
        except ValueError as error:
            raise ValueError(f"returned {item!r}, not a valid key: {one_line(error)}") from None
    raise TypeError(f"returned {item!r}, not a (scope, namespace) pair")
