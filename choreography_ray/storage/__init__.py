"""Storage of jobs, steps and plans: protocols and providers chosen by URL.

provider = open_storage("sqlite:///.choreography/jobs.db")
await provider.initialize()
storage = provider.for_key(scope="studio", namespace="tenant-a")
job = await storage.jobs.get(job_id)
"""

from .job_order import JobOrder
from .protocols import (
    JobQuery,
    JobsStorage,
    JobStepStorage,
    JobStorage,
    StepCounts,
    StepPlanStorage,
    StorageCapabilities,
)
from .provider import StorageProvider, ThreadedProvider
from .schemes import PROVIDERS, ProviderRegistry, open_storage
from .step_query import StepCursor, StepOrder, StepPage, StepQuery
from .url import StorageURL, redact

__all__ = [
    "PROVIDERS",
    "JobOrder",
    "JobQuery",
    "JobStepStorage",
    "JobStorage",
    "JobsStorage",
    "ProviderRegistry",
    "StepCounts",
    "StepCursor",
    "StepOrder",
    "StepPage",
    "StepPlanStorage",
    "StepQuery",
    "StorageCapabilities",
    "StorageProvider",
    "StorageURL",
    "ThreadedProvider",
    "open_storage",
    "redact",
]
