"""What the client refuses before it reaches the cluster: requests storage would change."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from choreography_ray.jobs import InvalidRequestError, Job, default_registry
from choreography_ray.runtime.client import AsyncJobs, Jobs


class GaugeRequest(BaseModel):
    reading: float


default_registry.register(GaugeRequest, kind="request", name="client-tests.gauge-request")


class GaugeJob(Job[GaugeRequest], name="client-tests.gauge-job"):
    def prepare_steps(self, request: GaugeRequest) -> list:
        return []


@pytest.mark.parametrize("reading", [float("nan"), float("inf")])
def test_a_job_request_with_nan_is_refused_before_anything_is_written(monkeypatch, reading):
    touched: list[str] = []

    async def remember(self: AsyncJobs, *args: object) -> None:
        touched.append("config")

    monkeypatch.setattr(AsyncJobs, "_remember", remember)
    from choreography_ray.runtime.controller_routing import ControllerRouting

    monkeypatch.setattr(
        ControllerRouting, "controller_for", lambda self, job_type: touched.append("controller")
    )
    with pytest.raises(InvalidRequestError, match=r"GaugeRequest request holds .* at reading"):
        Jobs("client-tests").start(GaugeJob, GaugeRequest(reading=reading))
    assert touched == []  # neither the cluster's configuration nor the job was written


def test_a_client_reads_the_configuration_once_per_module_and_partition(monkeypatch):
    """The configuration only grows: a client that starts many jobs of one type in one
    partition reads it once, not once per start (a call to Ray's control store each)."""
    from choreography_ray.jobs.state import JobKey
    from choreography_ray.runtime import async_client
    from choreography_ray.runtime.config import ClusterConfig

    reads: list[str] = []
    keys = [JobKey(), JobKey(namespace="other")]
    config = ClusterConfig(storage="memory://x", modules=[GaugeJob.__module__], keys=keys)

    def read(namespace: str) -> ClusterConfig:
        reads.append(namespace)
        return config

    monkeypatch.setattr(async_client, "require_config", read)
    jobs = AsyncJobs("client-tests")
    for _ in range(3):
        asyncio.run(jobs._remember(GaugeJob.__module__, JobKey()))
    assert reads == ["client-tests"]
    asyncio.run(jobs._remember(GaugeJob.__module__, JobKey(namespace="other")))  # another partition
    assert len(reads) == 2


def test_a_client_lists_controller_hosts_again_only_after_a_while(monkeypatch):
    from choreography_ray.runtime import controller_routing

    listed: list[str] = []
    monkeypatch.setattr(
        controller_routing,
        "actor_names",
        lambda namespace, prefixes: listed.append(namespace) or ["c"],
    )
    names = controller_routing.ControllerNames("client-tests", seconds=3600)
    assert names.get() == ["c"] and names.get() == ["c"]
    assert listed == ["client-tests"]
    names.forget()  # a call found its host gone
    names.get()
    assert len(listed) == 2
