"""What the client refuses before it reaches the cluster: requests storage would change."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from choreography_ray.jobs import InvalidRequestError, Job, default_registry
from choreography_ray.runtime.client import Jobs


class GaugeRequest(BaseModel):
    reading: float


default_registry.register(GaugeRequest, kind="request", name="client-tests.gauge-request")


class GaugeJob(Job[GaugeRequest], name="client-tests.gauge-job"):
    def prepare_steps(self, request: GaugeRequest) -> list:
        return []


@pytest.mark.parametrize("reading", [float("nan"), float("inf")])
def test_a_job_request_with_nan_is_refused_before_anything_is_written(monkeypatch, reading):
    touched: list[str] = []
    monkeypatch.setattr(Jobs, "_remember", lambda self, *args: touched.append("config"))
    monkeypatch.setattr(Jobs, "_controller", lambda self: touched.append("controller"))
    with pytest.raises(InvalidRequestError, match=r"GaugeRequest request holds .* at reading"):
        Jobs("client-tests").start(GaugeJob, GaugeRequest(reading=reading))
    assert touched == []  # neither the cluster's configuration nor the job was written
