"""A cluster with no worker node yet, as an autoscaling one starts: a job started meanwhile
waits, visibly and durably, and starts its steps once a worker node has joined. One bounded
multi-node cluster for the module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from choreography_ray.jobs import JobStatus

from .conftest import ROOT
from .placement_jobs import Spread, SpreadJob, records


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[object]:
    from choreography_ray.jobs import JobsOptions
    from choreography_ray.testing import MultiNodeCluster, NodeSpec

    storage = f"sqlite:///{tmp_path_factory.mktemp('waiting') / 'jobs.db'}"
    with MultiNodeCluster(
        storage,
        nodes=[NodeSpec("controller", by_label=True)],
        allow_no_worker=True,
        modules=["tests.runtime.placement_jobs"],
        options=JobsOptions(
            worker_wait_timeout="10m",
            job_watchdog_interval="1s",
        ),
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    ) as running:
        yield running


def test_a_job_waits_for_a_worker_node_and_starts_when_one_joins(cluster, tmp_path) -> None:
    from choreography_ray.placement.roles import NodeRoles
    from choreography_ray.runtime.connection import roles_of_node
    from choreography_ray.testing import NodeSpec

    job_id = cluster.jobs.start(SpreadJob, Spread(directory=str(tmp_path), steps=3, hold=0.05))
    waiting = cluster.jobs.get(job_id)
    assert waiting.status == JobStatus.RUNNING
    assert waiting.waiting_for_worker is not None
    assert "no worker host" in waiting.waiting_for_worker.reason
    assert waiting.progress.failed_steps == 0

    worker = cluster.add_node(NodeSpec("worker", by_label=True))
    assert roles_of_node(cluster.namespace, worker.node_id) == NodeRoles(
        worker.node_id, False, True
    )
    cluster.start_hosts()

    state = cluster.jobs.wait(job_id, timeout=60)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.waiting_for_worker is None
    assert {r["node"] for r in records(tmp_path).values()} == {worker.node_id}


def test_with_two_controllers_a_new_job_goes_to_one_that_runs_it(cluster, tmp_path) -> None:
    """Default placement asks both controller hosts for their load and places by headroom."""
    from choreography_ray.runtime.constants import controller_name
    from choreography_ray.testing import NodeSpec

    second = cluster.add_node(NodeSpec("controller", by_label=True))
    cluster.start_hosts()
    controllers = {controller_name(n.node_id) for n in cluster.nodes("controller")}
    assert controller_name(second.node_id) in controllers and len(controllers) == 2

    job_id = cluster.jobs.start(SpreadJob, Spread(directory=str(tmp_path), steps=2, hold=0.01))

    state = cluster.jobs.wait(job_id, timeout=60)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.owner is not None and state.owner.host in controllers


def test_a_host_started_with_a_capability_withheld_turns_plan_storage_off(cluster) -> None:
    """Plans stay inline while it runs (SQLite stores none apart anyway: the engine's tests
    show the plans; this one that hosts advertise what the engine asks)."""
    from choreography_ray.placement.capability import PLAN_STORAGE, WORK_MOVES, hosts_of_type_have
    from choreography_ray.runtime.adverts import WITHHELD_ENV, read_adverts
    from choreography_ray.testing import NodeSpec

    hosts = cluster.host_names()
    assert hosts_of_type_have(hosts, read_adverts(cluster.namespace), SpreadJob.name, PLAN_STORAGE)

    older = cluster.add_node(
        NodeSpec("worker", by_label=True, env_vars={WITHHELD_ENV: PLAN_STORAGE})
    )
    cluster.start_hosts()

    adverts = read_adverts(cluster.namespace)
    withheld = [a for a in adverts.values() if PLAN_STORAGE not in a.capabilities]
    assert [a.node_id for a in withheld] == [older.node_id]
    assert WORK_MOVES in withheld[0].capabilities  # only the withheld one is missing
    hosts = cluster.host_names()
    assert not hosts_of_type_have(hosts, adverts, SpreadJob.name, PLAN_STORAGE)
