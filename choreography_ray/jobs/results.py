"""What the caller of a map reads back: each item's result, or why it has none.

`jobs.results(job_id)` yields an `ItemResult` per item, in item order; `as_completed()` yields
them as they are stored; `jobs.gather(job_id)` returns the values as one list, for jobs of up
to `GATHER_LIMIT` items.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .errors import ChoreographyError

GATHER_LIMIT = 10_000
"""The most items `jobs.gather` returns as one list; a larger job is iterated with
`jobs.results`, which holds one page of results at a time."""


class ItemFailed(ChoreographyError):
    """An item of a map without a result: its step failed, never ran (its job stopped, or a
    stage before it failed) or its record cannot be read. `jobs.results` yields it in the
    item's place; `jobs.gather` raises it. `status` is the step's status by name,
    `messages` what its last attempt raised ("ValueError: ...") and `error_type` the
    exception's type (`module.QualName`)."""

    def __init__(
        self,
        index: int,
        *,
        status: str,
        messages: list[str],
        error_type: str = "",
        step_id: str = "",
    ) -> None:
        super().__init__(f"item {index} has no result ({status}): {'; '.join(messages)}")
        self.index = index
        self.status = status
        self.messages = messages
        self.error_type = error_type
        self.step_id = step_id


class ResultsTooLargeError(ChoreographyError, ValueError):
    """Raised by `jobs.gather` for a job of more items than it returns as one list: iterate
    `jobs.results(job_id)`, which reads them a page at a time."""


class ItemResult(NamedTuple):
    """One item's outcome: `for index, value in jobs.results(job_id): ...`."""

    index: int  # type: ignore[assignment]  # shadows tuple.index, as a field named so must
    """The item's place among the items given to `jobs.map`, from 0 (for a job of another
    kind: its step's place in the job's plan)."""
    value: Any
    """The step function's result, typed by its declared result type; or an `ItemFailed`
    saying why the item has none."""

    @property
    def failed(self) -> bool:
        return isinstance(self.value, ItemFailed)
