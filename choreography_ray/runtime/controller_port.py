"""What a controller host's recovery parts need of their host: a port, so that they do not
import the host that builds them (`controller_host` imports `controller_recovery`, which
imports `membership`; neither imports `controller_host` back, not even for type hints)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ..engine.clock import Clock
from ..engine.manager import JobsManager
from ..jobs.options import JobsOptions
from ..jobs.state import JobKey
from ..recovery.keys import KeyCatalogReader
from ..recovery.retries import Partitions
from ..storage.provider import StorageProvider
from .routes import Routes


class RecoveryParts(Protocol):
    """The key catalog and the partitions being recovered (`ControllerRecovery`)."""

    @property
    def catalog(self) -> KeyCatalogReader | None: ...

    @property
    def partitions(self) -> Partitions[JobKey]: ...


class ControllerPort(Protocol):
    """A controller host as its recovery and its membership watch use it (`ControllerHost`)."""

    @property
    def name(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def options(self) -> JobsOptions: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def provider(self) -> StorageProvider: ...

    @property
    def routes(self) -> Routes: ...

    @property
    def managers(self) -> Mapping[JobKey, JobsManager]:
        """The jobs managers of the partitions this host serves."""
        ...

    @property
    def recovery(self) -> RecoveryParts: ...

    def manager(self, key: JobKey) -> JobsManager:
        """The jobs manager of a partition, made when first asked for."""
        ...

    async def hosts_lost(self, names: Mapping[str, str | None]) -> int:
        """Worker hosts that are gone, each with the incarnation that died (None: not known):
        their steps are sent again."""
        ...

    async def nodes_draining(self, drains: dict[str, float]) -> None:
        """Ray drains these nodes: their hosts take no new work and hand theirs over."""
        ...
