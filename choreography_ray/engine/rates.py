"""Rate limits per step type, kept cluster-wide in storage (a token bucket per step type).

Each rate-limited step type has one bucket record: the tokens it holds and when it was last
filled. A worker host takes tokens by compare-and-set on it, as many as it has runs of the
type waiting (at most the bucket's size), so every host draws from the one bucket and the
cluster as a whole begins at most `rate` runs a second, `burst` at once after a quiet while.
The record is a step record of a reserved job id in the default partition (no job can have
it), like a concurrency key's (docs/decisions.md).

Runs of a limited type wait here before they are queued for a slot (`RateGates.hold`): they
take no slot while they wait, so steps of other types go on. A worker with no rate-limited
step type in its process looks at no run (`jobs.rates.RATE_LIMITED`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from pydantic import BaseModel

from ..jobs.rates import RATE_LIMITED, RateLimit
from ..jobs.registry import Payload, TypeKind, TypeRegistry
from ..jobs.state import JobKey
from ..storage.protocols import JobsStorage
from .clock import Clock
from .shared_records import save_shared

if TYPE_CHECKING:
    from .run import StepRun

log = logging.getLogger("choreography_ray.engine")

RATES_JOB = "choreography/rate-limits"
"""The reserved job id whose step records are the buckets, in the default partition."""
BUCKET_RECORD_TYPE = "choreography.rate-bucket"
BUCKET_TYPE = "choreography.rate-bucket-state"
_ATTEMPTS = 5
_RETRY_SECONDS = 1.0
"""How long a gate waits after storage failed it before it asks again."""

JobRef = tuple[JobKey, str]
Release = Callable[[JobRef, list["StepRun"], bool, "float | None"], None]


class Bucket(BaseModel):
    tokens: float
    at: float
    """Seconds since the epoch, by the clock of the host that last took from it."""


class BucketRecord:
    """The step type of a bucket's record: no step of this type is ever run."""


async def take(
    storage: JobsStorage,
    registry: TypeRegistry,
    step_type: str,
    limit: RateLimit,
    want: int,
    now: float,
) -> tuple[int, float]:
    """Take up to `want` tokens of `step_type`'s bucket by compare-and-set: how many were
    taken, and when asking again may give one (seconds from now; 0 when some were taken)."""
    registry.register(BucketRecord, kind=TypeKind.STEP, name=BUCKET_RECORD_TYPE)
    registry.register(Bucket, kind=TypeKind.STATE, name=BUCKET_TYPE)
    steps = storage.steps
    size = limit.bucket
    for _ in range(_ATTEMPTS):
        record = await steps.find(RATES_JOB, step_type)
        if record is None or record.state is None:
            tokens = float(size)
        else:
            bucket = Bucket.model_validate(record.state.data)
            tokens = min(float(size), bucket.tokens + limit.rate * max(0.0, now - bucket.at))
        taken = min(want, math.floor(tokens + 1e-9))  # 0.1 + 0.2 is 0.30000000000000004
        if taken <= 0:
            return 0, (1.0 - tokens) / limit.rate
        state = Payload(type=BUCKET_TYPE, data=Bucket(tokens=tokens - taken, at=now).model_dump())
        if await save_shared(
            steps,
            record,
            record_id=step_type,
            job_id=RATES_JOB,
            record_type=BUCKET_RECORD_TYPE,
            state=state,
        ):
            return taken, 0.0
        # another host took tokens meanwhile: read again
    return 0, 0.0


class RateGates:
    """A worker's runs of rate-limited step types, each held until its type's bucket gives it
    a token, then queued (`release`) in the order they came."""

    def __init__(
        self,
        storage: Callable[[], JobsStorage],
        registry: TypeRegistry,
        clock: Clock,
        ready: Callable[[], None],
    ) -> None:
        self._storage = storage
        self._registry = registry
        self._clock = clock
        self.ready = ready
        """Called once runs were released into the queue: the worker fills its slots."""
        self.release: Release | None = None
        self._held: dict[str, deque[tuple[JobRef, StepRun, bool, float | None]]] = {}
        self._gates: dict[str, asyncio.Task[None]] = {}

    def hold(
        self, job: JobRef, runs: Iterable[StepRun], first: bool, points: float | None
    ) -> list[StepRun]:
        """Hold the runs of rate-limited types; the others, to queue now."""
        if not RATE_LIMITED:
            return list(runs)
        free: list[StepRun] = []
        for run in runs:
            limit = run.step_class.rate_limit
            if not isinstance(limit, RateLimit):
                free.append(run)
                continue
            name = run.step_class.name
            self._held.setdefault(name, deque()).append((job, run, first, points))
            gate = self._gates.get(name)
            if gate is None or gate.done():
                self._gates[name] = asyncio.get_running_loop().create_task(self._open(name, limit))
        return free

    def held(self, job: JobRef) -> int:
        return sum(1 for held in self._held.values() for ref, *_ in held if ref == job)

    def remove(self, job: JobRef, wanted: set[int]) -> list[StepRun]:
        """Take those held runs of `job` whose `id()` is in `wanted` (a stop)."""
        removed: list[StepRun] = []
        for name, held in self._held.items():
            kept = deque(
                entry for entry in held if not (entry[0] == job and id(entry[1]) in wanted)
            )
            if len(kept) != len(held):
                removed.extend(e[1] for e in held if e[0] == job and id(e[1]) in wanted)
                self._held[name] = kept
        return removed

    def clear(self) -> None:
        for gate in self._gates.values():
            gate.cancel()
        self._gates.clear()
        self._held.clear()

    async def _open(self, name: str, limit: RateLimit) -> None:
        """Release the held runs of `name` as its bucket gives tokens."""
        while self._held.get(name):
            held = self._held[name]
            try:
                taken, wait = await take(
                    self._storage(),
                    self._registry,
                    name,
                    limit,
                    len(held),
                    self._clock.now().timestamp(),
                )
            except Exception as error:  # storage failed: the runs wait, and it asks again
                log.warning("rate limit of %s: could not take tokens: %s", name, error)
                taken, wait = 0, _RETRY_SECONDS
            released = [held.popleft() for _ in range(min(taken, len(held)))]
            if released and self.release is not None:
                for job, run, first, points in released:
                    self.release(job, [run], first, points)
                self.ready()
            if wait:
                await self._clock.sleep(wait)
            elif not taken:
                await asyncio.sleep(0)  # lost every compare-and-set: let the others go on
        self._gates.pop(name, None)


__all__ = ["RATES_JOB", "Bucket", "RateGates", "take"]
