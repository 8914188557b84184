"""Which provider a storage URL opens: one registry of URL schemes.

Each scheme names its provider class and, for a driver that is an optional extra, the driver's
module and the extra that installs it, in one entry, so the two can never disagree. A provider
named as `module:Class` is imported only when its scheme is used, so SQLite never imports
pymongo. Register a provider of your own with `PROVIDERS.register("myscheme", MyProvider)` in
every process that opens its URLs (docs/storage.md).
"""

from __future__ import annotations

import importlib
import re
import threading
from dataclasses import dataclass
from typing import Any

from ..jobs.errors import ConfigurationError
from ..jobs.options import CALLABLE_NAME, JobsOptions
from ..jobs.registry import TypeRegistry
from .provider import StorageProvider
from .url import StorageURL

SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*$")
"""A URL scheme as RFC 3986 spells it, in lower case (`StorageURL.scheme` is lower case)."""


@dataclass(frozen=True)
class Scheme:
    """What one URL scheme opens."""

    provider: str | type[StorageProvider]
    """The provider class, or `module:Class` to import on first use."""
    driver: str | None = None
    """The driver module the provider needs that may not be installed."""
    extra: str | None = None
    """The package extra that installs `driver`."""


class ProviderRegistry:
    """URL scheme -> `Scheme`; `open_storage` asks it for the class of a URL's provider."""

    def __init__(self) -> None:
        self._schemes: dict[str, Scheme] = {}
        self._lock = threading.Lock()

    def register(
        self,
        scheme: str,
        provider: str | type[StorageProvider],
        *,
        driver: str | None = None,
        extra: str | None = None,
    ) -> None:
        """Let URLs of `scheme` open `provider`. Registering the same again changes nothing;
        a scheme already taken by another provider is refused, since two parts of one program
        opening different stores under one URL would lose data silently."""
        if not isinstance(scheme, str) or not SCHEME.match(scheme):
            raise ConfigurationError(
                f"storage scheme {scheme!r}: expected lower-case letters, digits, '+', '-' "
                "or '.', starting with a letter (e.g. 'mystore')"
            )
        if isinstance(provider, str):
            if not CALLABLE_NAME.match(provider):
                raise ConfigurationError(
                    f"storage scheme {scheme!r}: provider {provider!r} is not module:Class"
                )
        elif not (isinstance(provider, type) and issubclass(provider, StorageProvider)):
            raise ConfigurationError(
                f"storage scheme {scheme!r}: {provider!r} is not a StorageProvider subclass"
            )
        entry = Scheme(provider, driver, extra)
        with self._lock:
            taken = self._schemes.get(scheme)
            if taken is not None and taken != entry:
                raise ConfigurationError(
                    f"storage scheme {scheme!r} already opens {_name(taken.provider)}; "
                    f"it cannot also open {_name(provider)}"
                )
            self._schemes[scheme] = entry

    @property
    def schemes(self) -> list[str]:
        with self._lock:
            return sorted(self._schemes)

    def provider_class(self, url: StorageURL) -> type[StorageProvider]:
        """The provider class of `url`'s scheme; `ConfigurationError` naming what is wrong
        (an unknown scheme, a missing driver and the extra to install, a missing module)."""
        with self._lock:
            entry = self._schemes.get(url.scheme)
        if entry is None:
            raise ConfigurationError(
                f"storage URL {url.redacted!r}: unknown scheme {url.scheme!r}; "
                f"supported: {', '.join(self.schemes)}"
            )
        _require_driver(url, entry)
        if not isinstance(entry.provider, str):
            return entry.provider
        module_name, _, class_name = entry.provider.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ConfigurationError(
                f"storage URL {url.redacted!r}: its provider {module_name} cannot be imported: "
                f"module {error.name!r} is missing"
            ) from error
        cls = getattr(module, class_name, None)
        if not (isinstance(cls, type) and issubclass(cls, StorageProvider)):
            raise ConfigurationError(f"{entry.provider} is not a storage provider")
        return cls


def _require_driver(url: StorageURL, entry: Scheme) -> None:
    """Fail with the extra to install when the URL's driver is missing, before any import of
    the provider trips over it."""
    if entry.driver is None:
        return
    try:
        importlib.import_module(entry.driver)
    except ImportError:
        install = f"pip install 'choreography-ray[{entry.extra}]'" if entry.extra else "install it"
        raise ConfigurationError(
            f"storage URL {url.redacted!r} needs the {entry.driver} driver, which is not "
            f"installed: {install}"
        ) from None


def _name(provider: str | type[StorageProvider]) -> str:
    return provider if isinstance(provider, str) else f"{provider.__module__}:{provider.__name__}"


PROVIDERS = ProviderRegistry()
"""The schemes `open_storage` knows. SQLite and memory storage need nothing beyond the package;
the PostgreSQL and MongoDB drivers come with the `postgres` and `mongo` extras."""

_SQL = "choreography_ray.storage.sql:SqlStorage"
_MONGO = "choreography_ray.storage.mongo:MongoStorage"
PROVIDERS.register("memory", "choreography_ray.storage.memory:MemoryStorage")
PROVIDERS.register("sqlite", _SQL)
PROVIDERS.register("postgresql", _SQL, driver="psycopg", extra="postgres")
PROVIDERS.register("postgresql+psycopg", _SQL, driver="psycopg", extra="postgres")
PROVIDERS.register("mongodb", _MONGO, driver="pymongo", extra="mongo")
PROVIDERS.register("mongodb+srv", _MONGO, driver="pymongo", extra="mongo")
PROVIDERS.register("mongomock", _MONGO, driver="pymongo", extra="mongo")


def open_storage(
    url: str | StorageURL,
    *,
    registry: TypeRegistry | None = None,
    options: JobsOptions | None = None,
    **provider_args: Any,
) -> StorageProvider:
    """The provider for `url`. Call `await provider.initialize()` before first use."""
    parsed = url if isinstance(url, StorageURL) else StorageURL(url)
    cls = PROVIDERS.provider_class(parsed)
    return cls(parsed, registry=registry, options=options, **provider_args)
