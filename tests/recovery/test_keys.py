"""The key catalog a recovery pass reads: storage's partitions with unfinished jobs, combined
with key providers, each isolated from the others' failures and bounded in time."""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib.metadata import EntryPoint
from typing import Any

import pytest

from choreography_ray.engine.clock import FakeClock, settle
from choreography_ray.engine.manager import INTERRUPTED_STATUSES
from choreography_ray.jobs import ConfigurationError, JobKey, JobState, JobStatus, TypeRegistry
from choreography_ray.jobs.registry import TypeKind
from choreography_ray.recovery import keys
from choreography_ray.recovery.keys import (
    KEY_PROVIDERS_GROUP,
    STORAGE_SOURCE,
    KeyCatalog,
    KeyCatalogReader,
    named_provider,
)
from choreography_ray.storage import StorageProvider, StorageURL, open_storage
from choreography_ray.storage.memory import forget_memory_store

from ..storage.defaults_provider import DefaultsStorage

JOB_TYPE = "recovery.catalog-job"
STORED = JobKey(scope="stored", namespace="tenant-a")
A = JobKey(scope="studio", namespace="tenant-a")
B = JobKey(scope="studio", namespace="tenant-b")


class CatalogJob:
    pass


@pytest.fixture
def registry() -> TypeRegistry:
    registry = TypeRegistry()
    registry.register(CatalogJob, kind=TypeKind.JOB, name=JOB_TYPE)
    return registry


@pytest.fixture
def storage(registry: TypeRegistry, run: Any) -> Iterator[StorageProvider]:
    url = f"memory://catalog-{uuid.uuid4().hex}"
    provider = open_storage(url, registry=registry)
    run(provider.initialize())
    yield provider
    run(provider.close())
    forget_memory_store(url)


def _save(run: Any, storage: StorageProvider, key: JobKey, status: JobStatus, **extra: Any) -> None:
    job = JobState(
        id=uuid.uuid4().hex,
        key=key,
        type=JOB_TYPE,
        status=status,
        created=datetime(2026, 1, 1, tzinfo=UTC),
        **extra,
    )
    run(storage.for_key(key).jobs.save(job))


@pytest.fixture(autouse=True)
def no_installed_entry_points(monkeypatch: pytest.MonkeyPatch) -> list[EntryPoint]:
    """The entry points a test registers, instead of whatever this environment installed."""
    registered: list[EntryPoint] = []
    monkeypatch.setattr(keys, "registered_providers", lambda: list(registered))
    return registered


# Providers the entry point and name tests import by name.
def studio_keys() -> list[tuple[str, str]]:
    return [("studio", "tenant-a"), ("studio", "tenant-b")]


async def async_studio_keys() -> list[JobKey]:
    return [B]


# -- combining sources ------------------------------------------------------------------------


def test_the_storage_catalog_alone_lists_partitions_with_unfinished_jobs(run, storage):
    _save(run, storage, STORED, JobStatus.RUNNING)
    _save(run, storage, A, JobStatus.COMPLETED_SUCCESSFULLY)
    assert run(KeyCatalogReader(storage).read()) == KeyCatalog(keys=(STORED,))


def test_the_catalog_names_exactly_the_partitions_where_rehydration_finds_work(
    run, storage, registry
):
    # Every status, with and without a finalized stop, each in a partition of its own.
    cases = list(itertools.product(JobStatus, (False, True)))
    for status, finalized in cases:
        key = JobKey(scope=status.name.lower(), namespace=f"finalized-{finalized}")
        _save(run, storage, key, status, stop_finalized=finalized)
    catalog = run(KeyCatalogReader(storage).read())
    with_work = set()
    for status, finalized in cases:
        key = JobKey(scope=status.name.lower(), namespace=f"finalized-{finalized}")
        loaded = storage.for_key(key).jobs.get_jobs_excluding_finalized_stops(INTERRUPTED_STATUSES)
        if run(loaded):
            with_work.add(key)
    assert set(catalog.keys) == with_work
    assert len(with_work) == 2 * len(INTERRUPTED_STATUSES) - 1  # all but finalized stops


