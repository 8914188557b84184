"""Which controller host a client calls: the one it called last while it lives; for a new job,
the job director's choice among the controller hosts that run the job's type, weighed by their
load. What it reads from Ray (the hosts' names, advertisements and load) is kept for a while,
so a client that starts many jobs does not ask per job."""

from __future__ import annotations

import time
from typing import Any

import ray

from ..jobs.errors import ConfigurationError, NoEligibleJobWorker
from ..placement.capability import HostAdvert
from ..placement.choice import HostLoad, Placement
from .adverts import read_adverts
from .config import require_config
from .constants import CONTROLLER_PREFIX, ROUTES_REFRESH_SECONDS, controller_name, host_node
from .directory import actor_names, draining_nodes


class ControllerRouting:
    """A client's way to its controller hosts."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._handle: Any = None
        self._handle_name: str | None = None
        self._adverts = AdvertCache(namespace)
        self._placement: Placement | None = None
        self._load = LoadCache(namespace)
        self._controllers = ControllerNames(namespace)

    def forget(self) -> None:
        """The host called last is gone or was replaced: look again."""
        self._handle = None
        self._controllers.forget()

    def controller(self) -> Any:
        """The controller host this client calls: the one on this node, else any."""
        if self._handle is not None:
            return self._handle
        local = controller_name(ray.get_runtime_context().get_node_id())
        try:
            self._handle = ray.get_actor(local, namespace=self.namespace)
            self._handle_name = local
            return self._handle
        except ValueError:
            pass
        for name in actor_names(self.namespace, (CONTROLLER_PREFIX,)):
            try:
                self._handle = ray.get_actor(name, namespace=self.namespace)
                self._handle_name = name
                return self._handle
            except ValueError:
                continue
        raise ConfigurationError(
            "no controller host runs in this cluster; run `choreography up` or connect()"
        )

    def controller_for(self, job_type: str) -> Any:
        """The controller host of a new job of `job_type`: among those that run the type, the
        job director's choice, else this node's, else the first. `NoEligibleJobWorker` naming
        why when none can. A chosen host found gone makes the client list the hosts again
        and choose once more: the list it kept may predate the host's death."""
        if self._placement is None:
            options = require_config(self.namespace).jobs_options()
            self._placement = Placement(options.job_director, options.step_director)
        for fresh in (False, True):
            if fresh:
                self._controllers.forget()
            names = self._controllers.get()
            local = controller_name(ray.get_runtime_context().get_node_id())
            preferred = self._handle_name if self._handle is not None else local
            adverts = self._adverts.get(names)
            load = self._load.get(names, adverts)
            staying = [n for n in names if host_node(n) not in self._load.draining] or names
            chosen = self._placement.controller(
                job_type, staying, adverts, preferred or local, load
            )
            self._load.started(chosen)
            if self._handle is not None and self._handle_name == chosen:
                return self._handle
            try:
                handle = ray.get_actor(chosen, namespace=self.namespace)
            except ValueError:
                continue
            self._handle, self._handle_name = handle, chosen
            return handle
        raise NoEligibleJobWorker(f"controller host {chosen} for job type {job_type!r} is gone")


class AdvertCache:
    """The controller hosts' advertisements, read again when hosts change or after a while:
    a client that starts many jobs does not read them per job."""

    def __init__(self, namespace: str, seconds: float = ROUTES_REFRESH_SECONDS) -> None:
        self.namespace = namespace
        self.seconds = seconds
        self._hosts: list[str] = []
        self._read_at = -float("inf")
        self._adverts: dict[str, HostAdvert] = {}

    def get(self, hosts: list[str]) -> dict[str, HostAdvert]:
        now = time.monotonic()
        if hosts != self._hosts or now - self._read_at >= self.seconds:
            self._adverts = read_adverts(self.namespace, hosts)
            self._hosts, self._read_at = hosts, now
        return self._adverts


class ControllerNames:
    """The controller hosts' names, listed again after a while or once a call found its host
    gone: listing them is a call to Ray's control store, a millisecond or more per start."""

    def __init__(self, namespace: str, seconds: float = ROUTES_REFRESH_SECONDS) -> None:
        self.namespace = namespace
        self.seconds = seconds
        self._names: list[str] = []
        self._read_at = -float("inf")

    def get(self) -> list[str]:
        now = time.monotonic()
        if not self._names or now - self._read_at >= self.seconds:
            self._names = actor_names(self.namespace, (CONTROLLER_PREFIX,))
            self._read_at = now
        return self._names

    def forget(self) -> None:
        self._names = []


class LoadCache:
    """Each controller host's live activations and its node's free resources, asked at most
    once a second: a client that starts many jobs does not ask per job."""

    def __init__(self, namespace: str, seconds: float = 1.0, timeout: float = 2.0) -> None:
        self.namespace = namespace
        self.seconds = seconds
        self.timeout = timeout
        self._read_at = -float("inf")
        self._load: dict[str, HostLoad] = {}
        self.draining: set[str] = set()
        """The nodes Ray drains, as last read: a new job goes to a controller that stays."""

    def get(self, hosts: list[str], adverts: dict[str, HostAdvert]) -> dict[str, HostLoad]:
        now = time.monotonic()
        if len(hosts) > 1 and (now - self._read_at >= self.seconds or set(hosts) - set(self._load)):
            self._load = self._read(hosts, adverts)
            self.draining = set(draining_nodes())
            self._read_at = now
        return self._load

    def started(self, host: str) -> None:
        """A job is being started on `host`: counted until the next reading, so that the jobs
        a client starts within one reading spread out rather than all go to one host."""
        load = self._load.get(host)
        if load is not None:
            self._load[host] = HostLoad(load.available, load.activations + 1)

    def _read(self, hosts: list[str], adverts: dict[str, HostAdvert]) -> dict[str, HostLoad]:
        """A host that does not answer in time counts as idle: placement is a preference."""
        from ray._private.state import available_resources_per_node

        free = available_resources_per_node()
        calls: dict[str, Any] = {}
        for name in hosts:
            try:
                calls[name] = ray.get_actor(name, namespace=self.namespace).activations.remote()
            except ValueError:
                continue
        ready, _ = ray.wait(list(calls.values()), num_returns=len(calls), timeout=self.timeout)
        counts = {}
        for name, ref in calls.items():
            if ref in ready:
                try:
                    counts[name] = int(ray.get(ref))
                except Exception:
                    continue
        return {
            name: HostLoad(
                free.get(adverts[name].node_id, {}) if name in adverts else {},
                counts.get(name, 0),
            )
            for name in hosts
        }
