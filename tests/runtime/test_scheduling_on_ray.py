"""Scheduling controls on a real multi-node Ray cluster: two controller hosts and two worker
nodes that perform one step at a time each (one cluster for the module; the last test removes
the second controller's node)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from choreography_ray.jobs import JobKey, JobsOptions, JobStatus, default_registry

from .conftest import ROOT
from .scheduling_jobs import (
    CAPACITY,
    GATE,
    GATE_NAMESPACE,
    RATE,
    SERVICE,
    CallsJob,
    Gate,
    Keyed,
    KeyedCallsJob,
    KeyedJob,
    Numbered,
    RatedJob,
    Request,
    Tenant,
    ThrottlingService,
    Timed,
    TimedJob,
    began,
    performed,
    starts,
)

AGING = 600.0
"""Points a minute: 10 a second, so the low job's wait behind priority 10 is about a second."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[object]:
    from choreography_ray.testing import MultiNodeCluster

    storage = f"sqlite:///{tmp_path_factory.mktemp('scheduling') / 'jobs.db'}"
    options = JobsOptions(
        max_parallel_steps=1,
        priority_aging=AGING,
        concurrency_poll_interval=timedelta(milliseconds=250),
        job_ownership_lease=timedelta(seconds=5),
        reconciliation_interval=timedelta(seconds=2),
    )
    with MultiNodeCluster(
        storage,
        nodes=("controller", "controller", "worker", "worker"),
        modules=["tests.runtime.scheduling_jobs"],
        options=options,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    ) as running:
        yield running


def test_the_higher_priority_finishes_first_and_the_lower_still_progresses(cluster, tmp_path):
    """A low job starts first and queues all its steps on the one worker slot; a job of
    priority 10 follows. The high job's steps go first, yet the low job's wait ages it past
    10 points about every second, so some of its steps run while the high job has steps
    queued: it is not starved."""
    jobs = cluster.jobs
    low = jobs.start(TimedJob, Timed(directory=str(tmp_path), tag="low", steps=30))
    high = jobs.start(TimedJob, Timed(directory=str(tmp_path), tag="high", steps=60), priority=10)
    assert jobs.wait(high, timeout=120).status == JobStatus.COMPLETED_SUCCESSFULLY
    assert jobs.wait(low, timeout=120).status == JobStatus.COMPLETED_SUCCESSFULLY
    order = starts(tmp_path)
    last_high = len(order) - 1 - order[::-1].index("high")
    low_during_high = order[order.index("high") : last_high].count("low")
    assert order.count("low") - order[: last_high + 1].count("low") > 0  # high ended first
    assert low_during_high >= 1  # aged past the high job's priority while it ran
    assert low_during_high < order.count("low") / 2  # but the high job went first
    assert jobs.get(high).priority == 10 and jobs.get(low).priority == 0


def test_a_rate_limit_holds_within_ten_percent_over_thirty_seconds_on_two_worker_hosts(
    cluster, tmp_path
):
    """A step type limited to 10 runs a second, 310 runs on two worker hosts: after the
    burst of 10, the rest begin at the rate the two hosts share, neither faster nor (beyond
    10 %) slower, and each host ran some."""
    jobs = cluster.jobs
    steps = int(RATE * 30 + RATE)
    job_id = jobs.start(RatedJob, Numbered(directory=str(tmp_path), steps=steps))
    assert jobs.wait(job_id, timeout=120).status == JobStatus.COMPLETED_SUCCESSFULLY
    runs = began(tmp_path)
    assert len(runs) == steps
    after_burst = runs[int(RATE) :]
    seconds = after_burst[-1][0] - runs[0][0]
    rate = (len(after_burst)) / seconds
    assert abs(rate - RATE) <= 0.1 * RATE, f"{rate:.2f} runs/s over {seconds:.1f} s"
    # No window of a second holds more than the bucket's size and one second's rate.
    times = [when for when, _ in runs]
    assert all(
        sum(1 for t in times[i:] if t < start + 1.0) <= 2 * RATE + 1
        for i, start in enumerate(times)
    )
    assert len({node for _, node in runs}) == 2


def test_an_adaptive_window_settles_at_what_a_throttling_service_takes(cluster):
    """A service that takes one call at once, two worker hosts that could make two: the job's
    window falls from 32 to about what the service takes, and every call ends answered."""
    import ray

    service = (
        ray.remote(ThrottlingService)
        .options(name=SERVICE, namespace=GATE_NAMESPACE, num_cpus=0)
        .remote()
    )
    try:
        jobs = cluster.jobs
        job_id = jobs.start(CallsJob, Request(steps=60))
        state = jobs.wait(job_id, timeout=120)
        assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
        assert state.progress.successful_steps == 60
        window = state.adaptive_window
        assert window is not None and window.limit == 32
        assert window.window <= 2 * CAPACITY + 1
        # The window learns only from the outcomes reported to it: one counted from storage
        # instead (its report lost) is not in it. On a loaded machine it was seen 44 of 45.
        assert 0 < window.throttled <= ray.get(service.throttled_calls.remote())
    finally:
        ray.kill(service)