def test_providers_of_every_kind_are_combined_deduplicated_and_sorted(run, storage):
    _save(run, storage, STORED, JobStatus.RUNNING)
    _save(run, storage, A, JobStatus.RUNNING)

    def sync_pairs():
        return [("studio", "tenant-a"), ("studio", "tenant-a"), ["zeta", "default"]]

    def sync_generator():
        yield A
        yield ("alpha", "default")

    async def async_keys():
        return {B}

    async def async_generator():
        yield ("studio", "tenant-b")

    class CallableObject:
        async def __call__(self):
            return [JobKey(scope="object")]

    reader = KeyCatalogReader(
        storage, [sync_pairs, sync_generator, async_keys, async_generator, CallableObject()]
    )
    catalog = run(reader.read())
    assert catalog.complete
    assert catalog.keys == (
        JobKey(scope="alpha"),
        JobKey(scope="object"),
        STORED,
        A,
        B,
        JobKey(scope="zeta"),
    )


# -- failures are isolated ----------------------------------------------------------------------


def test_a_failing_provider_is_logged_and_the_others_still_count(run, storage, caplog):
    _save(run, storage, STORED, JobStatus.RUNNING)

    def broken():
        raise RuntimeError("catalog service\nunreachable")

    with caplog.at_level(logging.WARNING, logger="choreography_ray.recovery"):
        catalog = run(KeyCatalogReader(storage, [broken, studio_keys]).read())
    assert catalog.keys == (STORED, A, B)
    assert not catalog.complete
    [failed] = catalog.failed
    assert failed.startswith(f"{__name__}:test_a_failing") and failed.endswith("<locals>.broken")
    assert "failed; this pass goes on without it: RuntimeError: catalog service unreachable" in (
        caplog.text
    )


def test_a_failing_storage_catalog_leaves_the_providers_keys(run, storage, monkeypatch):
    async def down(statuses):
        raise ConnectionError("database is down")

    monkeypatch.setattr(storage, "keys_with_jobs", down)
    catalog = run(KeyCatalogReader(storage, [studio_keys]).read())
    assert catalog == KeyCatalog(keys=(A, B), failed=(STORAGE_SOURCE,))


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ([("studio", "tenant-a"), 42], "returned 42, not a (scope, namespace) pair"),
        ([("studio", "")], "returned ('studio', ''), not a valid key"),
        ([("a", "b", "c")], "returned ('a', 'b', 'c'), not a (scope, namespace) pair"),
        ("studio", "returned 'studio', not an iterable"),
        (None, "returned None, not an iterable"),
    ],
)
def test_a_provider_that_answers_nonsense_fails_alone_with_a_clear_line(
    run, storage, caplog, answer, why
):
    with caplog.at_level(logging.WARNING, logger="choreography_ray.recovery"):
        catalog = run(KeyCatalogReader(storage, [lambda: answer, studio_keys]).read())
    assert catalog.keys == (A, B) and len(catalog.failed) == 1
    assert why in caplog.text


# -- a storage provider of the user's own, without a catalog of its partitions -------------------


def _uncatalogued(registry: TypeRegistry) -> DefaultsStorage:
    return DefaultsStorage(
        StorageURL(f"memory://uncatalogued-{uuid.uuid4().hex}"), registry=registry
    )


def test_storage_without_a_catalog_makes_recovery_incomplete_and_says_so_at_start(
    run, registry, caplog
):
    storage = _uncatalogued(registry)
    _save(run, storage, STORED, JobStatus.RUNNING)  # a partition this host opened
    reader = KeyCatalogReader(storage)
    with caplog.at_level(logging.WARNING, logger="choreography_ray.recovery"):
        catalogs = [run(reader.read()) for _ in range(3)]

    assert all(catalog.keys == (STORED,) for catalog in catalogs)  # what it remembers
    assert all(not catalog.complete and not catalog.failed for catalog in catalogs)
    assert catalogs[0].partial == (
        f"{STORAGE_SOURCE} (DefaultsStorage keeps no partition catalog)",
    )
    [warning] = [r.getMessage() for r in caplog.records]  # once, at the first pass
    assert warning.startswith("recovery is incomplete: storage provider DefaultsStorage(")
    for what_to_do in ("keys_with_jobs", "partition_catalog=True", "CHOREOGRAPHY_KEY_PROVIDERS"):
        assert what_to_do in warning


