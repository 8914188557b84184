"""Step-level concurrency keys, kept cluster-wide in storage: at most `max_running` runs of
one step type and key perform at once, on every worker host together.

Each (step type, key) has one record, the places taken: which run holds each, on which worker
host, and until when (a lease). A worker host takes and gives back places by compare-and-set
on it, as the rate limits' buckets are kept (`engine.rates`), so two hosts can never both take
the last place. The record is a step record of a reserved job id in the default partition (no
job can have it), like a bucket's.

A place is held by a host, not by storage's idea of the step: a host renews its places every
third of `step_key_lease` (`renew`), and a place whose lease ran out is dropped by the next
host that needs one. So a host that dies gives its places back within the lease, and a host
that lives never loses one it renews. The worker's side (who waits, who asks, in which order)
is `step_key_gates.StepKeyGates`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, Field

from ..jobs.registry import Payload, TypeKind, TypeRegistry
from ..jobs.state import MAX_ID_LENGTH
from ..storage.protocols import JobsStorage
from .shared_records import save_shared

STEP_KEYS_JOB = "choreography/step-keys"
"""The reserved job id whose step records are the keys' places, in the default partition."""
PLACES_RECORD_TYPE = "choreography.step-key"
PLACES_TYPE = "choreography.step-key-places"
_ATTEMPTS = 5
"""Compare-and-set attempts of one change before the caller asks again later."""

T = TypeVar("T")


@dataclass(slots=True)
class StepPlace:
    """Which place a run needs (`StepRun.place`): its key's record, the key, the limit, the
    run's name in the record, and whether it holds it."""

    record: str
    key: str
    limit: int
    holder: str
    held: bool = False


class Place(BaseModel):
    run: str
    """The run that holds it: partition, job id and step id."""
    host: str
    """The worker host (its name and activation) that took it, and renews it."""
    expires: float
    """Seconds since the epoch, by the clock of the host that took or renewed it."""


class Places(BaseModel):
    """A key's record: its places taken, in the order they were."""

    places: list[Place] = Field(default_factory=list)


class PlacesRecord:
    """The step type of a key's record: no step of this type is ever run."""


def record_id(step_type: str, key: str) -> str:
    """The record of `key` of `step_type`: readable while it fits an id, else a digest."""
    text = f"{step_type}:{key}"
    if len(text) <= MAX_ID_LENGTH:
        return text
    return f"{step_type[:100]}:{hashlib.sha256(text.encode()).hexdigest()}"


async def _change(
    storage: JobsStorage,
    registry: TypeRegistry,
    record: str,
    change: Callable[[list[Place]], tuple[list[Place] | None, T]],
    conflict: T,
) -> T:
    """Read the record, `change` its places (None: nothing to write), write by
    compare-and-set; again on a conflict, up to `_ATTEMPTS`, then `conflict`."""
    registry.register(PlacesRecord, kind=TypeKind.STEP, name=PLACES_RECORD_TYPE)
    registry.register(Places, kind=TypeKind.STATE, name=PLACES_TYPE)
    steps = storage.steps
    for _ in range(_ATTEMPTS):
        stored = await steps.find(STEP_KEYS_JOB, record)
        places = (
            Places.model_validate(stored.state.data).places
            if stored is not None and stored.state is not None
            else []
        )
        changed, answer = change(places)
        if changed is None:
            return answer
        payload = Payload(type=PLACES_TYPE, data=Places(places=changed).model_dump(mode="json"))
        if await save_shared(
            steps,
            stored,
            record_id=record,
            job_id=STEP_KEYS_JOB,
            record_type=PLACES_RECORD_TYPE,
            state=payload,
        ):
            return answer
        # another host took or gave back meanwhile: read again
    return conflict


async def take(
    storage: JobsStorage,
    registry: TypeRegistry,
    record: str,
    *,
    limit: int,
    host: str,
    runs: list[str],
    now: float,
    lease: float,
) -> list[str]:
    """Take places for as many of `runs` (in their order) as the limit leaves free, dropping
    places whose lease ran out: the runs that got one. The host's other places are renewed
    in the same write."""

    def change(places: list[Place]) -> tuple[list[Place] | None, list[str]]:
        live = [place for place in places if place.expires > now]
        held = {place.run for place in live}
        wanted = [run for run in runs if run not in held]
        granted = wanted[: max(0, limit - len(live))]
        if not granted and len(live) == len(places):
            return None, []
        expires = now + lease
        kept = [
            place.model_copy(update={"expires": expires}) if place.host == host else place
            for place in live
        ]
        return [*kept, *(Place(run=run, host=host, expires=expires) for run in granted)], granted

    return await _change(storage, registry, record, change, [])


async def give_back(
    storage: JobsStorage, registry: TypeRegistry, record: str, *, host: str, runs: Collection[str]
) -> bool:
    """Give back the places `runs` of `host` hold; False when the record kept changing."""

    def change(places: list[Place]) -> tuple[list[Place] | None, bool]:
        kept = [p for p in places if not (p.host == host and p.run in runs)]
        return (kept if len(kept) != len(places) else None), True

    return await _change(storage, registry, record, change, False)


async def renew(
    storage: JobsStorage,
    registry: TypeRegistry,
    record: str,
    *,
    host: str,
    holding: Collection[str],
    now: float,
    lease: float,
) -> bool:
    """Renew the places of `host` whose runs it still holds (`holding`) and give back the
    others it has there; False when the record kept changing."""

    def change(places: list[Place]) -> tuple[list[Place] | None, bool]:
        expires = now + lease
        kept = [
            place.model_copy(update={"expires": expires}) if place.host == host else place
            for place in places
            if place.host != host or place.run in holding
        ]
        return kept, True

    return await _change(storage, registry, record, change, False)


async def holders(storage: JobsStorage, registry: TypeRegistry, record: str) -> list[Place]:
    """The places of a key's record as stored (what the tests read)."""
    registry.register(Places, kind=TypeKind.STATE, name=PLACES_TYPE)
    stored = await storage.steps.find(STEP_KEYS_JOB, record)
    if stored is None or stored.state is None:
        return []
    return Places.model_validate(stored.state.data).places


__all__ = [
    "STEP_KEYS_JOB",
    "Place",
    "Places",
    "StepPlace",
    "give_back",
    "holders",
    "record_id",
    "renew",
    "take",
]
