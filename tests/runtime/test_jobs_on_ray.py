"""The job system on a single-node Ray: one Ray instance for this module, SQLite and PostgreSQL
storage each in a Ray namespace of its own."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import uuid
from typing import Any

import pytest

from choreography_ray.jobs import (
    ItemFailed,
    JobNotFoundError,
    JobsOptions,
    JobStatus,
    JobStepStatus,
    StopJobError,
    StopJobFailed,
)

from .conftest import ROOT
from .ray_jobs import FanOut, FanOutJob, SquaresJob, gate, halve, triple

POSTGRES_ENV = "CHOREOGRAPHY_TEST_POSTGRES_URL"


def _postgres_url() -> str | None:
    base = os.environ.get(POSTGRES_ENV)
    if not base:
        return None
    separator = "&" if "?" in base else "?"
    return f"{base}{separator}schema=ray_{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module", params=["sqlite", "postgres", "memory"])
def jobs(request, ray_instance, tmp_path_factory):
    import choreography_ray as cr

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('ray') / 'jobs.db'}"
    elif request.param == "memory":
        url = f"memory://ray-tests-{uuid.uuid4().hex[:8]}"  # served by one storage actor
    else:
        url = _postgres_url()
        if url is None:
            required = os.environ.get("CHOREOGRAPHY_REQUIRE_PROVIDERS", "")
            if "postgres" in required:
                pytest.fail(f"{POSTGRES_ENV} is required here but not set")
            pytest.skip(f"{POSTGRES_ENV} is not set")
    # Each storage gets its own Ray namespace: a namespace's hosts share one configuration.
    client = cr.connect(
        url, namespace=f"choreography-{request.param}", modules=["tests.runtime.ray_jobs"]
    )
    client.storage_url = url
    yield client


def test_a_job_runs_to_completion(jobs):
    job_id = jobs.start(FanOutJob, FanOut(steps=20, stages=2))
    state = jobs.wait(job_id, timeout=60)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 20
    assert [s.successful_steps for s in state.progress.stages] == [10, 10]


def test_a_map_of_step_functions_runs_each_item(jobs):
    """`jobs.map` over a generator: a plain def (Ray tasks) with a failing item, and an async
    def in two stages; both durable jobs kept with their outcomes."""
    tripled = jobs.map(triple, (n if n != 4 else -n for n in range(10)), name="triple")
    halved = jobs.map(halve, range(6), stages=lambda n: n % 2, max_active_steps=2)
    # Ids ordered by time, as `start` gives (test_client_on_ray.py).
    assert tripled.job_id < halved.job_id and uuid.UUID(hex=halved.job_id).version == 7
    state = tripled.wait(timeout=60)
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert (state.progress.successful_steps, state.progress.failed_steps) == (9, 1)
    assert state.details == "triple"
    state = halved.wait(timeout=60)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert [s.successful_steps for s in state.progress.stages] == [3, 3]
    assert state.max_active_steps == 2
    again = jobs.map(halve, range(6), job_id=halved.job_id)
    assert again.job_id == halved.job_id
    assert jobs.step_counts(halved.job_id).total == 6

    # Results, read through a controller host a page at a time and typed here.
    listed = list(jobs.results(tripled.job_id))
    assert [index for index, _ in listed] == list(range(10))
    assert [value for index, value in listed if index != 4] == [3 * n for n in range(10) if n != 4]
    failed = listed[4].value
    assert isinstance(failed, ItemFailed) and failed.error_type == "ValueError"
    assert sorted(index for index, _ in tripled.as_completed()) == list(range(10))
    assert jobs.gather(halved.job_id) == [n / 2 for n in range(6)]
    with pytest.raises(ItemFailed, match=r"item 4 has no result .*negative: -4"):
        jobs.gather(tripled.job_id)

    async def read_async() -> tuple[list[Any], list[Any]]:
        done = [item async for item in halved.aio.as_completed(interval=0.05)]
        return done, await jobs.aio.gather(tripled.job_id, return_exceptions=True)

    done, gathered = asyncio.run(read_async())
    assert sorted(done) == [(n, n / 2) for n in range(6)]
    assert gathered[:4] == [0, 3, 6, 9] and isinstance(gathered[4], ItemFailed)


def test_a_failing_step_completes_the_job_with_failures(jobs):
    job_id = jobs.start(FanOutJob, FanOut(steps=5, fail=[3]))
    state = jobs.wait(job_id, timeout=60)
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert (state.progress.successful_steps, state.progress.failed_steps) == (4, 1)


def test_synchronous_steps_run_as_ray_tasks(jobs):
    job_id = jobs.start(SquaresJob, FanOut(steps=6, fail=[5]))
    state = jobs.wait(job_id, timeout=60)
    assert state.status == JobStatus.COMPLETED_WITH_FAILURES
    assert (state.progress.successful_steps, state.progress.failed_steps) == (5, 1)


def test_a_stopped_job_resumes_and_completes(jobs):
    import ray

    handle = gate()
    try:
        job_id = jobs.start(FanOutJob, FanOut(steps=4, block=True))
        jobs.stop(job_id)
        stopped = jobs.wait(job_id, timeout=60)
        assert stopped.status == JobStatus.STOPPED and stopped.stop_finalized
        assert stopped.progress.stopped_steps == 4
        ray.get(handle.open.remote())
        jobs.resume(job_id)
        state = jobs.wait(job_id, timeout=60)
        assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
        assert state.execution_generation == 2
        assert state.progress.successful_steps == 4
    finally:
        ray.kill(handle)


def test_removing_a_job_deletes_it(jobs):
    import ray

    handle = gate()
    try:
        job_id = jobs.start(FanOutJob, FanOut(steps=3, block=True))
        jobs.remove(job_id)
        assert jobs.wait(job_id, timeout=60) is None
        with pytest.raises(JobNotFoundError):
            jobs.get(job_id)
    finally:
        ray.kill(handle)


def test_errors_are_the_projects_exceptions_with_their_codes(jobs):
    with pytest.raises(JobNotFoundError, match="no job"):
        jobs.get("no-such-job")
    job_id = jobs.start(FanOutJob, FanOut(steps=1))
    jobs.wait(job_id, timeout=60)
    with pytest.raises(StopJobFailed) as raised:
        jobs.stop(job_id)
    assert raised.value.code == StopJobError.JOB_IS_COMPLETED


def test_a_caller_supplied_id_makes_start_idempotent(jobs):
    job_id = f"fixed-{uuid.uuid4().hex[:8]}"
    assert jobs.start(FanOutJob, FanOut(steps=3), job_id=job_id) == job_id
    assert jobs.start(FanOutJob, FanOut(steps=3), job_id=job_id) == job_id
    state = jobs.wait(job_id, timeout=60)
    assert state.progress.total_steps == 3 and state.progress.successful_steps == 3


def test_a_thousand_steps_are_counted_exactly(jobs):
    job_id = jobs.start(FanOutJob, FanOut(steps=1000, stages=2))
    state = jobs.wait(job_id, timeout=120)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.total_steps == 1000
    assert state.progress.successful_steps == 1000
    assert state.progress.failed_steps == state.progress.stopped_steps == 0


def _driver(namespace: str, code: str) -> str:
    """Run `code` in a second driver process on this Ray cluster; its printed output."""
    import ray

    address = ray.get_runtime_context().gcs_address  # this module's cluster, not any other
    script = textwrap.dedent(
        f"""
        import choreography_ray as cr
        jobs = cr.connect(address={address!r}, namespace={namespace!r})
        """
    ) + textwrap.dedent(code)
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_a_second_driver_sees_the_same_job(jobs):
    job_id = jobs.start(FanOutJob, FanOut(steps=5))
    jobs.wait(job_id, timeout=60)
    seen = _driver(
        jobs.namespace,
        f"""
        state = jobs.get({job_id!r})
        print(state.status.name, state.progress.successful_steps)
        """,
    )
    assert seen == "COMPLETED_SUCCESSFULLY 5"


def test_a_driver_that_exits_leaves_its_job_for_the_next_one(jobs):
    job_id = _driver(
        jobs.namespace,
        """
        from tests.runtime.ray_jobs import FanOut, FanOutJob
        print(jobs.start(FanOutJob, FanOut(steps=50)))
        """,
    )
    state = jobs.wait(job_id, timeout=60)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 50


def test_step_records_hold_every_outcome(jobs):
    import asyncio

    from choreography_ray.runtime.cluster_storage import open_cluster_storage

    job_id = jobs.start(FanOutJob, FanOut(steps=10, fail=[0]))
    jobs.wait(job_id, timeout=60)

    async def count():
        provider = open_cluster_storage(
            jobs.storage_url, namespace=jobs.namespace, modules=[], options=JobsOptions()
        )
        await provider.initialize()
        try:
            return await provider.for_key().steps.count_by_status(job_id)
        finally:
            await provider.close()

    counts = asyncio.run(count())
    assert counts == {
        JobStepStatus.COMPLETED_SUCCESSFULLY: 9,
        JobStepStatus.COMPLETED_WITH_FAILURE: 1,
    }


def test_progress_events_follow_a_job_and_the_async_client_works(jobs):
    import asyncio

    async def drive():
        job_id = await jobs.aio.start(FanOutJob, FanOut(steps=40))
        seen = [state async for state in jobs.aio.events(job_id, interval=0.05)]
        return seen, await jobs.aio.get(job_id)

    seen, final = asyncio.run(drive())
    assert seen[-1].status == JobStatus.COMPLETED_SUCCESSFULLY == final.status
    done = [s.progress.successful_steps for s in seen]
    assert done == sorted(done) and done[-1] == 40


def test_a_job_module_learned_after_connect_reaches_every_host_and_the_storage_actor(
    ray_instance,
):
    import choreography_ray as cr

    namespace = f"late-modules-{uuid.uuid4().hex[:6]}"
    client = cr.connect(f"memory://{namespace}", namespace=namespace)  # no modules yet
    job_id = client.start(FanOutJob, FanOut(steps=3))  # its module is added on start
    state = client.wait(job_id, timeout=60)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_several_worker_hosts_per_node_share_a_jobs_steps(ray_instance, tmp_path):
    import ray

    import choreography_ray as cr
    from choreography_ray.runtime.constants import worker_name

    namespace = f"wide-{uuid.uuid4().hex[:6]}"
    client = cr.connect(
        f"sqlite:///{tmp_path / 'wide.db'}",
        namespace=namespace,
        modules=["tests.runtime.ray_jobs"],
        max_parallel_steps=4,
        workers_per_node=2,
    )
    job_id = client.start(FanOutJob, FanOut(steps=200))
    state = client.wait(job_id, timeout=60)
    assert state.progress.successful_steps == 200
    node = ray.get_runtime_context().get_node_id()
    stats = [
        ray.get(ray.get_actor(worker_name(node, i), namespace=namespace).stats.remote())
        for i in range(2)
    ]
    assert [s["max_parallel_steps"] for s in stats] == [2, 2]  # the node's cap, shared
    assert all(s["step_rows"] > 0 for s in stats)  # both ran steps
    assert sum(s["step_rows"] for s in stats) >= 200  # an outcome each, at least


def _worker_hosts(namespace: str) -> list[dict[str, Any]]:
    """The stats of the namespace's worker hosts, by name."""
    import ray

    from choreography_ray.runtime.constants import WORKER_PREFIX
    from choreography_ray.runtime.directory import actor_names

    names = sorted(n for n in actor_names(namespace) if n.startswith(WORKER_PREFIX))
    return [
        {"name": n, **ray.get(ray.get_actor(n, namespace=namespace).stats.remote(), timeout=30)}
        for n in names
    ]