def test_a_key_provider_beside_storage_without_a_catalog_completes_recovery(
    run, registry, caplog, no_installed_entry_points
):
    storage = _uncatalogued(registry)
    _save(run, storage, STORED, JobStatus.RUNNING)
    with caplog.at_level(logging.WARNING, logger="choreography_ray.recovery"):
        in_code = run(KeyCatalogReader(storage, [studio_keys]).read())
        named = run(KeyCatalogReader(storage, names=[f"{__name__}:studio_keys"]).read())
        no_installed_entry_points.append(
            EntryPoint(name="studio", value=f"{__name__}:studio_keys", group=KEY_PROVIDERS_GROUP)
        )
        installed = run(KeyCatalogReader(storage).read())
    assert in_code == named == installed == KeyCatalog(keys=(STORED, A, B))
    assert caplog.records == []


def test_an_incomplete_catalog_is_warned_about_once(run, storage, caplog):
    def broken():
        raise RuntimeError("no")

    reader = KeyCatalogReader(storage, [broken])
    with caplog.at_level(logging.WARNING, logger="choreography_ray.recovery"):
        for _ in range(3):
            assert not run(reader.read()).complete
    warnings = [r for r in caplog.records if "key catalog is incomplete" in r.getMessage()]
    assert len(warnings) == 1
    assert "test_an_incomplete_catalog_is_warned_about_once.<locals>.broken" in (
        warnings[0].getMessage()
    )


def test_a_complete_catalog_warns_nothing(run, storage, caplog):
    with caplog.at_level(logging.WARNING, logger="choreography_ray.recovery"):
        assert run(KeyCatalogReader(storage, [studio_keys]).read()).complete
    assert caplog.records == []


def test_a_provider_that_never_answers_is_given_up_after_the_timeout(run, storage):
    _save(run, storage, STORED, JobStatus.RUNNING)
    clock = FakeClock()

    asked = asyncio.Event()

    async def hangs():
        asked.set()
        await asyncio.Event().wait()

    async def scenario() -> KeyCatalog:
        reader = KeyCatalogReader(storage, [hangs, async_studio_keys], timeout=5, clock=clock)
        pass_ = asyncio.ensure_future(reader.read())
        # The sources are asked once entry points are read in a thread: a real event.
        await asyncio.wait_for(asked.wait(), 10)
        await settle()
        await clock.advance(4)
        assert not pass_.done()
        await clock.advance(2)
        try:  # the storage source answers from its thread: a bounded wait, not a timeout
            return await asyncio.wait_for(pass_, 10)
        except TimeoutError:
            raise AssertionError("the pass still waits on a provider that never answers") from None

    catalog = run(scenario())
    assert catalog.keys == (STORED, B)
    assert catalog.failed == (
        f"{__name__}:test_a_provider_that_never_answers_is_given_up_after_the_timeout"
        ".<locals>.hangs",
    )


# -- registration by name and by entry point ----------------------------------------------------


def test_a_named_provider_is_imported_and_called(run, storage):
    reader = KeyCatalogReader(storage, names=[f"{__name__}:async_studio_keys"])
    assert run(reader.read()) == KeyCatalog(keys=(B,))
    missing = KeyCatalogReader(storage, names=[f"{__name__}:not_there"])
    assert run(missing.read()) == KeyCatalog(keys=(), failed=(f"{__name__}:not_there",))


@pytest.mark.parametrize("timeout", [0, -1, float("nan")])
def test_a_timeout_that_is_not_positive_is_refused(storage, timeout):
    with pytest.raises(ConfigurationError, match="timeout must be a positive number"):
        KeyCatalogReader(storage, timeout=timeout)


@pytest.mark.parametrize("name", ["no_colon", "a:b:c", "", "mod:", ":attr", "a b:c"])
def test_a_name_that_is_not_module_colon_callable_is_refused_at_once(name):
    with pytest.raises(ConfigurationError, match="expected an importable callable as module:"):
        named_provider(name)