ATTEMPTS = 3
"""Jobs the step-level key test may run until the key's runs span both worker hosts."""


def test_a_step_level_key_holds_across_two_worker_hosts(cluster, tmp_path):
    """Four steps of one key limited to one at a time, two of another key, on two worker
    hosts of one slot each: the key's runs never overlap although both hosts run some, and
    a run waiting for its key leaves its host's slot to the other key.

    Which host runs which step is the dispatcher's choice, and now and then (once in three
    runs of the suite, 2026-12-04) all four of the key's runs land on one host, which proves
    nothing across hosts: such a job is run again, up to `ATTEMPTS` jobs in all, each checked
    the same way."""
    jobs = cluster.jobs
    nodes: set[str] = set()
    for attempt in range(ATTEMPTS):
        directory = tmp_path / f"job-{attempt}"
        directory.mkdir()
        job_id = jobs.start(KeyedCallsJob, Keyed(directory=str(directory)))
        assert jobs.wait(job_id, timeout=120).status == JobStatus.COMPLETED_SUCCESSFULLY
        acme = performed(directory, "acme")
        assert len(acme) == 4 and len(performed(directory, "globex")) == 2
        assert all(first[1] <= then[0] for first, then in itertools.pairwise(acme))  # one at a time
        nodes = {node for *_, node in acme}
        if len(nodes) == 2:
            break
    assert len(nodes) == 2, f"the key's runs were on one host in each of {ATTEMPTS} jobs"


def _start_on(controller: str, request: Tenant, job_id: str) -> None:
    """Start a job on one controller host by name (the client would choose its own)."""
    import ray

    from choreography_ray.runtime.operations import Start

    payload = default_registry.dump_request(request)
    operation = Start(JobKey(), KeyedJob.name, payload, job_id)
    handle = ray.get_actor(controller, namespace="choreography")
    assert ray.get(handle.perform.remote(operation), timeout=60).succeeded


def _until(check, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not within the bound"
        time.sleep(0.1)


def test_a_key_at_its_limit_holds_across_two_controllers_and_after_one_is_lost(cluster, tmp_path):
    """Jobs of one key on two controller hosts: two run, the third waits, although its host
    runs only one of them (the count comes from storage). The second controller's node is
    removed: its job still holds its place until it finished elsewhere, so the waiting job
    waits on; once places free, it runs."""
    import ray

    jobs = cluster.jobs
    head = ray.get_runtime_context().get_node_id()
    [other] = [
        name
        for name in cluster.host_names()
        if name.startswith("choreography:controller:") and not name.endswith(head)
    ]
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # On the head: anywhere else, it may be on the node the test removes (it was, once).
    on_head = NodeAffinitySchedulingStrategy(head, soft=False)
    gate = (
        ray.remote(Gate)
        .options(name=GATE, namespace=GATE_NAMESPACE, num_cpus=0, scheduling_strategy=on_head)
        .remote()
    )
    try:
        tenant = {tag: Tenant(directory=str(tmp_path), tenant="acme", tag=tag) for tag in "abc"}
        first = jobs.start(KeyedJob, tenant["a"])
        _start_on(other, tenant["b"], "second")
        third = jobs.start(KeyedJob, tenant["c"])
        _until(lambda: jobs.get(third).waiting_for_key is not None)
        assert jobs.get(first).waiting_for_key is None
        assert jobs.get("second").waiting_for_key is None
        assert jobs.get("second").owner.host == other

        lost = cluster.remove_node("controller")  # the second controller's node dies
        cluster.wait_node_dead(lost)
        # Its job is unfinished in storage, so it still holds its place: the third waits on.
        assert jobs.get("second").status == JobStatus.RUNNING
        assert jobs.get(third).waiting_for_key is not None
        assert not (Path(tmp_path) / "c-start").exists()

        ray.get(gate.open.remote())
        for job_id in (first, "second", third):
            assert jobs.wait(job_id, timeout=120).status == JobStatus.COMPLETED_SUCCESSFULLY
        ends = sorted(float((Path(tmp_path) / f"{tag}-end").read_text()) for tag in "ab")
        assert float((Path(tmp_path) / "c-start").read_text()) >= ends[0]
    finally:
        ray.kill(gate)
