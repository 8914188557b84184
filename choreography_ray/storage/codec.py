"""Turning states into stored JSON and back, through the type registry only.

Reading is strict: a record that is not valid JSON of its model, or that names a type the
registry does not know, raises `MalformedRecordError` or `UnknownTypeError`. Listings use
`decode_*_or_skip` and `decode_steps`, which log such a record and leave it out rather than fail
the listing; the engine's loads (`decode_steps(strict=True)`) raise `UnreadableStepsError`
instead, and counts (`count_steps`) count such records apart. A plan read from plan storage
is checked for its type names; each request's data is checked as the engine loads it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ..jobs.errors import (
    MalformedRecordError,
    RecordNotFoundError,
    StorageJobError,
    StorageJobStepError,
    TypeRegistryError,
    UnknownTypeError,
    UnreadableStepsError,
)
from ..jobs.registry import Payload, TypeKind, TypeRegistry
from ..jobs.state import (
    MAX_ID_LENGTH,
    JobKey,
    JobState,
    JobStepState,
    PlannedStep,
)
from ..jobs.status import JobStepStatus
from .protocols import StepCounts, StepPart

_PLAN_CHUNK: TypeAdapter[list[PlannedStep]] = TypeAdapter(list[PlannedStep])
_STEP_SERIALIZER = JobStepState.__pydantic_serializer__

log = logging.getLogger("choreography_ray.storage")

StepRecord = tuple[str, int, "str | bytes | dict[str, Any]"]
"""A stored step as providers read it: step id, version, record."""

_UNREADABLE = (MalformedRecordError, TypeRegistryError)
"""What reading a record raises when the record, not the storage, is at fault."""


def check_id(value: Any, what: str) -> str:
    """Ids are non-empty strings of bounded length; anything else is a caller's mistake."""
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise ValueError(
            f"{what} must be a non-empty string of at most {MAX_ID_LENGTH} characters, "
            f"got {value!r}"
        )
    return value


