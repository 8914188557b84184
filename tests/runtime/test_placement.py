"""Which node takes which host role, from the resources the nodes declare."""

from __future__ import annotations

import pytest

from choreography_ray.jobs.errors import ConfigurationError
from choreography_ray.placement.parallelism import PARALLELISM_LABEL as PARALLEL
from choreography_ray.placement.roles import (
    CONTROLLER_RESOURCE,
    WORKER_RESOURCE,
    NodeFacts,
    NodeRoles,
    assign_roles,
)


def test_without_declared_roles_every_live_node_takes_both() -> None:
    nodes = [NodeFacts("a", resources={"CPU": 2}), NodeFacts("b", alive=False), NodeFacts("c")]
    assert assign_roles(nodes) == [
        NodeRoles("a", True, True, worker_hosts=2),  # one worker host per CPU
        NodeRoles("c", True, True),
    ]


def test_once_a_node_declares_a_role_only_declared_roles_are_taken() -> None:
    nodes = [
        NodeFacts("head", resources={CONTROLLER_RESOURCE: 1}),
        NodeFacts("w1", resources={WORKER_RESOURCE: 1}),
        NodeFacts("both", resources={CONTROLLER_RESOURCE: 1, WORKER_RESOURCE: 1}),
        NodeFacts("plain", resources={"CPU": 8}),
        NodeFacts("dead", alive=False, resources={WORKER_RESOURCE: 1}),
    ]
    assert assign_roles(nodes) == [
        NodeRoles("head", True, False),
        NodeRoles("w1", False, True),
        NodeRoles("both", True, True),
    ]


def test_a_dead_node_that_declares_a_role_does_not_take_roles_from_the_live_ones() -> None:
    nodes = [NodeFacts("a"), NodeFacts("dead", alive=False, resources={WORKER_RESOURCE: 1})]
    assert assign_roles(nodes) == [NodeRoles("a", True, True)]


def test_each_worker_node_runs_worker_hosts_by_its_own_cpus() -> None:
    nodes = [
        NodeFacts("head", resources={CONTROLLER_RESOURCE: 1, "CPU": 4}),
        NodeFacts("small", resources={WORKER_RESOURCE: 1, "CPU": 2}),
        NodeFacts("big", resources={WORKER_RESOURCE: 1, "CPU": 96}),
        NodeFacts("bare", resources={WORKER_RESOURCE: 1}),
        NodeFacts("limited", resources={WORKER_RESOURCE: 1, "CPU": 8}, labels={PARALLEL: "3"}),
    ]
    assert [(r.node_id, r.worker_hosts) for r in assign_roles(nodes)] == [
        ("head", 1),  # no worker role: no worker host counts
        ("small", 2),
        ("big", 8),  # at most the cap
        ("bare", 1),
        ("limited", 3),  # no more than its step limit
    ]


def test_an_explicit_workers_per_node_wins_on_every_node() -> None:
    nodes = [
        NodeFacts("small", resources={"CPU": 2}),
        NodeFacts("big", resources={"CPU": 16}, labels={PARALLEL: "2"}),
    ]
    roles = assign_roles(nodes, workers_per_node=3)
    assert [(r.node_id, r.worker_hosts) for r in roles] == [("small", 3), ("big", 3)]
    roles = assign_roles(nodes, workers_per_node=1)
    assert [r.worker_hosts for r in roles] == [1, 1]


def test_fewer_than_one_worker_host_per_node_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="workers_per_node: must be at least 1, got 0"):
        assign_roles([NodeFacts("a")], workers_per_node=0)
