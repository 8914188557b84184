"""Recovery: rehydration of interrupted jobs, key providers, election, watchdog and leases.

A jobs manager is handed its recovery (`JobsManager(ctx, recovery=Rehydration)`): the engine
never imports this package.
"""

from .keys import KEY_PROVIDERS_GROUP, KeyCatalog, KeyCatalogReader, KeyProvider, named_provider
from .rehydration import Rehydration, RehydrationReport

__all__ = [
    "KEY_PROVIDERS_GROUP",
    "KeyCatalog",
    "KeyCatalogReader",
    "KeyProvider",
    "Rehydration",
    "RehydrationReport",
    "named_provider",
]