class RecordCodec:
    """Encodes and decodes records, checking every type name against the registry."""

    def __init__(self, registry: TypeRegistry) -> None:
        self.registry = registry

    # -- jobs ---------------------------------------------------------------------------------

    def encode_job(self, state: JobState) -> str:
        return state.model_dump_json()

    def job_document(self, state: JobState) -> dict[str, Any]:
        return state.model_dump(mode="json")

    def decode_job(self, raw: str | bytes | dict[str, Any], version: int, job_id: str) -> JobState:
        try:
            if isinstance(raw, dict):
                state = JobState.model_validate({**raw, "version": version})
            else:
                state = JobState.model_validate_json(raw)
                state.version = version
        except ValidationError as error:
            raise MalformedRecordError(
                f"job {job_id!r}: stored record is malformed: {_first(error)}",
                code=StorageJobError.MALFORMED_RECORD,
            ) from error
        if not self.registry.knows(state.type, TypeKind.JOB):
            raise UnknownTypeError(
                state.type, "job", code=StorageJobError.TYPE_IS_NOT_ASSOCIATED_WITH_A_JOB_TYPE
            )
        try:
            if state.request is not None:
                self._check(state.request, TypeKind.REQUEST)
            for planned in state.plan or ():
                self.check_planned(planned)
        except MalformedRecordError as error:
            raise MalformedRecordError(
                f"job {job_id!r}: {error.message}", code=StorageJobError.MALFORMED_RECORD
            ) from error
        return state

    def decode_job_or_skip(
        self, raw: str | bytes | dict[str, Any], version: int, job_id: str
    ) -> JobState | None:
        try:
            return self.decode_job(raw, version, job_id)
        except _UNREADABLE as error:
            log.warning("skipping unreadable job record %r: %s", job_id, error)
            return None

    # -- steps --------------------------------------------------------------------------------

    def encode_step(self, state: JobStepState) -> str:
        # model_dump_json's own call, without its keywords: a microsecond less of the three
        # that encoding a step record takes, and jobs write steps by the million.
        return _STEP_SERIALIZER.to_json(state).decode()

    def step_document(self, state: JobStepState) -> dict[str, Any]:
        return state.model_dump(mode="json")

    def decode_step(
        self, raw: str | bytes | dict[str, Any], version: int, step_id: str
    ) -> JobStepState:
        try:
            if isinstance(raw, dict):
                state = JobStepState.model_validate({**raw, "version": version})
            else:
                state = JobStepState.model_validate_json(raw)
                state.version = version
        except ValidationError as error:
            raise MalformedRecordError(
                f"step {step_id!r}: stored record is malformed: {_first(error)}",
                code=StorageJobStepError.MALFORMED_RECORD,
            ) from error
        if not self.registry.knows(state.type, TypeKind.STEP):
            raise UnknownTypeError(
                state.type, "step", code=StorageJobStepError.TYPE_IS_NOT_A_JOB_STEP_STATE_TYPE
            )
        if state.state is not None:
            self._check(state.state, TypeKind.STATE)
        if state.result is not None:
            self._check(state.result, TypeKind.RESULT)
        if state.error is not None and state.error.partial_result is not None:
            self._check(state.error.partial_result, TypeKind.RESULT)
        return state

    def decode_step_or_skip(
        self, raw: str | bytes | dict[str, Any], version: int, step_id: str
    ) -> JobStepState | None:
        try:
            return self.decode_step(raw, version, step_id)
        except _UNREADABLE as error:
            log.warning("skipping unreadable step record %r: %s", step_id, error)
            return None

    def sort_steps(self, rows: Iterable[StepRecord]) -> tuple[list[JobStepState], dict[str, str]]:
        """The records of `rows` that can be read, in order, and why each other one cannot."""
        states: list[JobStepState] = []
        unreadable: dict[str, str] = {}
        for step_id, version, raw in rows:
            try:
                states.append(self.decode_step(raw, version, step_id))
            except _UNREADABLE as error:
                unreadable[step_id] = error.message
        return states, unreadable

    def step_part(self, rows: Sequence[StepRecord], take: int) -> StepPart:
        """The part `rows` (at most `take`, in step-id order) make; a full part may not be the
        last, a shorter one is."""
        steps, unreadable = self.sort_steps(rows)
        return StepPart(steps, unreadable, rows[-1][0] if len(rows) >= take else None)

    def decode_steps(
        self, job_id: str, rows: Iterable[StepRecord], *, strict: bool
    ) -> list[JobStepState]:
        """A job's step records: with `strict`, all of them or `UnreadableStepsError`; else
        the readable ones, each unreadable one logged and left out."""
        states, unreadable = self.sort_steps(rows)
        if unreadable and strict:
            raise UnreadableStepsError(job_id, unreadable)
        for step_id, why in unreadable.items():
            log.warning("skipping unreadable step record %r of job %r: %s", step_id, job_id, why)
        return states

    def count_steps(self, rows: Iterable[StepRecord]) -> StepCounts:
        """The records of `rows` per status, the unreadable ones counted apart.

        Each record is read and let go: counting a million steps never holds them decoded."""
        counts = StepCounts(unreadable=0)
        for step_id, version, raw in rows:
            try:
                status = self.decode_step(raw, version, step_id).status
            except _UNREADABLE:
                counts.unreadable += 1
                continue
            counts[status] = counts.get(status, 0) + 1
        return counts

    @staticmethod
    def count_statuses(rows: Iterable[tuple[int, int]]) -> StepCounts:
        """Counts from `(status, count)` rows, as a provider groups its step rows by the
        status it keeps beside each record; a status no release defines is unreadable."""
        counts = StepCounts(unreadable=0, verified=False)
        for status, n in rows:
            try:
                known = JobStepStatus(status)
            except ValueError:
                counts.unreadable += n
                continue
            counts[known] = counts.get(known, 0) + n
        return counts

    # -- plans --------------------------------------------------------------------------------

    def encode_planned(self, planned: PlannedStep) -> str:
        return planned.model_dump_json()

    def decode_planned(self, raw: str | bytes | dict[str, Any]) -> PlannedStep:
        try:
            planned = (
                PlannedStep.model_validate(raw)
                if isinstance(raw, dict)
                else PlannedStep.model_validate_json(raw)
            )
        except ValidationError as error:
            raise MalformedRecordError(
                f"stored plan entry is malformed: {_first(error)}"
            ) from error
        self.check_plan_types([planned])
        return planned

    def encode_plan_chunk(self, steps: Sequence[PlannedStep]) -> str:
        """Consecutive entries of a plan as one JSON array (SQL stores plans in chunks)."""
        return _PLAN_CHUNK.dump_json(list(steps)).decode()

    def decode_plan_chunk(self, raw: str | bytes) -> list[PlannedStep]:
        try:
            chunk = _PLAN_CHUNK.validate_json(raw)
        except ValidationError as error:
            raise MalformedRecordError(
                f"stored plan entry is malformed: {_first(error)}"
            ) from error
        self.check_plan_types(chunk)
        return chunk

    def check_plan_types(self, entries: Iterable[PlannedStep]) -> None:
        """Raise `UnknownTypeError` unless each entry of a plan read from plan storage names a
        registered step type and request type; each distinct pair is looked up once.

        A request's data is checked by whoever loads it: the engine prepares every step
        through `TypeRegistry.load`, and a request that does not fit its class fails the start
        naming the step. Checking it here as well validated every request twice, and a
        recovery reads the plan twice (to index it, then to prepare its steps)."""
        known: set[tuple[str, str]] = set()
        for planned in entries:
            pair = (planned.step_type, planned.request.type)
            if pair in known:
                continue
            if not self.registry.knows(pair[0], TypeKind.STEP):
                raise UnknownTypeError(pair[0], "step")
            if not self.registry.knows(pair[1], TypeKind.REQUEST):
                raise UnknownTypeError(pair[1], "request")
            known.add(pair)

    def check_planned(self, planned: PlannedStep) -> None:
        """An entry of an inline plan (the job record's): its types and its request's data."""
        if not self.registry.knows(planned.step_type, TypeKind.STEP):
            raise UnknownTypeError(planned.step_type, "step")
        self._check(planned.request, TypeKind.REQUEST)

    def _check(self, payload: Payload, kind: TypeKind) -> None:
        self.registry.check(payload, kind)


