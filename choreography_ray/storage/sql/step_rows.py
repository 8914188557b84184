"""How step records bind to the SQL statements that write them (`Statements`' parameter order)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...jobs.state import JobStepState
from ..step_query import changed_micros

Rows = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]
"""A batch's inserts and updates, each record's values in its statement's order."""


def step_rows(
    scope: str, namespace: str, encode: Callable[[JobStepState], str], states: list[JobStepState]
) -> Rows:
    """The batch's new records (`insert_step`) and changed ones (`update_step`), each encoded
    once: a write made again (the SQLite lock was taken) binds the same rows."""
    inserts: list[tuple[Any, ...]] = []
    updates: list[tuple[Any, ...]] = []
    for state in states:
        document = encode(state)
        changed = changed_micros(state)
        if state.version == 0:
            inserts.append(
                (
                    scope,
                    namespace,
                    state.job_id,
                    state.id,
                    state.type,
                    state.name,
                    state.stage,
                    int(state.status),
                    state.position,
                    changed,
                    document,
                )
            )
        else:
            updates.append(
                (
                    state.type,
                    state.name,
                    state.stage,
                    int(state.status),
                    state.position,
                    changed,
                    state.version + 1,
                    document,
                    scope,
                    namespace,
                    state.job_id,
                    state.id,
                    state.version,
                )
            )
    return inserts, updates


def record_only(full: tuple[Any, ...]) -> tuple[Any, ...]:
    """The parameters of `update_step_record` from those of `update_step`."""
    (type_, name, stage, status, position, changed, version, document) = full[:8]
    scope, namespace, job_id, step_id, read = full[8:]
    keys = (scope, namespace, job_id, step_id, read)
    return (name, version, document, *keys, status, type_, stage, position, changed)
