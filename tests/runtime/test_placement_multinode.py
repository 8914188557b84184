"""Placement on a real multi-node Ray: a controller-only head and two worker nodes that
declare their roles and step limits by node label. One cluster for the module, bounded."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import pytest

from choreography_ray.jobs import JobStatus
from choreography_ray.placement.parallelism import PARALLELISM_LABEL
from choreography_ray.runtime.constants import controller_name, worker_name

from .conftest import ROOT
from .placement_jobs import OffsideJob, Spread, SpreadJob, TwoKindsJob, records
from .placement_picky import PickyJob

LIMITS = (1, 2)
"""The step limits of the two worker nodes' labels."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[object]:
    from choreography_ray.jobs import JobsOptions
    from choreography_ray.testing import MultiNodeCluster, NodeSpec

    storage = f"sqlite:///{tmp_path_factory.mktemp('placement') / 'jobs.db'}"
    nodes = [
        NodeSpec("controller", by_label=True),
        *(
            NodeSpec("worker", labels={PARALLELISM_LABEL: str(limit), **more}, by_label=True)
            for limit, more in zip(
                LIMITS,
                ({"spot": "false"}, {"spot": "true", "placement-tests/no-picky": "true"}),
                strict=True,
            )
        ),
    ]
    with MultiNodeCluster(
        storage,
        nodes=nodes,
        modules=["tests.runtime.placement_jobs", "tests.runtime.placement_picky"],
        options=JobsOptions(
            max_parallel_steps=8,  # what a node without the label runs
            step_director="tests.runtime.placement_jobs:SteadyForOffside",
        ),
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    ) as running:
        yield running


def test_hosts_follow_the_role_labels_and_workers_take_their_node_limit(cluster) -> None:
    import ray

    controller, *workers = cluster.nodes()
    assert set(cluster.host_names()) == {controller_name(controller.node_id)} | {
        worker_name(node.node_id) for node in workers
    }
    for node, limit in zip(workers, LIMITS, strict=True):
        host = ray.get_actor(worker_name(node.node_id), namespace=cluster.namespace)
        stats = ray.get(host.stats.remote(), timeout=30)
        assert stats["max_parallel_steps"] == limit


def test_steps_run_only_on_worker_nodes_within_each_node_limit(cluster, tmp_path) -> None:
    controller, *workers = cluster.nodes()
    job_id = cluster.jobs.start(SpreadJob, Spread(directory=str(tmp_path), steps=12))

    state = cluster.jobs.wait(job_id, timeout=90)

    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.owner is not None and state.owner.host == controller_name(controller.node_id)
    ran = records(tmp_path)
    assert sorted(ran) == list(range(12))
    peaks: dict[str, int] = defaultdict(int)
    for record in ran.values():
        peaks[str(record["node"])] = max(peaks[str(record["node"])], int(record["running"]))
    limits = {node.node_id: limit for node, limit in zip(workers, LIMITS, strict=True)}
    assert set(peaks) == set(limits)  # both worker nodes, never the controller node
    for node_id, peak in peaks.items():
        assert peak <= limits[node_id]


def test_a_job_whose_module_fails_on_one_worker_node_runs_only_on_the_other(
    cluster, tmp_path
) -> None:
    _, able, unable = cluster.nodes()
    failures = cluster.jobs.import_failures()
    assert failures == [
        f"node {unable.node_id} ({worker_name(unable.node_id)}): module "
        "tests.runtime.placement_picky: ModuleNotFoundError: No module named 'picky_dependency'"
    ]
    assert cluster.jobs.import_failures(PickyJob.name) == failures
    assert cluster.jobs.import_failures(SpreadJob.name) == []

    job_id = cluster.jobs.start(PickyJob, Spread(directory=str(tmp_path), steps=6, hold=0.05))

    assert cluster.jobs.wait(job_id, timeout=90).status == JobStatus.COMPLETED_SUCCESSFULLY
    assert {record["node"] for record in records(tmp_path).values()} == {able.node_id}


def test_a_step_director_keeps_one_job_type_off_a_node(cluster, tmp_path) -> None:
    _, steady, spot = cluster.nodes()
    offside, anywhere = tmp_path / "offside", tmp_path / "anywhere"
    offside.mkdir()
    anywhere.mkdir()
    kept = cluster.jobs.start(OffsideJob, Spread(directory=str(offside), steps=6, hold=0.05))
    free = cluster.jobs.start(SpreadJob, Spread(directory=str(anywhere), steps=6, hold=0.05))

    for job_id in (kept, free):
        assert cluster.jobs.wait(job_id, timeout=90).status == JobStatus.COMPLETED_SUCCESSFULLY
    assert {r["node"] for r in records(offside).values()} == {steady.node_id}
    # The other job may run on the spot node, and does: the steady one is busy with the first.
    assert spot.node_id in {r["node"] for r in records(anywhere).values()}


def test_each_step_runs_only_where_its_own_step_type_imported(cluster, tmp_path) -> None:
    """A job with steps of two types: the node that cannot import the picky step type's
    module runs only the job's other steps."""
    _, able, unable = cluster.nodes()
    job_id = cluster.jobs.start(TwoKindsJob, Spread(directory=str(tmp_path), steps=6, hold=0.05))

    assert cluster.jobs.wait(job_id, timeout=90).status == JobStatus.COMPLETED_SUCCESSFULLY
    ran = records(tmp_path)
    assert sorted(ran) == [*range(6), *range(100, 106)]
    assert {ran[n]["node"] for n in range(100, 106)} == {able.node_id}  # the picky steps
    assert unable.node_id in {ran[n]["node"] for n in range(6)}


def test_a_new_job_goes_mostly_to_the_idle_worker_node(cluster, tmp_path) -> None:
    """Steps spread by load: with the steady node busy with a long job's steps (kept there by
    the director), a new job's steps go to the idle spot node."""
    _, steady, spot = cluster.nodes()
    busy, fresh = tmp_path / "busy", tmp_path / "fresh"
    busy.mkdir()
    fresh.mkdir()
    long = cluster.jobs.start(OffsideJob, Spread(directory=str(busy), steps=4, hold=1.5))
    new = cluster.jobs.start(SpreadJob, Spread(directory=str(fresh), steps=8, hold=0.05))

    for job_id in (new, long):
        assert cluster.jobs.wait(job_id, timeout=90).status == JobStatus.COMPLETED_SUCCESSFULLY
    assert {r["node"] for r in records(busy).values()} == {steady.node_id}
    nodes = [r["node"] for r in records(fresh).values()]
    assert len(nodes) == 8 and nodes.count(spot.node_id) >= 7, nodes
