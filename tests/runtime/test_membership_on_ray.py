"""The membership watch on a real multi-node Ray (one cluster for the module, in order: a
controller head and one worker node over SQLite, Ray's health checks lowered): a node that
joins gets its host actors with no `up`, a killed host actor is noticed by the watch and started
again on its node, and `down` marks the cluster so that nothing is started behind it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from choreography_ray.jobs import JobsOptions, JobStatus
from choreography_ray.runtime.constants import NAMESPACE, controller_name, worker_name
from choreography_ray.testing.waiting import eventually

from .conftest import ROOT
from .multinode_jobs import Where, WhereJob, nodes_recorded

WAIT_SECONDS = 90.0
"""Bound of every wait here: starting a node and its host process takes seconds on 2 cores."""


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    return {}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Any]:
    from choreography_ray.testing import MultiNodeCluster

    storage = f"sqlite:///{tmp_path_factory.mktemp('membership') / 'jobs.db'}"
    with MultiNodeCluster(
        storage,
        nodes=("controller", "worker"),
        modules=["tests.runtime.multinode_jobs"],
        options=JobsOptions(membership_interval="500ms"),
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    ) as running:
        yield running


def _eventually(check: Callable[[], Any], what: str, within: float = WAIT_SECONDS) -> Any:
    return eventually(check, what, within)


def _controller_stats(cluster: Any) -> dict[str, Any]:
    import ray

    head = cluster.nodes("controller")[0].node_id
    handle = ray.get_actor(controller_name(head), namespace=NAMESPACE)
    stats: dict[str, Any] = ray.get(handle.stats.remote(), timeout=30)
    return stats


def test_a_joined_worker_node_gets_a_worker_host_without_up(cluster, seen, tmp_path) -> None:
    node_id = cluster.add_node("worker").node_id
    name = worker_name(node_id)

    _eventually(lambda: name in cluster.host_names(), f"{name} created")
    _eventually(
        lambda: node_id in _controller_stats(cluster)["membership_started"], f"{name} ready"
    )
    seen["joined"] = node_id

    job_id = cluster.jobs.start(WhereJob, Where(directory=str(tmp_path), steps=20))
    assert cluster.jobs.wait(job_id, timeout=60).status == JobStatus.COMPLETED_SUCCESSFULLY
    assert node_id in set(nodes_recorded(tmp_path).values())  # steps ran on the new node


def test_a_killed_worker_host_is_noticed_by_the_membership_watch(cluster, seen) -> None:
    name = worker_name(seen["joined"])
    cluster.kill_host(name)
    killed = time.monotonic()

    _eventually(
        lambda: name in _controller_stats(cluster)["membership_lost"],
        f"the watch reported {name} lost",
        within=3 * 0.5 + 10,
    )
    print(f"{name} reported lost {time.monotonic() - killed:.2f} s after its process died")
    _eventually(  # the elected host recovers (its pass begins once the loss is told)
        lambda: _controller_stats(cluster)["membership_passes"] >= 1,
        "a recovery pass after the loss",
        within=10,
    )
    _eventually(
        lambda: _controller_stats(cluster)["membership_started"].count(seen["joined"]) == 2,
        f"{name} started again on its node",
    )
    print(f"{name} started again {time.monotonic() - killed:.2f} s after its process died")


def test_down_marks_the_cluster_and_up_clears_the_mark(cluster) -> None:
    """`down` marks the namespace before it stops the hosts, so no membership watch starts a
    stopped host again behind it; `up` (starting the hosts) clears the mark."""
    from choreography_ray.runtime import stop_hosts
    from choreography_ray.runtime.config import taking_down

    stopped = stop_hosts(NAMESPACE)
    assert taking_down(NAMESPACE)
    assert {name for name in stopped if name.startswith("choreography:")} >= {
        controller_name(cluster.nodes("controller")[0].node_id)
    }
    assert cluster.host_names() == []
    assert len(cluster.start_hosts()) == 3
    assert not taking_down(NAMESPACE)
