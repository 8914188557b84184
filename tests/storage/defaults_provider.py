"""A provider of the user's own that leaves both recovery reads to the base's defaults.

It keeps its records as memory storage does, but its job storage subclasses `JobStorage`
without writing `get_jobs_excluding_finalized_stops`, its step storage subclasses
`JobStepStorage` without writing `query` and `count`, and the provider writes no
`keys_with_jobs` and claims no partition catalog: what a custom provider that predates those
methods looks like.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from choreography_ray.jobs import JobKey
from choreography_ray.storage import (
    JobsStorage,
    JobStepStorage,
    JobStorage,
    StorageCapabilities,
    StorageProvider,
)
from choreography_ray.storage.memory import MemoryJobStepStorage, MemoryJobStorage, MemoryStorage


class DefaultsJobStorage(MemoryJobStorage, JobStorage):
    get_jobs_excluding_finalized_stops = JobStorage.get_jobs_excluding_finalized_stops


class DefaultsJobStepStorage(MemoryJobStepStorage, JobStepStorage):
    query = JobStepStorage.query
    count = JobStepStorage.count


class DefaultsStorage(MemoryStorage):
    capabilities: ClassVar[StorageCapabilities] = replace(
        MemoryStorage.capabilities, partition_catalog=False
    )
    keys_with_jobs = StorageProvider.keys_with_jobs

    def _open_partition(self, key: JobKey) -> JobsStorage:
        opened = super()._open_partition(key)
        partition, lock = self.store.partition(key), self.store.lock
        jobs = DefaultsJobStorage(key, partition, lock, self.codec)
        steps = DefaultsJobStepStorage(key, partition, lock, self.codec)
        return replace(opened, jobs=jobs, steps=steps)
