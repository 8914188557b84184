"""Roles from node labels and custom resources, and each worker node's own step limit: the
rules `up` and every later node placement apply, without a cluster."""

from __future__ import annotations

import logging

import pytest

from choreography_ray.placement import parallelism
from choreography_ray.placement.parallelism import PARALLELISM_LABEL, node_parallelism
from choreography_ray.placement.roles import (
    CONTROLLER_RESOURCE,
    ROLE_LABEL,
    WORKER_RESOURCE,
    NodeFacts,
    NodeRoles,
    assign_roles,
    refused_role,
)


def labelled(node_id: str, role: str | None = None, **labels: str) -> NodeFacts:
    found = {ROLE_LABEL: role} if role is not None else {}
    found.update({k.replace("_", "-"): v for k, v in labels.items()})
    return NodeFacts(node_id, labels=found)


@pytest.fixture(autouse=True)
def _fresh_log_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallelism, "_reported", set())


# -- roles ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "controller", "worker"),
    [
        ("controller", True, False),
        ("worker", False, True),
        ("both", True, True),
        ("Worker ", False, True),
    ],
)
def test_the_role_label_gives_a_node_its_roles(value, controller, worker) -> None:
    assert assign_roles([labelled("n", value), labelled("plain")]) == (
        [NodeRoles("n", controller, worker)]
    )


def test_labels_and_resources_combine_on_one_node_and_across_the_cluster() -> None:
    nodes = [
        labelled("head", "controller"),
        NodeFacts("res-worker", resources={WORKER_RESOURCE: 1}),
        NodeFacts("mixed", resources={CONTROLLER_RESOURCE: 1}, labels={ROLE_LABEL: "worker"}),
        labelled("plain"),
    ]
    assert assign_roles(nodes) == [
        NodeRoles("head", True, False),
        NodeRoles("res-worker", False, True),
        NodeRoles("mixed", True, True),
    ]


def test_while_nobody_declares_a_role_every_live_node_takes_both() -> None:
    nodes = [labelled("a", other="x"), NodeFacts("b"), labelled("dead", "worker")]
    nodes[2] = NodeFacts("dead", alive=False, labels={ROLE_LABEL: "worker"})
    assert assign_roles(nodes) == [NodeRoles("a", True, True), NodeRoles("b", True, True)]


def test_a_label_declared_under_another_key_counts_only_when_that_key_is_configured() -> None:
    nodes = [
        NodeFacts("a", labels={"tier": "controller"}),
        NodeFacts("b", labels={"tier": "worker"}),
    ]
    assert assign_roles(nodes) == [NodeRoles("a", True, True), NodeRoles("b", True, True)]
    assert assign_roles(nodes, role_label="tier") == [
        NodeRoles("a", True, False),
        NodeRoles("b", False, True),
    ]


def test_an_unreadable_role_label_takes_no_role_is_named_and_still_counts_as_declaring(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nodes = [labelled("typo", "controler"), labelled("plain")]
    with caplog.at_level(logging.WARNING, "choreography_ray.placement"):
        assert assign_roles(nodes) == []
    assert refused_role(nodes[0]) == (
        f"node typo: label {ROLE_LABEL}='controler' is not one of controller, worker, both"
    )
    assert refused_role(nodes[1]) is None
    assert "node typo" in caplog.text


# -- parallelism per node -------------------------------------------------------------------


def test_each_worker_node_reads_its_step_limit_from_its_label() -> None:
    nodes = [
        labelled("c", "controller", **{PARALLELISM_LABEL: "9"}),
        labelled("big", "worker", **{PARALLELISM_LABEL: "16"}),
        labelled("small", "worker", **{PARALLELISM_LABEL: "2"}),
        labelled("unset", "worker"),
    ]
    assert assign_roles(nodes, max_parallel_steps=4) == [
        NodeRoles("c", True, False, None),  # a controller node performs no step
        NodeRoles("big", False, True, 16),
        NodeRoles("small", False, True, 2),
        NodeRoles("unset", False, True, 4),
    ]


def test_the_parallelism_label_key_is_configurable() -> None:
    node = NodeFacts("n", labels={ROLE_LABEL: "worker", "steps": "3", PARALLELISM_LABEL: "7"})
    assert assign_roles([node], parallelism_label="steps") == [NodeRoles("n", False, True, 3)]


@pytest.mark.parametrize("value", ["", "many", "0", "-3", "1.5", " "])
def test_an_invalid_limit_falls_back_and_is_logged_once_with_node_and_value(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "choreography_ray.placement"):
        for _ in range(3):
            assert node_parallelism("n1", {PARALLELISM_LABEL: value}, fallback=5) == 5
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1
    assert "node n1" in logged[0] and repr(value) in logged[0] and PARALLELISM_LABEL in logged[0]


def test_a_missing_limit_falls_back_without_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "choreography_ray.placement"):
        assert node_parallelism("n1", {}, fallback=None) is None
        assert node_parallelism("n1", {"other": "3"}, fallback=6) == 6
    assert caplog.records == []


def test_up_refuses_a_node_whose_role_label_cannot_be_read_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from choreography_ray.jobs import ConfigurationError, JobsOptions
    from choreography_ray.runtime import placement as runtime_placement

    nodes = [labelled("good", "worker"), labelled("bad", "wrker"), labelled("gone", "x")]
    nodes[2] = NodeFacts("gone", alive=False, labels={ROLE_LABEL: "x"})
    monkeypatch.setattr(runtime_placement, "node_facts", lambda: nodes)
    with pytest.raises(ConfigurationError, match=r"node bad: label choreography\.io/role='wrker'"):
        runtime_placement.check_role_labels(JobsOptions())
    runtime_placement.check_role_labels(JobsOptions(role_label="tier"))  # another key: fine