def test_entry_points_are_loaded_on_each_pass_and_a_broken_one_fails_alone(
    run, storage, no_installed_entry_points, monkeypatch
):
    group = KEY_PROVIDERS_GROUP
    no_installed_entry_points.extend(
        [
            EntryPoint(name="studio", value=f"{__name__}:studio_keys", group=group),
            EntryPoint(name="later", value=f"{__name__}:added_later", group=group),
            EntryPoint(name="missing", value="no_such_module_here:keys", group=group),
        ]
    )
    reader = KeyCatalogReader(storage)
    first = run(reader.read())
    assert first == KeyCatalog(keys=(A, B), failed=("entry point later", "entry point missing"))

    # The provider that failed to load is loaded again on the next pass, with no other change.
    monkeypatch.setattr(
        sys.modules[__name__],
        "added_later",
        lambda: [("later", "default")],
        raising=False,
    )
    second = run(reader.read())
    assert second == KeyCatalog(keys=(JobKey(scope="later"), A, B), failed=("entry point missing",))


def test_an_entry_point_that_is_not_callable_fails_alone(run, storage, no_installed_entry_points):
    no_installed_entry_points.append(
        EntryPoint(name="constant", value=f"{__name__}:JOB_TYPE", group=KEY_PROVIDERS_GROUP)
    )
    catalog = run(KeyCatalogReader(storage, [studio_keys]).read())
    assert catalog == KeyCatalog(keys=(A, B), failed=("entry point constant",))


def test_installed_entry_points_can_be_left_out(run, storage, no_installed_entry_points):
    no_installed_entry_points.append(
        EntryPoint(name="studio", value=f"{__name__}:studio_keys", group=KEY_PROVIDERS_GROUP)
    )
    assert run(KeyCatalogReader(storage, entry_points=False).read()) == KeyCatalog(keys=())


# -- a failed source is retried on its own ---------------------------------------------------------


def test_a_failed_provider_is_asked_again_alone_after_one_second_doubling_to_sixty(run, storage):
    """The recovery seed: a provider that failed is retried after 1 s, doubling up to 60 s,
    until it answers, with no new pass; its keys then go to `found`. The sources that
    answered are not asked again."""
    clock = FakeClock()
    begun = clock.now()
    asked: list[float] = []
    studio: list[float] = []
    found: list[list[JobKey]] = []

    async def flaky() -> list[JobKey]:
        asked.append((clock.now() - begun).total_seconds())
        if len(asked) < 9:
            raise ConnectionError("catalog service unreachable")
        return [B]

    async def counted() -> list[JobKey]:
        studio.append((clock.now() - begun).total_seconds())
        return [A]

    async def scenario() -> KeyCatalog:
        reader = KeyCatalogReader(storage, [flaky, counted], clock=clock)

        async def recover(keys: list[JobKey]) -> None:
            found.append(keys)

        reader.found = recover
        catalog = await reader.read()
        await settle()  # the retry's first wait begins
        for _ in range(300):
            await clock.advance(1)
            await settle()
        reader.close()
        return catalog

    catalog = run(scenario())
    assert catalog.keys == (A,) and not catalog.complete
    assert [b - a for a, b in itertools.pairwise(asked)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert found == [[B]]
    assert studio == [0.0]


def test_a_pass_that_reads_a_failed_source_again_ends_its_retries(run, storage):
    clock = FakeClock()
    asked: list[int] = []
    broken = [True]

    async def flaky() -> list[JobKey]:
        asked.append(1)
        if broken[0]:
            raise ConnectionError("catalog service unreachable")
        return [B]

    async def scenario() -> KeyCatalog:
        reader = KeyCatalogReader(storage, [flaky], clock=clock)
        await reader.read()
        broken[0] = False
        again = await reader.read()  # a membership pass: it answers now
        for _ in range(10):
            await clock.advance(10)
            await settle()
        reader.close()
        return again

    again = run(scenario())
    assert again.complete and again.keys == (B,)
    assert len(asked) == 2  # no retry after the pass that read it
