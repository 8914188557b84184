"""The hosts' testing hook and the lost-acknowledgement fault it loads on a real cluster: off
unless named, a clear error for a name that cannot be used, and a Running write that lands but
answers as failed while the fault lasts."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from choreography_ray.jobs import JobKey, JobState, JobStatus
from choreography_ray.jobs.errors import ConfigurationError, StorageUnavailableError
from choreography_ray.storage import open_storage
from choreography_ray.testing.faults import LOST_ACKS_ENV, LOST_ACKS_WRAPPER, LostAcks
from choreography_ray.testing.hooks import STORAGE_WRAPPER_ENV, hooked_storage
from choreography_ray.testing.side_effects import RecordRuns


def _job(status: JobStatus, version: int = 0) -> JobState:
    return JobState(
        id="j1",
        key=JobKey(),
        type=RecordRuns.name,
        status=status,
        created=datetime.now(UTC),
        version=version,
    )


def test_without_the_variable_a_host_uses_its_storage_as_it_is(monkeypatch) -> None:
    monkeypatch.delenv(STORAGE_WRAPPER_ENV, raising=False)

    def for_key(key: JobKey) -> str:
        return f"storage of {key}"

    assert hooked_storage(for_key, "host") is for_key  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("not a callable name", "module:callable"),
        ("no_such_module_here:wrap", "ModuleNotFoundError"),
        ("choreography_ray.testing.faults:no_such_wrapper", "AttributeError"),
        ("choreography_ray.testing.faults:LOST_ACKS_ENV", "is not callable"),
    ],
)
def test_a_name_that_cannot_be_used_fails_naming_the_variable(monkeypatch, name, said) -> None:
    monkeypatch.setenv(STORAGE_WRAPPER_ENV, name)
    with pytest.raises(ConfigurationError, match=STORAGE_WRAPPER_ENV) as error:
        hooked_storage(lambda key: None, "host")  # type: ignore[arg-type,return-value]
    assert said in str(error.value)


def test_the_named_wrapper_loses_running_acknowledgements_while_the_fault_lasts(
    monkeypatch, tmp_path
) -> None:
    acks = LostAcks(tmp_path / "acks.db")
    monkeypatch.setenv(STORAGE_WRAPPER_ENV, LOST_ACKS_WRAPPER)
    monkeypatch.setenv(LOST_ACKS_ENV, str(acks.path))

    async def scenario() -> tuple[JobStatus, JobStatus]:
        async with open_storage("memory://hooks-test") as provider:
            partition = hooked_storage(provider.for_key, "host")
            storage = partition(JobKey())
            version = await storage.jobs.save(_job(JobStatus.PREPARING_STEPS))  # answered
            acks.lose("j1")
            with pytest.raises(StorageUnavailableError, match="acknowledgement"):
                await storage.jobs.save(_job(JobStatus.RUNNING, version))
            stored = await provider.for_key(JobKey()).jobs.get("j1")
            acks.restore("j1")
            await storage.jobs.save(_job(JobStatus.RUNNING, stored.version))  # answered again
            return stored.status, (await storage.jobs.get("j1")).status

    landed, status = asyncio.run(scenario())
    assert landed == JobStatus.RUNNING  # the write landed; only its answer was lost
    assert status == JobStatus.RUNNING
    assert len(acks.lost("j1")) == 1
