"""A provider of the user's own: registered by URL scheme, and given the recovery reads it did
not write (the seed's defaults): `get_jobs_excluding_finalized_stops` reads and filters, and
`keys_with_jobs` names the partitions the provider opened. The whole contract suite also runs
against such a provider (`defaults` in `support.py`)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from choreography_ray.jobs import ConfigurationError, JobKey, JobState, JobStatus, TypeRegistry
from choreography_ray.storage import (
    ProviderRegistry,
    StorageCapabilities,
    StorageProvider,
    StorageURL,
)
from choreography_ray.storage.memory import MemoryStorage

from .conftest import JOB_TYPE, ExampleJob
from .defaults_provider import DefaultsStorage

A = JobKey(scope="studio", namespace="tenant-a")
B = JobKey(scope="studio", namespace="tenant-b")
UNFINISHED = [JobStatus.RUNNING, JobStatus.STOPPED, JobStatus.REMOVING]


@pytest.fixture
def registry() -> TypeRegistry:
    registry = TypeRegistry()
    registry.register(ExampleJob, kind="job", name=JOB_TYPE)
    return registry


def _url() -> StorageURL:
    return StorageURL(f"memory://custom-{uuid.uuid4().hex}")


def _save(run: Any, provider: StorageProvider, key: JobKey, job_id: str, **values: Any) -> None:
    job = JobState(
        id=job_id,
        key=key,
        type=JOB_TYPE,
        created=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=len(job_id)),
        **values,
    )
    run(provider.for_key(key).jobs.save(job))


def test_the_default_listing_leaves_out_only_finalized_stops(run, registry):
    provider = DefaultsStorage(_url(), registry=registry)
    _save(run, provider, A, "running", status=JobStatus.RUNNING)
    _save(run, provider, A, "open-stop", status=JobStatus.STOPPED)
    _save(run, provider, A, "done-stop", status=JobStatus.STOPPED, stop_finalized=True)
    _save(run, provider, A, "removing-x", status=JobStatus.REMOVING, stop_finalized=True)
    _save(run, provider, A, "completed-x", status=JobStatus.COMPLETED_SUCCESSFULLY)
    jobs = provider.for_key(A).jobs

    found = run(jobs.get_jobs_excluding_finalized_stops(UNFINISHED))

    assert [job.id for job in found] == ["running", "open-stop", "removing-x"]  # by creation
    assert run(jobs.get_jobs_excluding_finalized_stops([JobStatus.STOPPED]))[0].id == "open-stop"
    assert run(jobs.get_jobs_excluding_finalized_stops([])) == []


def test_the_default_catalog_names_the_partitions_this_provider_opened(run, registry):
    url = _url()
    writer = DefaultsStorage(url, registry=registry)
    _save(run, writer, A, "running", status=JobStatus.RUNNING)
    _save(run, writer, B, "done", status=JobStatus.COMPLETED_SUCCESSFULLY)

    assert run(writer.keys_with_jobs(UNFINISHED)) == [A]
    assert run(writer.keys_with_jobs([])) == []
    # Another process's provider on the same store never opened A: the default cannot name
    # it, which is why recovery warns (tests/recovery/test_keys.py) unless a key provider does.
    assert not DefaultsStorage.capabilities.partition_catalog
    assert run(DefaultsStorage(url, registry=registry).keys_with_jobs(UNFINISHED)) == []
    assert run(MemoryStorage(url, registry=registry).keys_with_jobs(UNFINISHED)) == [A]


def test_a_provider_claims_nothing_beyond_the_contract_unless_it_says_so():
    class Minimal(StorageProvider):
        def _open_partition(self, key):  # pragma: no cover - never opened here
            raise AssertionError

    assert Minimal.capabilities == StorageCapabilities(
        external_step_plans=False, atomic_batches=False, shared_across_processes=False
    )
    assert not Minimal.capabilities.partition_catalog
    assert MemoryStorage.capabilities.partition_catalog


# -- the scheme registry --------------------------------------------------------------------------


def test_a_registered_scheme_opens_its_provider(registry):
    providers = ProviderRegistry()
    providers.register("mystore", DefaultsStorage)
    providers.register("mystore", DefaultsStorage)  # the same again changes nothing
    providers.register("lazy", "tests.storage.defaults_provider:DefaultsStorage")

    assert providers.schemes == ["lazy", "mystore"]
    assert providers.provider_class(StorageURL("mystore://x")) is DefaultsStorage
    assert providers.provider_class(StorageURL("LAZY://x")) is DefaultsStorage


@pytest.mark.parametrize(
    ("scheme", "provider", "said"),
    [
        ("my store", DefaultsStorage, "lower-case letters"),
        ("1store", DefaultsStorage, "starting with a letter"),
        ("mystore", "not a name", "is not module:Class"),
        ("mystore", dict, "is not a StorageProvider subclass"),
        ("memory", DefaultsStorage, "already opens choreography_ray.storage.memory:MemoryStorage"),
    ],
)
def test_a_registration_that_cannot_work_is_refused_by_name(scheme, provider, said):
    providers = ProviderRegistry()
    providers.register("memory", "choreography_ray.storage.memory:MemoryStorage")
    with pytest.raises(ConfigurationError, match=said):
        providers.register(scheme, provider)
    assert providers.schemes == ["memory"]


def test_an_unknown_scheme_names_the_registered_ones():
    providers = ProviderRegistry()
    providers.register("mystore", DefaultsStorage)
    with pytest.raises(ConfigurationError) as refused:
        providers.provider_class(StorageURL("other://user:secret@host/db"))
    assert str(refused.value) == (
        "storage URL 'other://user:***@host/db': unknown scheme 'other'; supported: mystore"
    )


def test_a_named_provider_that_is_not_one_is_refused_when_used():
    providers = ProviderRegistry()
    providers.register("mystore", "tests.storage.defaults_provider:DefaultsJobStorage")
    with pytest.raises(ConfigurationError, match="is not a storage provider"):
        providers.provider_class(StorageURL("mystore://x"))
