"""A page of a job's steps: which ones (filter), in what order, and where the next page starts.

Paging is by key, not by offset: a page ends with a `StepCursor` holding the sort key of its
last record, and the next page starts strictly after it. Every page costs the same however
deep it is (a page of a 150,000-step job reads one index range), and steps that change
between two pages are neither skipped nor listed twice in plan order, where the key never
changes. In last-change order a step that changes moves: it may show again, ahead, or not at
all, as it would in any live listing by time.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from operator import itemgetter
from typing import NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from ..jobs.state import MAX_ID_LENGTH, JobStepState, to_micros
from ..jobs.status import JobStepStatus

T = TypeVar("T")

PREFIX_END = "\U0010ffff"
"""Above every character of an id: ids starting with a prefix sort from the prefix itself
up to the prefix followed by this (a store answers a prefix with that range of its key)."""


class StepOrder(StrEnum):
    PLAN = "plan"
    """By stage, then the step's place in the plan, then id: the order the job runs them."""
    CHANGED = "changed"
    """Last status change first, then id descending; steps never run come last."""


class StepCursor(BaseModel):
    """Where a page ended: the sort key of its last record, in the page's order."""

    model_config = ConfigDict(frozen=True)

    order: StepOrder
    step_id: str
    stage: int = 0
    position: int = 0
    changed: int = 0
    """Microseconds since the epoch of the last status change; 0 for none."""

    def token(self) -> str:
        """The cursor as a short URL-safe text, for a link or a command line."""
        values = [self.order.value, self.stage, self.position, self.changed, self.step_id]
        raw = json.dumps(values, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def parse(cls, token: str) -> StepCursor:
        """The cursor `token` stands for; `ValueError` naming the token when it is not one."""
        try:
            padded = token + "=" * (-len(token) % 4)
            order, stage, position, changed, step_id = json.loads(
                base64.urlsafe_b64decode(padded.encode())
            )
            return cls(
                order=order, stage=stage, position=position, changed=changed, step_id=step_id
            )
        except (binascii.Error, ValueError, TypeError, ValidationError) as error:
            raise ValueError(f"{token!r} is not a page cursor of a step listing") from error


class StepQuery(BaseModel):
    """Which steps of a job, in what order, and which page.

    `statuses` empty means every status; `stage` and `type` None mean any; `id_prefix` keeps
    the steps whose id starts with it. `take` <= 0 means every matching step after `after`.
    """

    model_config = ConfigDict(frozen=True)

    statuses: frozenset[JobStepStatus] = frozenset()
    stage: int | None = None
    type: str | None = None
    id_prefix: str = ""
    order: StepOrder = StepOrder.PLAN
    after: StepCursor | None = None
    take: int = 100

    @field_validator("id_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if len(value) > MAX_ID_LENGTH:
            raise ValueError(f"must be at most {MAX_ID_LENGTH} characters")
        return value

    @model_validator(mode="after")
    def _same_order(self) -> StepQuery:
        if self.after is not None and self.after.order != self.order:
            raise ValueError(
                f"the cursor continues a listing in {self.after.order.value} order, "
                f"not in {self.order.value} order"
            )
        return self

    @property
    def limit(self) -> int | None:
        """How many records a page holds; None for all."""
        return self.take if self.take > 0 else None


@dataclass(frozen=True)
class StepPage:
    """One page: its steps, and the cursor of the next page (None when this is the last)."""

    steps: list[JobStepState]
    next: StepCursor | None


class StepKey(NamedTuple):
    """What a provider keeps beside a step's record to filter and order it (a tuple: a
    provider that pages in memory makes one per step)."""

    step_id: str
    stage: int
    position: int
    changed: int
    status: int
    type: str

    def cursor(self, order: StepOrder) -> StepCursor:
        return StepCursor(
            order=order,
            step_id=self.step_id,
            stage=self.stage,
            position=self.position,
            changed=self.changed,
        )


def changed_micros(state: JobStepState) -> int:
    """The step's last status change in microseconds since the epoch; 0 when it has none."""
    changed = state.last_change
    return 0 if changed is None else to_micros(changed)


def key_of(state: JobStepState) -> StepKey:
    return StepKey(
        step_id=state.id,
        stage=state.stage,
        position=state.position,
        changed=changed_micros(state),
        status=int(state.status),
        type=state.type,
    )


def matches(key: StepKey, query: StepQuery) -> bool:
    """Whether a step passes the query's filter (its cursor aside)."""
    return (
        (not query.statuses or key.status in query.statuses)
        and (query.stage is None or key.stage == query.stage)
        and (query.type is None or key.type == query.type)
        and key.step_id.startswith(query.id_prefix)
    )


def _filters(query: StepQuery) -> bool:
    return bool(query.statuses or query.stage is not None or query.type or query.id_prefix)


def cursor_key(cursor: StepCursor) -> tuple[int, int, str] | tuple[int, str]:
    if cursor.order is StepOrder.PLAN:
        return (cursor.stage, cursor.position, cursor.step_id)
    return (cursor.changed, cursor.step_id)


_SORT_KEYS = {StepOrder.PLAN: itemgetter(1, 2, 0), StepOrder.CHANGED: itemgetter(3, 0)}
"""A `StepKey`'s sort key in each order, taken without a call into Python."""


def select_page(
    keys: Iterable[StepKey], query: StepQuery
) -> tuple[list[StepKey], StepCursor | None]:
    """The keys of the page the query asks, with the next page's cursor: for a provider that
    filters and orders in memory. A page is picked from a heap, not a sort of every step."""
    order = query.order
    descending = order is StepOrder.CHANGED
    sort_key = _SORT_KEYS[order]
    chosen = keys
    if _filters(query):
        chosen = (key for key in chosen if matches(key, query))
    if query.after is not None:
        bound = cursor_key(query.after)
        if descending:
            chosen = (key for key in chosen if sort_key(key) < bound)
        else:
            chosen = (key for key in chosen if sort_key(key) > bound)
    limit = query.limit
    if limit is None:
        ordered = sorted(chosen, key=sort_key, reverse=descending)
    else:
        pick = heapq.nlargest if descending else heapq.nsmallest
        ordered = pick(limit + 1, chosen, key=sort_key)
    return paged(ordered, query, lambda key: key)


def paged(
    rows: list[T], query: StepQuery, key: Callable[[T], StepKey]
) -> tuple[list[T], StepCursor | None]:
    """The first `take` of `rows` (read one beyond a page), and the next page's cursor when
    there are more."""
    limit = query.limit
    if limit is None or len(rows) <= limit:
        return rows, None
    page = rows[:limit]
    return page, key(page[-1]).cursor(query.order)
