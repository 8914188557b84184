"""Which of a step record's unanswered writes storage holds: a write can land while its answer
is lost (the connection dropped between the commit and its reply), and the group commit
(`writer`) then meets it as a conflict when it writes the record again."""

from __future__ import annotations

from ..jobs.state import JobStepState


def landed_write(stored: JobStepState, unanswered: list[tuple[int, JobStepState]]) -> int | None:
    """The sequence of the unanswered write that `stored` is, if it is one: the version after
    the one it expected, and the same content. The content names its run and its status times
    to the microsecond, so no other writer makes the same, and any change since would show."""
    content: str | None = None
    for sequence, saved in reversed(unanswered):
        if stored.version != saved.version + 1:
            continue  # cheap, and most conflicts are another's write: no content compared
        if content is None:
            content = _as_read(stored)
        if _as_read(saved) == content:
            return sequence
    return None


def _as_read(state: JobStepState) -> str:
    """The record's JSON as storage gives it back: a worker builds parts of it without their
    defaults (a status change's empty host), which reading fills in. JSON text, not Python
    values, so that 1, 1.0 and true differ."""
    return JobStepState.model_validate_json(state.model_dump_json()).model_dump_json()
