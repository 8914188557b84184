"""Host advertisements in Ray's key-value store: each host writes what it can run, hosts and
clients read them to choose where a job or a step goes.

Reading is a blocking call to Ray's control store, so a host reads off its event loop, only
when the hosts it routes to changed or `cadence` seconds passed, and keeps the last reading.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

from ..engine.clock import Clock
from ..placement.capability import CAPABILITIES, HostAdvert
from .constants import ROUTES_REFRESH_SECONDS
from .control_calls import control_store_call

log = logging.getLogger("choreography_ray.runtime")

ADVERT_PREFIX = b"choreography_ray:advert:"
WITHHELD_ENV = "CHOREOGRAPHY_WITHHELD_CAPABILITIES"
"""Comma-separated capabilities a host does not advertise: how a test (or an operator
rehearsing an upgrade) makes a host look like one of an older release."""


def advertised_capabilities() -> list[str]:
    """This release's capabilities, less the ones withheld through the environment."""
    withheld = {c.strip() for c in os.environ.get(WITHHELD_ENV, "").split(",") if c.strip()}
    return [c for c in CAPABILITIES if c not in withheld]


def _kv() -> Any:
    from ray.experimental import internal_kv

    return internal_kv


def node_of(node_id: str) -> tuple[dict[str, str], dict[str, float]]:
    """The labels and resources of node `node_id` (blocking: Ray's control store)."""
    import ray

    for node in ray.nodes():
        if node["NodeID"] == node_id:
            labels = {str(k): str(v) for k, v in (node.get("Labels") or {}).items()}
            return labels, dict(node.get("Resources") or {})
    return {}, {}


def write_advert(advert: HostAdvert, namespace: str) -> None:
    _kv()._internal_kv_put(
        ADVERT_PREFIX + advert.name.encode(),
        advert.model_dump_json().encode(),
        overwrite=True,
        namespace=namespace,
    )


def delete_advert(name: str, namespace: str) -> None:
    _kv()._internal_kv_del(ADVERT_PREFIX + name.encode(), namespace=namespace)


def read_adverts(namespace: str, hosts: list[str] | None = None) -> dict[str, HostAdvert]:
    """The advertisements of `hosts` (every stored one when None), by host name; one that
    cannot be read is left out (its host counts as not having advertised)."""
    kv = _kv()
    keys = (
        [ADVERT_PREFIX + name.encode() for name in hosts]
        if hosts is not None
        else kv._internal_kv_list(ADVERT_PREFIX, namespace=namespace)
    )
    found: dict[str, HostAdvert] = {}
    for key in keys:
        advert = parse_advert(key, kv._internal_kv_get(key, namespace=namespace))
        if advert is not None:
            found[advert.name] = advert
    return found


def parse_advert(key: bytes, raw: bytes | None) -> HostAdvert | None:
    """The advertisement stored under `key`; None when there is none or it cannot be read
    (its host counts as not having advertised)."""
    if raw is None:
        return None
    try:
        return HostAdvert.model_validate_json(raw)
    except ValueError as error:
        log.warning("host advertisement %r cannot be read: %s", key, error)
        return None


class Adverts:
    """The advertisements of the hosts a host routes to, read off the event loop.

    Every dispatch and every report asks for them, so a reading that is merely old answers at
    once, and the next is made in the background, one at a time: while Ray's control store
    restarts, a reading hangs until it is back, and the steps must not wait for it (waiting,
    a 60 s restart stopped every job for 50 s). Callers ask for different hosts (the workers,
    some of them, the controllers too): readings add to what is known, and the next one reads
    every host asked for since the last began. Only a host no reading has covered yet (one
    that joined) is waited for; one that did not advertise counts as covered."""

    def __init__(
        self,
        namespace: str,
        clock: Clock,
        cadence: float = ROUTES_REFRESH_SECONDS,
        read: Callable[[str, list[str]], dict[str, HostAdvert]] = read_adverts,
    ) -> None:
        self.namespace = namespace
        self.clock = clock
        self.cadence = cadence
        self._read = read
        self._adverts: dict[str, HostAdvert] = {}
        self._covered: set[str] = set()
        """Hosts some reading covered, whether or not they had an advertisement."""
        self._asked: set[str] = set()
        """Hosts asked for since the last reading began: what the next one reads."""
        self._read_at: float | None = None
        self._reading: asyncio.Task[None] | None = None

    async def of(self, hosts: list[str]) -> dict[str, HostAdvert]:
        """The advertisements of `hosts`: the last readings, read again in the background
        when old, and waited for only for hosts never covered."""
        self._asked.update(hosts)
        if not self._covered.issuperset(hosts):
            await self._cover(hosts)
        elif self._reading is None and self._old():
            self._start_reading()
        return {name: self._adverts[name] for name in hosts if name in self._adverts}

    def _old(self) -> bool:
        return self._read_at is None or self.clock.now().timestamp() - self._read_at >= (
            self.cadence
        )

    async def _cover(self, hosts: list[str]) -> None:
        """Wait for readings until one covered `hosts`, or the one begun for them ended
        (failed: the caller goes on with what is known)."""
        mine: asyncio.Task[None] | None = None
        while True:
            if self._reading is None:
                mine = self._start_reading()
            reading = self._reading
            assert reading is not None
            await asyncio.shield(reading)
            if reading is mine or self._covered.issuperset(hosts):
                return

    def _start_reading(self) -> asyncio.Task[None]:
        hosts, self._asked = sorted(self._asked), set()
        reading = asyncio.get_running_loop().create_task(self._reading_of(hosts))
        self._reading = reading
        return reading

    async def _reading_of(self, hosts: list[str]) -> None:
        began = self.clock.now().timestamp()
        try:
            found = await control_store_call(self._read, self.namespace, hosts)
        except Exception:
            log.exception("reading the host advertisements failed; the last reading stays")
            self._asked.update(hosts)  # read them with the next one
        else:
            for name in hosts:
                if name in found:
                    self._adverts[name] = found[name]
                else:
                    self._adverts.pop(name, None)  # it advertises no more: an older release
            self._covered.update(hosts)
            self._read_at = began
        finally:
            self._reading = None
