"""Planning: turning `prepare_steps` into a saved plan, and checking it before anything runs.

Every request must survive the trip through JSON unchanged, because recovery prepares steps
from the saved JSON, never from the objects `prepare_steps` returned; `TypeRegistry.dump_request`
checks that on the JSON text storage writes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter

from ..jobs.errors import ChoreographyError
from ..jobs.job import StepDetails
from ..jobs.registry import TypeKind, TypeRegistry, trusted_sharing
from ..jobs.state import PlannedStep
from .packed_ids import PlannedIds


@dataclass(frozen=True)
class InvalidPlan(Exception):
    reason: str


PLAN_CHUNK = 10_000
"""Steps checked and turned into plan entries at a time: what `prepare_steps` returned for
them is let go before the next chunk, so a plan of a million steps never exists twice."""

ORIGINALS_KEPT = 100_000
"""Up to this many steps, a clean start prepares each step from the request `prepare_steps`
returned rather than reading it back from the plan's JSON (it saves about 3 µs a step). A
larger plan lets the requests go once planned: a million of them hold about 450 MB."""


@dataclass(frozen=True)
class StoredPlan:
    """A plan too large to hold whole: saved a part at a time as it was built, and read back
    from plan storage a part at a time to prepare its steps."""

    incarnation: int


Plan = list[PlannedStep] | StoredPlan
"""A job's plan as its start or recovery prepares it: held whole, or in plan storage."""


def plan_parts(
    details: Iterable[Any], registry: TypeRegistry, originals: dict[str, BaseModel] | None = None
) -> Iterator[list[PlannedStep]]:
    """The plan of `details`, checked, `PLAN_CHUNK` entries at a time; raises `InvalidPlan`
    with a reason a person can act on when it reaches the entry at fault.

    Requests are written and checked in batches per class (`TypeRegistry.dump_requests`):
    a plan of 100,000 steps is checked in a few calls rather than 100,000 round trips.
    `details` is what `prepare_steps` returned (a list, or any iterable: a generator is drawn
    a chunk at a time), each entry checked to be a `StepDetails`. It is consumed: a list's
    entries are cleared chunk by chunk once planned, so what the steps were planned from never
    exists beside the plan. `originals`, when given, gets each step's request by step id
    for plans of up to `ORIGINALS_KEPT` steps; a longer plan leaves it empty."""
    seen = PlannedIds()
    names: dict[type, str] = {}  # a plan of thousands of steps has a handful of step types
    fields = {"step_id", "stage", "step_type", "name", "request"}
    entries = _consumed(details)
    index = 0
    while True:
        checked: list[tuple[StepDetails, str]] = []
        for detail in itertools.islice(entries, PLAN_CHUNK):
            if not isinstance(detail, StepDetails):
                raise InvalidPlan(
                    f"prepare_steps returned {type(detail).__qualname__} at position {index}; "
                    "build steps with create_step"
                )
            index += 1
            step_name = names.get(detail.step_type)
            if step_name is None:
                try:
                    step_name = registry.name_of(detail.step_type)
                    registry.resolve(step_name, TypeKind.STEP)
                except ChoreographyError as error:
                    raise InvalidPlan(f"step {detail.step_id!r}: {error.message}") from error
                names[detail.step_type] = step_name
            checked.append((detail, step_name))
        if not checked:
            return
        twice = seen.add_all([detail.step_id for detail, _ in checked])
        if twice is not None:
            raise InvalidPlan(f"step id {twice!r} is planned twice")
        try:
            payloads = registry.dump_requests([detail.request for detail, _ in checked])
        except ChoreographyError:
            for detail, _ in checked:  # which step: the first whose request fails alone
                try:
                    registry.dump_request(detail.request)
                except ChoreographyError as error:
                    raise InvalidPlan(f"step {detail.step_id!r}: {error.message}") from error
            raise
        if originals is not None:
            if index <= ORIGINALS_KEPT:
                originals.update((detail.step_id, detail.request) for detail, _ in checked)
            else:
                originals.clear()
                originals = None
        yield [
            trusted_sharing(
                PlannedStep,
                fields,
                {
                    "step_id": detail.step_id,
                    "stage": detail.stage,
                    "step_type": step_name,
                    "name": detail.name,
                    "request": payload,
                },
            )
            for (detail, step_name), payload in zip(checked, payloads, strict=True)
        ]
        del checked, payloads


def draw(parts: Iterator[list[PlannedStep]], at_most: int) -> tuple[list[PlannedStep], bool]:
    """The plan's first parts, until they hold more than `at_most` entries or the plan ends;
    and whether parts may remain (then the plan is saved and prepared a part at a time)."""
    plan: list[PlannedStep] = []
    for part in parts:
        plan.extend(part)
        if len(plan) > at_most:
            return plan, True
    return plan, False


def _consumed(details: Iterable[Any]) -> Iterator[Any]:
    """The entries of `details`, a list's each cleared as it is handed out."""
    if not isinstance(details, list):
        yield from details
        return
    for index in range(len(details)):
        detail, details[index] = details[index], None
        yield detail


_PLAN_JSON = TypeAdapter(list[PlannedStep])
_SIZE_CHUNK = 256
"""Entries written at a time to weigh a plan: one call of pydantic's serializer per chunk."""


def _entry_sizes(plan: list[PlannedStep]) -> Iterator[int]:
    """Characters of the plan's entries in JSON, each with its separator, a chunk at a time.
    A chunk's array is its entries, a comma between each two and the two brackets."""
    for start in range(0, len(plan), _SIZE_CHUNK):
        yield len(_PLAN_JSON.dump_json(plan[start : start + _SIZE_CHUNK]).decode()) - 1


def plan_exceeds(plan: list[PlannedStep], limit: int) -> bool:
    """Whether the plan's JSON is longer than `limit` characters (bytes, for ASCII), reading
    only as far as it must: whether a plan of a million steps stays inline costs a few
    thousand entries."""
    size = 2
    for chunk in _entry_sizes(plan):
        size += chunk
        if size > limit:
            return True
    return False


def plan_size(plan: list[PlannedStep]) -> int:
    """Characters of the plan's JSON: what deciding inline against external storage weighs."""
    return sum(_entry_sizes(plan)) + 2