def not_found_job(job_id: str, key: JobKey) -> RecordNotFoundError:
    return RecordNotFoundError(
        f"no job {job_id!r} in scope {key.scope!r}, namespace {key.namespace!r}",
        code=StorageJobError.NOT_FOUND,
    )


def not_found_step(job_id: str, step_id: str, key: JobKey) -> RecordNotFoundError:
    return RecordNotFoundError(
        f"no step {step_id!r} of job {job_id!r} in scope {key.scope!r}, "
        f"namespace {key.namespace!r}",
        code=StorageJobStepError.NOT_FOUND,
    )


class JobLookup:
    """`get` for a provider's job storage: its `find`, or the not-found error all raise alike."""

    key: JobKey

    async def find(self, job_id: str) -> JobState | None:
        raise NotImplementedError

    async def get(self, job_id: str) -> JobState:
        state = await self.find(job_id)
        if state is None:
            raise not_found_job(job_id, self.key)
        return state


class StepLookup:
    """`get` for a provider's step storage: its `find`, or the not-found error all raise alike."""

    key: JobKey

    async def find(self, job_id: str, step_id: str) -> JobStepState | None:
        raise NotImplementedError

    async def get(self, job_id: str, step_id: str) -> JobStepState:
        state = await self.find(job_id, step_id)
        if state is None:
            raise not_found_step(job_id, step_id, self.key)
        return state


def check_job_key(state: JobState, key: JobKey) -> None:
    if state.key != key:
        raise ValueError(
            f"job {state.id!r} belongs to {state.key}, not to {key}: a storage partition only "
            "writes its own jobs"
        )


def check_batch(states: Sequence[JobStepState]) -> list[tuple[str, str]]:
    """The (job id, step id) of every record of a batch, each checked and appearing once."""
    pairs = []
    for state in states:
        check_id(state.job_id, "job id")
        check_id(state.id, "step id")
        pairs.append((state.job_id, state.id))
    check_unique(pairs)
    return pairs


def check_unique(ids: list[tuple[str, str]]) -> None:
    if len(set(ids)) != len(ids):
        seen: set[tuple[str, str]] = set()
        for pair in ids:
            if pair in seen:
                raise ValueError(f"step {pair[1]!r} of job {pair[0]!r} appears twice in one batch")
            seen.add(pair)


def _first(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "record"
    return f"{where}: {first.get('msg', 'invalid')}"
