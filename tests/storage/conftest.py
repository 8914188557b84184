"""Fixtures of the storage contract suite: one `provider` per supported provider."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from choreography_ray.jobs import (
    JobKey,
    JobState,
    JobStatus,
    JobStepState,
    JobStepStatus,
    TypeKind,
    TypeRegistry,
)
from choreography_ray.storage import JobsStorage, StorageProvider

from .support import ProviderSupport, supports, usable


class ExampleRequest(BaseModel):
    index: str
    shard: int


class ExampleState(BaseModel):
    shard: int
    done: int = 0


class ExampleResult(BaseModel):
    rows: int


class ExampleJob:
    pass


class ExampleStep:
    pass


JOB_TYPE = "contract.example-job"
STEP_TYPE = "contract.example-step"


@pytest.fixture
def registry() -> TypeRegistry:
    registry = TypeRegistry()
    registry.register(ExampleJob, kind=TypeKind.JOB, name=JOB_TYPE)
    registry.register(ExampleStep, kind=TypeKind.STEP, name=STEP_TYPE)
    registry.register(ExampleRequest, kind=TypeKind.REQUEST, name="contract.request")
    registry.register(ExampleState, kind=TypeKind.STATE, name="contract.state")
    registry.register(ExampleResult, kind=TypeKind.RESULT, name="contract.result")
    return registry


@pytest.fixture(params=supports(), ids=lambda support: support.name)
def support(request: pytest.FixtureRequest) -> ProviderSupport:
    return usable(request.param)


@pytest.fixture
def provider(
    support: ProviderSupport, registry: TypeRegistry, tmp_path: Path, run: Any
) -> Iterator[StorageProvider]:
    provider = run(support.open(tmp_path, registry))
    try:
        yield provider
    finally:
        run(provider.close())


@pytest.fixture
def key() -> JobKey:
    return JobKey(scope=f"scope-{uuid.uuid4().hex[:8]}", namespace="tenant-a")


@pytest.fixture
def storage(provider: StorageProvider, key: JobKey) -> JobsStorage:
    return provider.for_key(key)


@dataclass
class Factory:
    """Builds valid job and step states for a partition."""

    registry: TypeRegistry
    key: JobKey
    base: datetime = datetime(2026, 1, 1, tzinfo=UTC)

    def job(self, job_id: str | None = None, **changes: Any) -> JobState:
        values: dict[str, Any] = {
            "id": job_id or uuid.uuid4().hex,
            "key": self.key,
            "type": JOB_TYPE,
            "status": JobStatus.RUNNING,
            "created": self.base,
            "request": self.registry.dump(ExampleRequest(index="i", shard=1)),
        }
        values.update(changes)
        return JobState(**values)

    def at(self, minutes: int) -> datetime:
        return self.base + timedelta(minutes=minutes)

    def step(self, job_id: str, step_id: str | None = None, **changes: Any) -> JobStepState:
        values: dict[str, Any] = {
            "id": step_id or uuid.uuid4().hex,
            "job_id": job_id,
            "type": STEP_TYPE,
            "status": JobStepStatus.SCHEDULED,
            "state": self.registry.dump(ExampleState(shard=1)),
        }
        values.update(changes)
        return JobStepState(**values)


@pytest.fixture
def make(registry: TypeRegistry, key: JobKey) -> Factory:
    return Factory(registry, key)
