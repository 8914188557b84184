"""`ray-cluster.yaml` on Ray's own autoscaler: its node types (resources and labels) on the
fake multi-node provider, a job started while no worker node exists, and the autoscaler
launching worker nodes because the job system asks for them, the steps running there only,
the job completing with exact counts, and the nodes scaling down once idle (the idle timeout
lowered to 15 s). The driver joins the head as a Ray user's driver does; every wait is bounded
and every process of the cluster is killed afterwards (never `ray stop`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from choreography_ray.jobs import JobsOptions, JobStatus, JobStepStatus
from choreography_ray.testing.autoscaling import FakeAutoscalingCluster
from choreography_ray.testing.side_effects import MODULE, Effects, RecordRuns, SideEffects
from choreography_ray.testing.waiting import eventually, read_job

ROOT = Path(__file__).resolve().parents[2]
MAX_WORKERS = 2
STEPS = 300


@pytest.fixture(scope="module")
def cluster() -> Iterator[FakeAutoscalingCluster]:
    import ray

    fake = FakeAutoscalingCluster.from_cluster_yaml(
        ROOT / "ray-cluster.yaml", cpus=1, max_workers=MAX_WORKERS
    )
    with fake:
        ray.init(address=fake.address, logging_level="WARNING", log_to_driver=False)
        try:
            yield fake
        finally:
            ray.shutdown()


def test_a_job_started_with_no_worker_node_makes_the_autoscaler_add_them(cluster, tmp_path):
    import ray

    import choreography_ray as cr

    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    options = JobsOptions(
        membership_interval="500ms",
        autoscale_max_worker_nodes=MAX_WORKERS,
        worker_idle_timeout="3s",
    )
    jobs = cr.connect(url, address=cluster.address, options=options, modules=[MODULE])
    head = ray.get_runtime_context().get_node_id()
    assert cluster.worker_nodes() == []
    table = SideEffects(tmp_path / "effects.db")
    began = time.time()
    job_id = jobs.start(RecordRuns, Effects(table=str(table.path), steps=STEPS, step_seconds=0.05))
    waiting, _ = read_job(url, job_id)
    assert waiting.waiting_for_worker is not None  # no worker node yet: it waits, visibly

    first = eventually(cluster.worker_nodes, "a worker node launched by the autoscaler", 120)
    node_up = time.time()
    host = f"choreography:worker:{first[0]['NodeID']}"

    def ready_at() -> float | None:
        try:
            handle = ray.get_actor(host, namespace="choreography")
            return ray.get(handle.stats.remote(), timeout=10)["ready_at"]
        except ValueError:
            return None  # the membership watch has not started it yet
        except ray.exceptions.GetTimeoutError:
            return None  # named, still starting on a loaded machine: asked again, within 60 s

    host_ready = eventually(ready_at, "the joined node's worker host started", 60)
    done = eventually(
        lambda: (job := read_job(url, job_id)[0]) is not None and job.status.is_terminal and job,
        "the job finished",
        180,
    )
    job, records = read_job(url, job_id)
    runs = table.runs()
    nodes = {run.node for run in runs}
    workers = {node["NodeID"] for node in cluster.worker_nodes()} | {first[0]["NodeID"]}
    first_step = min(run.at for run in runs)
    print(
        f"\nstart -> first worker node alive {node_up - began:.1f} s; worker host ready -> "
        f"first step {first_step - host_ready:.2f} s; start -> done "
        f"{max(run.at for run in runs) - began:.1f} s; nodes that ran steps: {len(nodes)}"
    )
    assert done.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert job.progress.successful_steps == STEPS  # none lost, none counted twice
    assert {r.status for r in records} == {JobStepStatus.COMPLETED_SUCCESSFULLY}
    assert head not in nodes, "a step ran on the head, which declares no worker role"
    assert nodes <= workers | nodes - {head}
    assert first_step - host_ready < 2.0, "the joined host waited for work"

    # Nothing outstanding: the request is withdrawn and the idle nodes go.
    gone = eventually(lambda: not cluster.worker_nodes(), "the idle worker nodes removed", 180)
    assert gone
    jobs_left = [
        name
        for name in cr.runtime.directory.actor_names("choreography")
        if name.startswith("choreography:worker:")
    ]
    print(f"after scale-down, worker hosts Ray still lists: {jobs_left}")
