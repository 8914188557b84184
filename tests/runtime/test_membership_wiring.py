"""The membership watch's and recovery's Ray side, without Ray: host names read back into node
ids, a controller host told of lost hosts drops them from its routing table before its jobs
send their steps again, a membership pass rehydrates known partitions again, and what a
retried key source finds is recovered."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from choreography_ray.engine.clock import FakeClock, settle
from choreography_ray.jobs import JobKey, JobsOptions
from choreography_ray.recovery import keys
from choreography_ray.recovery.keys import KeyCatalog
from choreography_ray.recovery.retries import Partitions
from choreography_ray.runtime import membership
from choreography_ray.runtime.config import ClusterConfig
from choreography_ray.runtime.constants import controller_name, host_node, worker_name
from choreography_ray.runtime.controller_recovery import ControllerRecovery
from choreography_ray.runtime.membership import ControllerParticipant
from choreography_ray.storage.protocols import StorageCapabilities


def test_a_host_name_gives_its_node() -> None:
    assert host_node(controller_name("abc123")) == "abc123"
    assert host_node(worker_name("abc123")) == "abc123"
    assert host_node(worker_name("abc123", 2)) == "abc123"
    with pytest.raises(ValueError, match="not the name of a host actor"):
        host_node("choreography:storage")


class _Routes:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def forget(self, name: str) -> None:
        self.calls.append(f"forget {name}")


class _Host:
    name = "choreography:controller:me"

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.routes = _Routes(self.calls)

    async def hosts_lost(self, names: Mapping[str, str | None]) -> int:
        self.calls.append(f"lost {sorted(names)}")
        return 0


def test_lost_hosts_leave_the_routing_table_before_the_steps_are_sent_again(run: Any) -> None:
    # Measured: without it, steps sent again right after a node's death went back to its
    # dead worker host, and the job waited for the call's bound (benchmarks/RESULTS.md).
    host = _Host()
    participant = ControllerParticipant(host, object, cluster=None)  # type: ignore[arg-type]
    gone = worker_name("dead")
    run(participant.hosts_lost({gone: None}))
    assert host.calls == [f"forget {gone}", f"lost ['{gone}']"]


class _Recovery:
    def __init__(self, partitions: Partitions[JobKey]) -> None:
        self.partitions = partitions


class _RecoveringHost:
    name = "choreography:controller:me"
    namespace = "test"

    def __init__(self, partitions: Partitions[JobKey], managers: list[JobKey]) -> None:
        self.recovery = _Recovery(partitions)
        self.managers = dict.fromkeys(managers)


def test_a_membership_pass_rehydrates_the_partitions_already_known_again(
    run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Something died: the jobs of a partition rehydrated long ago may have lost their live
    activation with it, so the pass rehydrates known partitions too, not only new ones (the
    start-up pass skips them). The catalog's, the configuration's and the served ones."""
    served, configured, found = JobKey(scope="served"), JobKey(scope="conf"), JobKey(scope="new")
    monkeypatch.setattr(
        membership,
        "cluster_config",
        lambda namespace: ClusterConfig(storage="x", keys=[configured]),
    )

    async def scenario() -> list[JobKey]:
        attempts: list[JobKey] = []

        async def rehydrate(key: JobKey) -> None:
            attempts.append(key)

        partitions = Partitions(rehydrate, FakeClock(), what="test")
        await partitions.recover([served, configured])  # the host's start: both known now
        attempts.clear()
        host = _RecoveringHost(partitions, [served])
        participant = ControllerParticipant(host, object, cluster=None)  # type: ignore[arg-type]
        await participant.rehydrate(KeyCatalog((found,)))
        partitions.close()
        return attempts

    assert sorted(run(scenario()), key=lambda k: k.scope) == [configured, found, served]


class _Manager:
    def __init__(self, key: JobKey, rehydrated: list[JobKey]) -> None:
        self.key = key
        self.rehydrated = rehydrated

    async def rehydrate(self) -> None:
        self.rehydrated.append(self.key)


class _Storage:
    """A storage catalog that fails its first listing."""

    capabilities = StorageCapabilities(
        external_step_plans=False,
        atomic_batches=False,
        shared_across_processes=False,
        partition_catalog=True,
    )

    def __init__(self, key: JobKey) -> None:
        self.key = key
        self.calls = 0

    async def keys_with_jobs(self, statuses: Any) -> list[JobKey]:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("database is down")
        return [self.key]


class _StartingHost:
    name = "choreography:controller:me"

    def __init__(self, storage: _Storage) -> None:
        self.clock = FakeClock()
        self.provider = storage
        self.options = JobsOptions()
        self.rehydrated: list[JobKey] = []

    def manager(self, key: JobKey) -> _Manager:
        return _Manager(key, self.rehydrated)


def test_partitions_a_failed_key_source_finds_on_its_retry_are_recovered(
    run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key source that failed at the host's start is asked again after 1 s on its own, and
    the partitions it names then are rehydrated, with no membership change or sweep."""
    monkeypatch.setattr(keys, "registered_providers", list)
    partition = JobKey(scope="late")
    host = _StartingHost(_Storage(partition))

    async def scenario() -> tuple[list[JobKey], list[JobKey]]:
        recovery = ControllerRecovery(host)  # type: ignore[arg-type]
        await recovery.recover([])
        await settle()
        before = list(host.rehydrated)
        await host.clock.advance(1)
        await settle()
        recovery.close()
        return before, host.rehydrated

    before, after = run(scenario())
    assert before == [] and after == [partition]
