"""How the contract suite opens each provider and plants raw records in it.

Each provider has a `ProviderSupport`: it opens a fresh, initialized provider for one test
and writes records behind the provider's back (malformed JSON, unknown types), as a bug or
a tampered database would.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Protocol

import pytest

from choreography_ray.jobs import JobKey, TypeRegistry
from choreography_ray.jobs.state import PlannedStep
from choreography_ray.storage import StorageProvider, StorageURL
from choreography_ray.storage.protocols import StepPlanStorage


async def plan_parts(
    plans: StepPlanStorage, job_id: str, incarnation: int
) -> list[list[PlannedStep]]:
    """Every part of a stored plan, as `plan_parts` reads them."""
    return [part async for part in plans.plan_parts(job_id, incarnation)]


async def whole_plan(plans: StepPlanStorage, job_id: str, incarnation: int) -> list[PlannedStep]:
    """A stored plan, whole: what a test compares with the plan it saved."""
    return [planned for part in await plan_parts(plans, job_id, incarnation) for planned in part]


POSTGRES_ENV = "CHOREOGRAPHY_TEST_POSTGRES_URL"
MONGODB_ENV = "CHOREOGRAPHY_TEST_MONGODB_URL"


class ProviderSupport(Protocol):
    name: str

    def available(self) -> str | None:
        """None when usable here, else why the provider is skipped."""
        ...

    async def open(self, tmp_path: Path, registry: TypeRegistry) -> StorageProvider: ...

    async def write_raw_job(
        self,
        provider: StorageProvider,
        key: JobKey,
        job_id: str,
        *,
        document: str,
        type: str,
        status: int,
        created_us: int,
    ) -> None:
        """Store `document` as the job's record, bypassing the codec."""
        ...

    async def write_raw_step(
        self,
        provider: StorageProvider,
        key: JobKey,
        job_id: str,
        step_id: str,
        *,
        document: str,
        status: int,
        stage: int,
    ) -> None: ...


class MemorySupport:
    name = "memory"

    def available(self) -> str | None:
        return None

    async def open(self, tmp_path: Path, registry: TypeRegistry) -> StorageProvider:
        from choreography_ray.storage import open_storage

        provider = open_storage(f"memory://contract-{uuid.uuid4().hex}", registry=registry)
        await provider.initialize()
        return provider

    async def write_raw_job(self, provider, key, job_id, *, document, type, status, created_us):
        from choreography_ray.storage.memory_rows import JobRow

        partition = provider.store.partition(key)
        partition.jobs[job_id] = JobRow(1, type, status, created_us, False, document)

    async def write_raw_step(self, provider, key, job_id, step_id, *, document, status, stage):
        from choreography_ray.storage.memory_rows import StepRow

        partition = provider.store.partition(key)
        partition.steps.setdefault(job_id, {})[step_id] = StepRow(1, status, stage, document)


class DefaultsSupport(MemorySupport):
    """A provider of the user's own that writes neither `keys_with_jobs` nor
    `get_jobs_excluding_finalized_stops`: the contract holds on the provider base's defaults."""

    name = "defaults"

    async def open(self, tmp_path: Path, registry: TypeRegistry) -> StorageProvider:
        from .defaults_provider import DefaultsStorage

        url = StorageURL(f"memory://contract-defaults-{uuid.uuid4().hex}")
        provider = DefaultsStorage(url, registry=registry)
        await provider.initialize()
        return provider


def supports() -> list[ProviderSupport]:
    """Every provider the contract suite runs against."""
    from .mongo_support import MongomockSupport, MongoServerSupport
    from .sql_support import PostgresSupport, SqliteSupport

    return [
        MemorySupport(),
        DefaultsSupport(),
        SqliteSupport(),
        PostgresSupport(),
        MongomockSupport(),
        MongoServerSupport(),
    ]


REQUIRE_ENV = "CHOREOGRAPHY_REQUIRE_PROVIDERS"
"""Comma-separated provider names that must run: CI sets it so a skip becomes a failure."""


def usable(support: ProviderSupport) -> ProviderSupport:
    """`support` when its provider can run here; else the test is skipped, or fails when the
    provider is required (`REQUIRE_ENV`)."""
    reason = support.available()
    if reason is not None:
        required = {name.strip() for name in os.environ.get(REQUIRE_ENV, "").split(",")}
        if support.name in required:
            pytest.fail(f"{support.name} storage is required here ({REQUIRE_ENV}) but {reason}")
        pytest.skip(reason)
    return support


def env(name: str) -> str | None:
    return os.environ.get(name) or None
