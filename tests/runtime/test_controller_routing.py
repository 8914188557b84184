"""A client's choice of controller host for a new job, over a stub of Ray's look-ups."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from choreography_ray.jobs import NoEligibleJobWorker
from choreography_ray.placement.choice import HostLoad
from choreography_ray.runtime import controller_routing
from choreography_ray.runtime.config import ClusterConfig
from choreography_ray.runtime.constants import CONTROLLER_PREFIX
from choreography_ray.runtime.controller_routing import ControllerRouting

DEAD = f"{CONTROLLER_PREFIX}dead-node"
LIVE = f"{CONTROLLER_PREFIX}live-node"


class Ray:
    """The listing of controller hosts and `get_actor`, as Ray answers them: a host that died
    stays in a listing read before its death."""

    def __init__(self, listed: list[str], alive: set[str]) -> None:
        self.listed = listed
        self.alive = alive
        self.listings = 0

    def names(self, namespace: str, prefixes: tuple[str, ...]) -> list[str]:
        self.listings += 1
        return list(self.listed)

    def get_actor(self, name: str, namespace: str) -> Any:
        if name not in self.alive:
            raise ValueError(f"Failed to look up actor {name!r}")
        return SimpleNamespace(name=name)


def _stub_ray(monkeypatch: Any) -> Ray:
    """Ray's look-ups as `Ray` answers them (the load is left to each test)."""
    stub = Ray([DEAD, LIVE], {DEAD, LIVE})
    monkeypatch.setattr(controller_routing, "actor_names", stub.names)
    monkeypatch.setattr(controller_routing, "read_adverts", lambda namespace, hosts: {})
    monkeypatch.setattr(
        controller_routing, "require_config", lambda namespace: ClusterConfig(storage="memory://x")
    )
    monkeypatch.setattr(controller_routing.ray, "get_actor", stub.get_actor)
    monkeypatch.setattr(
        controller_routing.ray,
        "get_runtime_context",
        lambda: SimpleNamespace(get_node_id=lambda: "dead-node"),
    )
    return stub


@pytest.fixture
def ray_stub(monkeypatch) -> Ray:
    stub = _stub_ray(monkeypatch)
    monkeypatch.setattr(controller_routing.LoadCache, "get", lambda self, hosts, adverts: {})
    return stub


def test_a_chosen_controller_found_gone_makes_the_client_list_the_hosts_again(ray_stub) -> None:
    """The listing the client kept predates the death of its node's controller host: the
    start must not fail while another controller host lives (fault matrix, after case 3)."""
    routing = ControllerRouting("ns")
    assert routing.controller_for("t").name == DEAD  # this node's, while it lives
    routing.forget()
    ray_stub.alive = {LIVE}
    ray_stub.listed = [LIVE]  # what a listing read now says
    routing._controllers._names = [DEAD, LIVE]  # the kept listing, read before the death
    routing._controllers._read_at = float("inf")  # still fresh by its age
    assert routing.controller_for("t").name == LIVE


def test_when_no_listed_controller_lives_the_error_names_the_one_chosen(ray_stub) -> None:
    ray_stub.alive = set()
    with pytest.raises(NoEligibleJobWorker, match="is gone"):
        ControllerRouting("ns").controller_for("t")


def test_jobs_a_client_starts_within_one_reading_of_the_load_spread_over_controllers(
    monkeypatch,
) -> None:
    """The load is read at most once a second; the jobs a client starts meanwhile count
    against the host they went to, so idle equal controllers take them in turn instead of
    all going to this node's (the chaos soak's 13 jobs on one controller)."""
    _stub_ray(monkeypatch)  # the real LoadCache, over a reading of our own
    monkeypatch.setattr(controller_routing, "draining_nodes", lambda: {})
    readings: list[int] = []

    def read(self, hosts, adverts):
        readings.append(1)
        return {name: HostLoad({}, 0) for name in hosts}

    monkeypatch.setattr(controller_routing.LoadCache, "_read", read)
    routing = ControllerRouting("ns")
    chosen = [routing.controller_for("t").name for _ in range(6)]
    assert len(readings) == 1  # one reading for all six
    assert sorted(chosen) == sorted([DEAD, LIVE] * 3)
