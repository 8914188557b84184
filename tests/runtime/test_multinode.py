"""The multi-node test cluster itself (`choreography_ray.testing.MultiNodeCluster`): one
cluster for this module — a controller head and two worker nodes over SQLite — whose faults
are checked against what Ray and the operating system report. Whether jobs survive the faults
is for the recovery tests built on it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from choreography_ray.jobs import ConfigurationError, JobStatus
from choreography_ray.runtime.constants import NAMESPACE, controller_name, worker_name

from .conftest import ROOT
from .multinode_jobs import Held, Where, WhereJob, nodes_recorded, record_item, runs_recorded


def _address_file() -> str | None:
    """Ray's "current cluster" file, which a `ray.init()` elsewhere on this machine reads."""
    from ray._common.utils import get_ray_address_file

    path = Path(get_ray_address_file(None))
    return path.read_text() if path.exists() else None


@pytest.fixture(scope="module")
def seen() -> dict[str, object]:
    """What one test leaves for a later one (the tests share one cluster, in order)."""
    return {}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[object]:
    from choreography_ray.testing import MultiNodeCluster

    storage = f"sqlite:///{tmp_path_factory.mktemp('multinode') / 'jobs.db'}"
    with MultiNodeCluster(
        storage,
        nodes=("controller", "worker", "worker"),
        modules=["tests.runtime.multinode_jobs"],
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    ) as running:
        yield running


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _hosts() -> set[str]:
    import ray

    return {
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry["namespace"] == NAMESPACE and entry["name"].startswith("choreography:")
    }


def _expected_hosts(cluster) -> set[str]:
    return {controller_name(n.node_id) for n in cluster.nodes("controller")} | {
        worker_name(n.node_id) for n in cluster.nodes("worker")
    }


# -- without a cluster ----------------------------------------------------------------------


def test_importing_the_testing_helpers_does_not_import_ray() -> None:
    code = (
        "import sys, choreography_ray.testing as t; "
        "assert 'ray' not in sys.modules, 'ray imported'; "
        "assert t.InProcessCluster and t.FakeClock"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": ("controller", "wizard")}, "nodes: unknown role 'wizard'"),
        ({"nodes": ("worker", "worker")}, "has no controller node"),
        ({"nodes": ("controller", "none")}, "has no worker node"),
        ({"storage": "memory://x"}, "memory:// lives in a Ray actor"),
    ],
)
def test_a_layout_or_storage_the_cluster_cannot_use_is_refused_in_one_line(kwargs, message) -> None:
    from choreography_ray.testing import MultiNodeCluster

    arguments = {"storage": "sqlite:///unused.db", **kwargs}
    with pytest.raises(ConfigurationError, match=message) as raised:
        MultiNodeCluster(**arguments)
    assert "\n" not in str(raised.value)


# -- on one cluster, in order ---------------------------------------------------------------


def test_every_node_with_a_role_gets_its_host_actors(cluster) -> None:
    assert [n.role for n in cluster.nodes()] == ["controller", "worker", "worker"]
    assert len(cluster.nodes("worker")) == 2
    assert _hosts() == _expected_hosts(cluster)


def test_a_job_runs_to_completion_across_the_worker_nodes(cluster, seen, tmp_path) -> None:
    job_id = cluster.jobs.start(WhereJob, Where(directory=str(tmp_path), steps=20))
    state = cluster.jobs.wait(job_id, timeout=60)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    recorded = nodes_recorded(tmp_path)
    assert sorted(recorded) == list(range(20))
    assert set(recorded.values()) == {n.node_id for n in cluster.nodes("worker")}
    seen["completed"] = job_id


def test_kill_host_kills_exactly_that_hosts_process(cluster) -> None:
    pids = {name: cluster.host_pid(name) for name in sorted(_hosts())}
    assert len(set(pids.values())) == len(pids) == 3
    ray_processes = cluster.process_ids()
    victim = worker_name(cluster.nodes("worker")[0].node_id)

    assert cluster.kill_host(victim) == pids[victim]

    assert not _alive(pids[victim])
    others = {name: pid for name, pid in pids.items() if name != victim}
    assert all(_alive(pid) for pid in others.values())
    assert {name: cluster.host_pid(name) for name in others} == others
    assert all(_alive(pid) for pid in ray_processes)  # its node lives on


def test_no_process_outside_the_cluster_is_killed(cluster) -> None:
    outsider = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(ValueError, match="not a worker process of this cluster"):
            cluster._kill(outsider.pid)
        assert outsider.poll() is None
    finally:
        outsider.kill()
        outsider.wait(timeout=10)


