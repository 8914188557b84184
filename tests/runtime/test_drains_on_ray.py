"""Ray's node drains on a real multi-node Ray, sent as operators and autoscalers send them
(`ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds N`):

- a busy worker node drained: no new step lands there once the drain is seen, its queued runs
  move to the other worker node, the job completes with exact counts, nothing completed runs
  again, and no step runs twice;
- the owning controller's node drained: the job is handed to the other controller (ownership
  moves by compare-and-set) well before the deadline, and completes, nothing run twice.

Each node is removed after its deadline, as the autoscaler would, and one of its role added
back. The head declares no role, so every job is owned by a node that can go. Every wait is
bounded.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from choreography_ray.jobs import JobsOptions, JobStatus, JobStepStatus
from choreography_ray.runtime.constants import host_node
from choreography_ray.testing.cluster_nodes import drain_node
from choreography_ray.testing.side_effects import MODULE, Effects, RecordRuns, SideEffects
from choreography_ray.testing.waiting import eventually, read_job

DEADLINE = 20
OPTIONS = JobsOptions(
    max_parallel_steps=8,
    membership_interval="500ms",
    step_stop_timeout="5s",
    job_watchdog_interval="5s",
)
WAIT = 180.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Any]:
    from choreography_ray.testing import MultiNodeCluster

    url = f"sqlite:///{tmp_path_factory.mktemp('drains') / 'jobs.db'}"
    with MultiNodeCluster(
        url,
        nodes=("none", "controller", "controller", "worker", "worker"),
        modules=[MODULE],
        options=OPTIONS,
    ) as running:
        running.url = url
        yield running


def _start(cluster: Any, tmp_path: Path, steps: int, seconds: float) -> tuple[str, SideEffects]:
    table = SideEffects(tmp_path / "effects.db")
    job_id = cluster.jobs.start(
        RecordRuns, Effects(table=str(table.path), steps=steps, step_seconds=seconds)
    )
    return job_id, table


def _stored(url: str, job_id: str) -> set[str]:
    _, steps = read_job(url, job_id)
    return {s.id for s in steps if s.status == JobStepStatus.COMPLETED_SUCCESSFULLY}


def _until(url: str, job_id: str, count: int) -> set[str]:
    def far() -> set[str] | None:
        done = _stored(url, job_id)
        return done if len(done) >= count else None

    return eventually(far, f"{count} steps stored", WAIT)


def _finished(url: str, job_id: str, steps: int) -> Any:
    def finished() -> Any:
        found = read_job(url, job_id)[0]
        return found if found is not None and found.status.is_terminal else None

    job = eventually(finished, "the job finished", WAIT)
    assert job.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert job.progress.successful_steps == steps  # none lost, none counted twice
    return job


def _drain_seen(cluster: Any, node: str) -> float:
    """When every controller host had taken the node's worker hosts out of dispatch and moved
    their queued runs (each says so in its stats): no run may begin there after that."""
    import ray

    controllers = [n for n in cluster.host_names() if n.startswith("choreography:controller:")]

    def every_one() -> bool:
        for name in controllers:
            stats = ray.get(
                ray.get_actor(name, namespace=cluster.namespace).stats.remote(), timeout=30
            )
            if not any(host_node(w) == node for w in stats["drained_workers"]):
                return False
        return True

    eventually(every_one, "every controller host saw the drain", 60)
    return time.time()


def test_a_busy_worker_node_drained_gets_no_new_step_and_loses_nothing(cluster, tmp_path):
    steps = 800
    job_id, table = _start(cluster, tmp_path, steps, 0.05)
    stored = _until(cluster.url, job_id, int(0.3 * steps))
    node = cluster.nodes("worker")[-1].node_id
    sent = drain_node(cluster.address, node, deadline=DEADLINE)
    seen = _drain_seen(cluster, node)
    print(f"\nthe drain seen by every controller host {seen - sent:.2f} s after it was sent")
    _finished(cluster.url, job_id, steps)
    runs = table.runs()
    late = [run for run in runs if run.node == node and run.at > seen]
    twice = sorted({run.step_id for run in runs if sum(r.step_id == run.step_id for r in runs) > 1})
    again = {run.step_id for run in runs if run.at > sent} & stored
    print(
        f"\nworker node drained: {len(late)} run(s) began there after the drain was seen; "
        f"{len(twice)} step(s) ran twice; {len(again)} stored success(es) ran again"
    )
    assert late == [], "a step landed on the draining node"
    assert again == set(), "a step whose success was stored ran again"
    assert twice == [], "a step ran twice"
    time.sleep(max(0.0, sent + DEADLINE - time.time()))  # the node goes at its deadline
    cluster.remove_node(node)
    cluster.add_node("worker")  # the layout again, for the next case


def test_the_owning_controllers_node_drained_hands_its_job_over(cluster, tmp_path):
    steps = 600
    job_id, table = _start(cluster, tmp_path, steps, 0.05)
    _until(cluster.url, job_id, int(0.3 * steps))
    job, _ = read_job(cluster.url, job_id)
    owner = job.owner.host
    node = host_node(owner)
    sent = drain_node(cluster.address, node, deadline=DEADLINE)
    moved = eventually(
        lambda: (
            (found := read_job(cluster.url, job_id)[0]).owner is not None
            and found.owner.host != owner
            and found
        ),
        "the job's ownership moved to another controller",
        DEADLINE,
    )
    handed = time.time() - sent
    _finished(cluster.url, job_id, steps)
    runs = table.by_step()
    twice = sorted(step for step, found in runs.items() if len(found) > 1)
    print(
        f"\nowning controller drained: job handed to {moved.owner.host} {handed:.1f} s after "
        f"the drain; {len(twice)} step(s) ran twice"
    )
    assert handed < DEADLINE
    assert twice == []
    time.sleep(max(0.0, sent + DEADLINE - time.time()))
    cluster.remove_node(node)
    cluster.add_node("controller")


_SECOND_DRIVER = """
import sys
import choreography_ray as cr
from choreography_ray.testing.side_effects import MODULE, Effects, RecordRuns

jobs = cr.connect(sys.argv[2], address=sys.argv[1], modules=[MODULE])
for n in range(int(sys.argv[4])):
    print(jobs.start(RecordRuns, Effects(table=sys.argv[3], steps=4, step_seconds=1.0)))
"""


def test_jobs_started_together_from_two_drivers_are_owned_by_more_than_one_controller(
    cluster, tmp_path
):
    """The chaos soak saw 13 jobs, from two drivers, all owned by one controller: the
    client now counts the jobs it starts against the controller it chose until its next
    reading of their load."""
    table = SideEffects(tmp_path / "effects.db")
    other = subprocess.Popen(
        [sys.executable, "-c", _SECOND_DRIVER, cluster.address, cluster.url, str(table.path), "4"],
        stdout=subprocess.PIPE,
        text=True,
    )
    mine = [
        cluster.jobs.start(RecordRuns, Effects(table=str(table.path), steps=4, step_seconds=1.0))
        for _ in range(4)
    ]
    out, _ = other.communicate(timeout=120)
    assert other.returncode == 0
    theirs = out.split()
    owners = {job_id: read_job(cluster.url, job_id)[0].owner.host for job_id in [*mine, *theirs]}
    per_driver = [sorted(Counter(owners[j][-6:] for j in ids).values()) for ids in (mine, theirs)]
    print(f"\n8 jobs from two drivers: jobs per controller, per driver: {per_driver}")
    assert len(set(owners.values())) >= 2
    for job_id in [*mine, *theirs]:
        _finished(cluster.url, job_id, 4)