def test_by_default_a_node_runs_one_worker_host_per_cpu(jobs):
    """The module's Ray has 2 CPUs: the default start runs two worker hosts on the node,
    which split its window of 128 async steps per CPU, and both run a job's steps."""
    import ray

    from choreography_ray.runtime.constants import worker_name

    node = ray.get_runtime_context().get_node_id()
    job_id = jobs.start(FanOutJob, FanOut(steps=100))
    assert jobs.wait(job_id, timeout=60).progress.successful_steps == 100
    hosts = _worker_hosts(jobs.namespace)
    assert [h["name"] for h in hosts] == [worker_name(node, 0), worker_name(node, 1)]
    assert [h["max_parallel_steps"] for h in hosts] == [128, 128]  # 256 for the node
    assert all(h["runs_done"] > 0 for h in hosts)


def test_an_explicit_workers_per_node_wins_over_the_nodes_cpus(ray_instance):
    """One worker host on the 2-CPU node, with the node's whole window; a later `connect`
    that leaves the number out keeps the cluster's (it starts no second host)."""
    import choreography_ray as cr

    namespace = f"narrow-{uuid.uuid4().hex[:6]}"
    for given in (1, None):
        client = cr.connect(f"memory://{namespace}", namespace=namespace, workers_per_node=given)
        hosts = _worker_hosts(namespace)
        assert len(hosts) == 1 and hosts[0]["max_parallel_steps"] == 256
    state = client.wait(client.start(FanOutJob, FanOut(steps=5)), timeout=60)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY


