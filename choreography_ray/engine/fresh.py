"""Records a job's activation just prepared and stored, kept for the steps' first starts.

A step's first start carries its record, so the worker builds it instead of reading it back
(`StepStart.prepared`). Kept whole, as the tuple a start carries, a record held about 500
bytes (its id, its state's data as Python objects, the tuple and a dict entry): a job of a
million steps kept only its first 100,000, and its worker hosts read back the other 900,000.
So past the first `WHOLE_LIMIT` records, a record the ledger can describe is kept as its
state's data in JSON, about 60 bytes, at the step's place in the plan: its type, name and
stage are the ledger's, its version is 1 (it was just inserted) and its state's type is the one
its step type's records share. That holds when the plan's step ids are the engine's own,
ordered by time, so that a step's place in the ledger's index is its place in the plan
(checked for each record as it is kept). The first records stay whole: a tuple costs less CPU
to keep and to take than JSON, and a job of up to `WHOLE_LIMIT` steps pays nothing more.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from pydantic_core import PydanticSerializationError, from_json, to_json

from ..jobs.state import JobStepState
from .messages import Prepared
from .step_index import StepIndex
from .step_types import StepTypes

WHOLE_LIMIT = 100_000
"""Records kept whole: about 50 MB at most."""
DATA_BYTES = 128 * 1024 * 1024
"""The most memory the states' JSON takes at once, each with its object and its list slot. A
small state (the benchmark's `{"n": 123456}`) takes about 55 bytes, so a job of two million
such steps carries them all; past the budget, the worker reads the records back."""
_HELD = sys.getsizeof(b"") + 8
"""What a kept state takes besides its JSON: the bytes object's header and its list slot."""


class FreshRecords:
    """The records prepared in this activation and not started yet, each taken once."""

    def __init__(self) -> None:
        self._whole: dict[str, Prepared] = {}
        self._data: list[bytes | None] = []
        """Each kept state's JSON at its step's place in the plan (and in the index)."""
        self._epoch = -1
        """The index's epoch when the states were kept: if it changed, the places may have
        moved, and the states are let go."""
        self._state_types: dict[str, str] = {}
        """The state type the records of each step type share."""
        self._bytes = 0

    def keep(
        self,
        records: list[JobStepState],
        versions: list[int],
        index: StepIndex,
        names: Mapping[str, str],
        types: StepTypes,
    ) -> None:
        """Keep `records`, stored at `versions`, for their first starts: whole up to
        `WHOLE_LIMIT`, then a record at its place in the plan in `index`, described there as it
        is, by its state's JSON there (any other is read back by its worker)."""
        epoch = index.epoch
        if epoch != self._epoch:
            self._let_go_states()  # kept under other places: they may have moved
            self._epoch = epoch
        whole = self._whole
        kept = min(len(records), max(0, WHOLE_LIMIT - len(whole)))
        for step, version in zip(records[:kept], versions, strict=False):
            state = step.state  # quicker to keep and to take than JSON, and in any plan
            assert state is not None
            described = (step.type, step.name, step.stage, state.type, state.data)
            whole[step.id] = (*described, version, step.position)
        rest = records[kept:]
        if rest and self._placed(rest, index):
            self._keep_states(rest, versions[kept:], index, names, types)

    @staticmethod
    def _placed(records: list[JobStepState], index: StepIndex) -> bool:
        """Whether the records lie at their places in the plan in `index`, one after another."""
        first = records[0].position
        if [step.position for step in records] != list(range(first, first + len(records))):
            return False
        return index.holds_run(first, [step.id for step in records])

    def _keep_states(
        self,
        records: list[JobStepState],
        versions: list[int],
        index: StepIndex,
        names: Mapping[str, str],
        types: StepTypes,
    ) -> None:
        """Keep the states' JSON of the records the ledger describes as they are."""
        data, state_types = self._data, self._state_types
        for step, version in zip(records, versions, strict=True):
            state = step.state
            assert state is not None
            at = step.position
            if at < len(data) and (earlier := data[at]) is not None:
                data[at] = None  # kept before (never so far): the new record or none at all
                self._bytes -= len(earlier) + _HELD
            if (
                version == 1
                and (index.stage_at(at) or 0) == step.stage
                and types.of(step.id) == step.type
                and names.get(step.id, "") == step.name
                and state_types.setdefault(step.type, state.type) == state.type
                and (written := _json(state.data)) is not None
                and self._bytes + len(written) + _HELD <= DATA_BYTES
            ):
                if len(data) <= at:
                    data.extend([None] * (at + 1 - len(data)))
                data[at] = written
                self._bytes += len(written) + _HELD

    def take(
        self,
        step_id: str,
        at: int,
        stage: int,
        index: StepIndex,
        types: StepTypes,
        names: Mapping[str, str],
    ) -> Prepared | None:
        """The record of the step at place `at` of `index`, of `stage` there, if it is kept;
        it is then let go (only a step's first start carries it)."""
        if self._whole and (whole := self._whole.pop(step_id, None)) is not None:
            return whole
        data = self._data
        if not 0 <= at < len(data) or (written := data[at]) is None:
            return None  # not kept (or not indexed: -1)
        if index.epoch != self._epoch:
            self._let_go_states()  # the places moved: none of them can be trusted
            return None
        if not index.holds_at(at, step_id):
            return None  # `at` is not this step's place (a stale hint): never another's state
        data[at] = None
        self._bytes -= len(written) + _HELD
        try:
            state_data = from_json(written)
        except ValueError:  # deeper than the parser goes: the worker reads the record back
            return None
        step_type = types.of(step_id)
        state_type = self._state_types[step_type]
        return (step_type, names.get(step_id, ""), stage, state_type, state_data, 1, at)

    def clear(self) -> None:
        self._whole.clear()
        self._let_go_states()

    def _let_go_states(self) -> None:
        self._data = []
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._whole) + sum(1 for written in self._data if written is not None)


def _json(data: Any) -> bytes | None:
    """The state's data as JSON text, None if it cannot be written (then read back)."""
    try:
        return to_json(data)
    except (PydanticSerializationError, ValueError):
        return None
