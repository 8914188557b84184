"""The client on a real Ray (one instance for the module): host failures as one line, a failed
connect that leaves the cluster as it was, a replaced controller host, a refused token."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid

import pytest

from choreography_ray.jobs import (
    HostError,
    JobNotFoundError,
    JobStatus,
    StorageUnavailableError,
)
from choreography_ray.jobs.state import JobKey
from choreography_ray.runtime.operations import Remove

from .conftest import ROOT
from .ray_jobs import FanOut, FanOutJob, kill_hosts

NAMESPACE = "client-tests"


@pytest.fixture(scope="module")
def jobs(ray_instance, tmp_path_factory):
    import choreography_ray as cr

    url = f"sqlite:///{tmp_path_factory.mktemp('client') / 'jobs.db'}"
    client = cr.connect(url, namespace=NAMESPACE, modules=["tests.runtime.ray_jobs"])
    client.storage_url = url
    return client


def test_an_error_on_the_host_that_is_not_ours_is_one_line(jobs):
    # Past the client's own checks, as a caller of an older client would be.
    with pytest.raises(HostError) as failed:
        asyncio.run(jobs.aio._ask(Remove(JobKey(), "")))
    message = str(failed.value)
    assert message.startswith("jobs.remove failed on the host: ")
    assert "\n" not in message and "\x1b[" not in message


def test_waiting_on_an_unknown_job_is_not_found(jobs):
    with pytest.raises(JobNotFoundError, match="no job with id 'no-such-id'"):
        jobs.wait("no-such-id", timeout=30)


def test_a_failed_connect_leaves_the_configuration_as_it_was(jobs):
    import choreography_ray as cr
    from choreography_ray.runtime.config import read_config

    before = read_config(NAMESPACE)
    with pytest.raises(StorageUnavailableError, match=r"^cannot reach storage postgresql"):
        cr.connect("postgresql+psycopg://nobody@127.0.0.1:1/none", namespace="client-fresh")
    assert read_config("client-fresh") is None
    assert read_config(NAMESPACE) == before
    again = cr.connect(jobs.storage_url, namespace=NAMESPACE)  # the right URL is not refused
    assert again.list() is not None


def test_jobs_the_client_starts_without_an_id_get_ids_ordered_by_time(jobs):
    """Each id after the last, so that each job's step records go to the
    end of the steps table's indexes (see the engine's test of the same)."""
    ids = [jobs.start(FanOutJob, FanOut(steps=1)) for _ in range(3)]
    for job_id in ids:
        assert jobs.wait(job_id, timeout=60).status == JobStatus.COMPLETED_SUCCESSFULLY
    assert len(set(ids)) == 3 and ids == sorted(ids)
    assert all(uuid.UUID(hex=job_id).version == 7 for job_id in ids)


def test_a_client_outlives_a_replaced_controller_host(jobs):
    import ray

    import choreography_ray as cr
    from choreography_ray.runtime.constants import controller_name

    first = jobs.start(FanOutJob, FanOut(steps=3))
    assert jobs.wait(first, timeout=60).status == JobStatus.COMPLETED_SUCCESSFULLY
    name = controller_name(ray.get_runtime_context().get_node_id())
    old = ray.get_actor(name, namespace=NAMESPACE)
    kill_hosts(NAMESPACE)
    cr.connect(namespace=NAMESPACE)  # starts a new controller host under the same name
    new = ray.get_actor(name, namespace=NAMESPACE)
    assert new._actor_id != old._actor_id

    assert jobs.get(first).status == JobStatus.COMPLETED_SUCCESSFULLY  # the same client object
    second = jobs.start(FanOutJob, FanOut(steps=3))
    assert jobs.wait(second, timeout=60).status == JobStatus.COMPLETED_SUCCESSFULLY
    assert len({j.id for j in jobs.list()} & {first, second}) == 2


def test_joining_a_token_cluster_without_the_token_says_so_at_once(jobs):
    import ray

    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        pytest.skip("this Ray runs without token authentication")
    address = ray.get_runtime_context().gcs_address
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["PYTHONPATH"] = str(ROOT)
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "choreography_ray.cli", "jobs", "list", "--address", address],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    took = time.monotonic() - began
    assert result.returncode == 4
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "uses token authentication: set RAY_AUTH_MODE=token" in lines[0]
    assert took < 15  # Ray alone retries for 20 s, then says "Failed to connect"
