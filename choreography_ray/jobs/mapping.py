"""A step function over many items as one durable job: what `jobs.map(fn, items)` starts.

The caller's items are drawn a chunk at a time, each checked to survive the trip through JSON
(as every planned request is) and written as one JSON array, and let go: a generator of a
million items never exists as a list, nor beside its JSON. The chunks travel with the start to
the job's host, which plans one step per item from them, a chunk at a time, and saves that
plan before any step runs, as for any job. The job's record keeps a small request (the step's
name and the count), never the items.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import from_json, to_json

from .errors import ChoreographyError, InvalidRequestError, StartJobError, StartJobFailed
from .functions import StepFunction
from .job import Job, StepDetails, new_step_id, planned_step
from .registry import TypeKind, TypeRegistry, list_adapter, round_trip

ITEM_CHUNK = 10_000
"""Items drawn, checked and written as JSON at a time."""


class MapRequest(BaseModel):
    """What a map job's record keeps of its start: the step, how many items, a name."""

    step: str
    """The registered name of the step function."""
    items: int
    name: str = ""


class MapJob(Job[MapRequest], name="choreography.map"):
    """One step of a step function per item; its steps come with its start (`jobs.map`)."""

    keep_after_completed = True
    """A map's results are what it is for: they stay until the job is removed."""

    def prepare_steps(self, request: MapRequest) -> list[StepDetails]:
        raise ChoreographyError(
            "a map job's steps come with its start: use jobs.map(fn, items), not jobs.start"
        )

    def details(self, request: MapRequest) -> str:
        return request.name or f"map {request.step} over {request.items:,} items"


@dataclass(frozen=True)
class ItemChunk:
    """Consecutive items as one JSON array, with their stages (None: all in stage 0)."""

    first: int
    """The index of the first item."""
    items: bytes
    stages: tuple[int, ...] | None = None


@dataclass
class MapItems:
    """A map job's items as checked JSON, in chunks: what its start carries to its host."""

    step: str
    """The step function's registered name."""
    count: int = 0
    chunks: list[ItemChunk] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        function: StepFunction[Any],
        items: Iterable[Any],
        registry: TypeRegistry,
        stages: Callable[[Any], int] | None = None,
    ) -> MapItems:
        """Draw `items` a chunk at a time and keep each chunk as JSON only. An item that would
        not read back as given is refused (`StartJobFailed`, INVALID_STEP_PLAN), naming its
        index, before anything is sent or stored."""
        if not isinstance(function, StepFunction):
            raise TypeError(
                f"jobs.map takes a @step function, got {function!r}: decorate it with "
                "@cr.step, so every node registers it when it imports its module"
            )
        if isinstance(items, str | bytes | BaseModel | dict):
            raise TypeError(
                f"jobs.map takes an iterable of items, got a {type(items).__qualname__}"
            )
        mapped = cls(step=function.name)
        source = iter(items)
        while True:
            chunk = list(itertools.islice(source, ITEM_CHUNK))
            if not chunk:
                return mapped
            first = mapped.count
            mapped.chunks.append(
                ItemChunk(
                    first=first,
                    items=_checked_json(function, chunk, first, registry),
                    stages=_stages(stages, chunk, first),
                )
            )
            mapped.count += len(chunk)

    def details(self, registry: TypeRegistry) -> Iterator[StepDetails]:
        """One step per item, in item order; each chunk is let go as it is read."""
        step_type = registry.resolve(self.step, TypeKind.STEP)
        function: StepFunction[Any] | None = getattr(step_type, "function", None)
        if not isinstance(function, StepFunction):
            raise InvalidRequestError(f"step type {self.step!r} is not a step function")
        adapter = list_adapter(function.item_type)
        while self.chunks:
            chunk = self.chunks.pop(0)
            try:
                values = adapter.validate_python(from_json(chunk.items, allow_inf_nan=False))
            except (ValueError, ValidationError) as error:
                raise InvalidRequestError(
                    f"the items from {chunk.first} on do not fit step {self.step!r}: {error}"
                ) from None
            stages = chunk.stages or itertools.repeat(0)
            for offset, (value, stage) in enumerate(zip(values, stages, strict=False)):
                yield planned_step(
                    new_step_id(),
                    step_type,
                    function.stored(value),
                    stage,
                    f"item {chunk.first + offset}",
                )


def _checked_json(
    function: StepFunction[Any], chunk: list[Any], first: int, registry: TypeRegistry
) -> bytes:
    """The chunk's items as one JSON array, checked as every planned request is: validated
    into the item's type and read back from their JSON, the whole chunk in a few calls."""
    model = function.item_model
    own_dump = model.model_dump is not BaseModel.model_dump
    if not own_dump:  # a model with its own model_dump is checked the one-by-one way
        adapter = list_adapter(function.item_type)
        try:
            checked = round_trip(adapter, adapter.validate_python(chunk))
        except ValidationError:
            checked = None
        if checked is not None:
            return checked[1]
    data: list[Any] = []
    for offset, item in enumerate(chunk):  # which item: the first that fails alone
        try:
            data.append(registry.dump_request(function.item(item)).data)
        except ChoreographyError as error:
            raise StartJobFailed(
                f"item {first + offset} cannot be planned: {error.message}",
                code=StartJobError.INVALID_STEP_PLAN,
            ) from None
    return to_json(data)


def _stages(
    stage_of: Callable[[Any], int] | None, chunk: list[Any], first: int
) -> tuple[int, ...] | None:
    if stage_of is None:
        return None
    stages = tuple(stage_of(item) for item in chunk)
    for offset, stage in enumerate(stages):
        if not isinstance(stage, int) or isinstance(stage, bool) or stage < 0:
            raise StartJobFailed(
                f"item {first + offset}: its stage must be a whole number >= 0, got {stage!r}",
                code=StartJobError.INVALID_STEP_PLAN,
            )
    return stages if any(stages) else None


def check_window(max_active_steps: int | None) -> int | None:
    """A map job's `max_active_steps`: None, or a whole number >= 1."""
    if max_active_steps is None:
        return None
    if (
        isinstance(max_active_steps, bool)
        or not isinstance(max_active_steps, int)
        or max_active_steps < 1
    ):
        raise ValueError(f"max_active_steps must be a whole number >= 1, got {max_active_steps!r}")
    return max_active_steps
