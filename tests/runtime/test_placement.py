"""Which node takes which host role, from the resources the nodes declare."""

from __future__ import annotations

import pytest

from choreography_ray.jobs.errors import ConfigurationError
from choreography_ray.placement.roles import (
    CONTROLLER_RESOURCE,
    WORKER_RESOURCE,
    NodeFacts,
    NodeRoles,
    assign_roles,
    worker_share,
)


def test_without_declared_roles_every_live_node_takes_both() -> None:
    nodes = [NodeFacts("a", resources={"CPU": 2}), NodeFacts("b", alive=False), NodeFacts("c")]
    assert assign_roles(nodes) == [NodeRoles("a", True, True), NodeRoles("c", True, True)]


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


@pytest.mark.parametrize(
    ("parallel", "hosts", "share"), [(None, 3, None), (8, 1, 8), (8, 3, 3), (1, 4, 1)]
)
def test_worker_hosts_of_a_node_share_its_parallelism(parallel, hosts, share) -> None:
    assert worker_share(parallel, hosts) == share


def test_fewer_than_one_worker_host_per_node_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="workers_per_node: must be at least 1, got 0"):
        worker_share(4, 0)