def test_a_removed_node_is_declared_dead_within_the_lowered_detection_time(cluster) -> None:
    worker = cluster.nodes("worker")[-1]
    raylets = set(cluster.process_ids("raylet"))
    host = cluster.host_pid(worker_name(worker.node_id))

    assert cluster.remove_node("worker") == worker.node_id
    assert not _alive(host)  # its host actor died with it, at once
    seconds = cluster.wait_node_dead(worker.node_id, timeout=30)

    # Ray's defaults take about 15 s; the lowered settings about 1.5 s.
    print(f"node declared dead {seconds:.2f} s after its removal")
    assert seconds <= cluster.health.detection_seconds + 5
    assert worker.node_id not in {n.node_id for n in cluster.nodes()}
    gone = raylets - set(cluster.process_ids("raylet"))
    assert len(gone) == 1 and not any(_alive(pid) for pid in gone)


def test_restart_brings_the_hosts_back_over_the_same_storage(cluster, seen, tmp_path) -> None:
    before = {n.node_id for n in cluster.nodes()}
    old_processes = cluster.process_ids()

    jobs = cluster.restart()

    assert not any(_alive(pid) for pid in old_processes)
    assert [n.role for n in cluster.nodes()] == ["controller", "worker", "worker"]
    assert not before & {n.node_id for n in cluster.nodes()}
    assert _hosts() == _expected_hosts(cluster)
    assert jobs.get(seen["completed"]).status == JobStatus.COMPLETED_SUCCESSFULLY
    job_id = jobs.start(WhereJob, Where(directory=str(tmp_path), steps=4))
    assert jobs.wait(job_id, timeout=60).status == JobStatus.COMPLETED_SUCCESSFULLY


def _until(check, what: str, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


def test_a_worker_node_lost_mid_map_leaves_exact_results_and_no_completed_item_run_again(
    cluster, tmp_path
) -> None:
    """Even items complete and odd ones are held running, on both worker nodes; then the node
    running item 1 dies. Its held items run again on the other; no completed item does. 24
    items: a batch of up to 16 async steps may go to one host whole (placement.md)."""
    assert len(cluster.nodes("worker")) == 2
    count = 24
    items = [Held(directory=str(tmp_path), n=n, held=n % 2 == 1) for n in range(count)]
    mapped = cluster.jobs.map(record_item, items, name="lost node")
    _until(lambda: len(runs_recorded(tmp_path)) == count, "every item running or completed")
    _until(
        lambda: cluster.jobs.get(mapped.job_id).progress.successful_steps == count // 2,
        "the items not held completed",
    )
    before = runs_recorded(tmp_path)
    assert {node for n in range(1, count, 2) for node in before[n]} == {
        node.node_id for node in cluster.nodes("worker")
    }  # held items on both worker nodes
    lost = cluster.remove_node(before[1][0])
    (survivor,) = (node.node_id for node in cluster.nodes("worker"))
    (tmp_path / "release").write_text("")

    state = mapped.wait(timeout=60)
    assert state is not None and state.status == JobStatus.COMPLETED_SUCCESSFULLY
    results = cluster.jobs.gather(mapped.job_id)
    runs = runs_recorded(tmp_path)
    assert any(before[n] == [lost] for n in range(0, count, 2))  # it had completed items
    for n in range(0, count, 2):  # completed before the loss: one run, its result as stored
        assert runs[n] == before[n] and results[n] == before[n][0]
    for n in range(1, count, 2):  # held: completed on the survivor; run again if it was lost
        assert results[n] == survivor
        again = [survivor] if before[n] == [lost] else []
        assert sorted(runs[n]) == sorted(before[n] + again)
    assert [index for index, _ in cluster.jobs.results(mapped.job_id)] == list(range(count))


def test_shutdown_leaves_no_process_of_the_cluster(cluster) -> None:
    import ray

    address_file = _address_file()
    assert address_file != cluster.address  # no ray.init() on this machine joins this cluster
    processes = cluster.process_ids()
    processes += [cluster.host_pid(name) for name in _hosts()]
    assert len(processes) > 3

    cluster.shutdown()

    assert not ray.is_initialized()
    assert [pid for pid in processes if _alive(pid)] == []
    assert _address_file() == address_file  # nor is another one's address deleted
    cluster.shutdown()  # again: nothing left to do