class _Probe:
    """A stand-in host actor: answers pings with its epoch."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    async def ping(self) -> int:
        return self.epoch


def _wait_dead(probe, within: float = 30.0) -> None:
    """Until a killed actor stops answering: a call just after `ray.kill` may still be served."""
    import time

    import ray

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            ray.get(probe.ping.remote(), timeout=within)
        except ray.exceptions.RayActorError:
            return
    raise AssertionError(f"the killed actor still answered after {within} s")


def test_the_routing_table_finds_hosts_once_and_drops_a_dead_one(ray_instance):
    import asyncio

    import ray

    from choreography_ray.engine.clock import SystemClock
    from choreography_ray.runtime.constants import controller_name, worker_name
    from choreography_ray.runtime.directory import RayDirectory
    from choreography_ray.runtime.routes import Routes

    namespace = f"routes-{uuid.uuid4().hex[:6]}"
    names = [worker_name("n1"), worker_name("n2"), controller_name("n1")]
    probes = [
        ray.remote(_Probe).options(name=name, namespace=namespace, num_cpus=0).remote(epoch)
        for epoch, name in enumerate(names)
    ]
    ray.get([probe.ping.remote() for probe in probes])

    class Counted(RayDirectory):
        readings = 0

        def names(self) -> list[str]:
            self.readings += 1
            return super().names()

    directory = Counted(namespace)

    async def scenario() -> None:
        routes = Routes(directory, timeout=30, clock=SystemClock())
        await routes.start()
        try:
            assert routes.workers == names[:2] and routes.controllers == names[2:]
            for _ in range(20):
                assert await routes.worker(names[0]).ping() == 0
            assert directory.readings == 1
            ray.kill(probes[1])
            await asyncio.to_thread(_wait_dead, probes[1])  # ray.kill is asynchronous
            with pytest.raises(ray.exceptions.RayActorError):
                await routes.worker(names[1]).ping()
            assert routes.workers == names[:1]
            await routes.refresh()  # Ray no longer lists it either
            assert routes.workers == names[:1] and directory.readings >= 2
        finally:
            routes.close()

    try:
        asyncio.run(scenario())
    finally:
        for probe in probes:
            ray.kill(probe)
