"""Reading a job's item results back: in item order, or as they are stored.

Both read the job's step records a page at a time through the paged step query
(`StepQuery`), so a job of a million items is never held at once: `in_item_order` keeps a page
per stage, `as_completed` a page and a byte per item. They read through a `ResultSource`:
storage itself (in-process, the command line), or a client's requests to a controller host.

An item's index is its step's place in the plan, which for a map job is the item's place
among the items given. A stage's steps are read in plan order; the stages are merged by index,
so a staged map reads in item order too. Results stay JSON (`StoredItem`) until the reader
types them through its own registry (`StoredItem.typed`): nothing is unpickled.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from ..jobs.errors import ChoreographyError
from ..jobs.registry import Payload, TypeKind, TypeRegistry
from ..jobs.results import GATHER_LIMIT, ItemFailed, ItemResult, ResultsTooLargeError
from ..jobs.state import JobState, JobStepState, StepError
from ..jobs.status import JobStatus, JobStepStatus
from ..jobs.step import JobStep
from ..storage.protocols import JobStepStorage
from ..storage.step_query import StepCursor, StepOrder, StepPage, StepQuery, changed_micros

PAGE = 500
"""Step records read at a time."""

SCAN_SLACK = 1_000
"""How many records beyond those it looks for one look of `as_completed` reads at most."""

_OUTCOMES = frozenset(
    {
        JobStepStatus.COMPLETED_SUCCESSFULLY,
        JobStepStatus.COMPLETED_WITH_FAILURE,
        JobStepStatus.FAILED,
        JobStepStatus.UNREACHABLE,
    }
)
"""The statuses of a step that may hold its last outcome (a failed attempt may be retried)."""

_WHY = {
    JobStepStatus.UNREACHABLE: "not run: a stage before it failed",
    JobStepStatus.STOPPED: "stopped before it completed",
    JobStepStatus.UNKNOWN: "never run: its job stopped or ended first",
    JobStepStatus.SCHEDULED: "not completed: its job stopped first",
    JobStepStatus.RUNNING: "not completed: its job stopped first",
}


def is_settled(state: JobStepState) -> bool:
    """Whether the step holds its last outcome: a success, a failure the job will not retry
    (its decision is stored with the attempt) or unreachable."""
    status = state.status
    if status == JobStepStatus.COMPLETED_WITH_FAILURE:
        decision = state.decision
        return decision is not None and decision.attempt == state.attempt and not decision.retry
    return status in _OUTCOMES


@dataclass(frozen=True, slots=True)
class StoredItem:
    """One item's outcome as stored: its result or error still JSON, and where it sorts."""

    index: int
    stage: int
    step_id: str
    step_type: str
    status: JobStepStatus
    changed: int
    """Microseconds since the epoch of its last status change (0: none)."""
    settled: bool
    result: Payload | None = None
    error: StepError | None = None

    @classmethod
    def of(cls, state: JobStepState) -> StoredItem:
        return cls(
            index=state.position,
            stage=state.stage,
            step_id=state.id,
            step_type=state.type,
            status=state.status,
            changed=changed_micros(state),
            settled=is_settled(state),
            result=state.result,
            error=state.error,
        )

    @classmethod
    def missing(cls, index: int) -> StoredItem:
        """An item whose step record is not there to read (it cannot be decoded)."""
        error = StepError(messages=["its step record is missing or cannot be read"])
        return cls(index, 0, "", "", JobStepStatus.UNKNOWN, 0, True, error=error)

    def cursor(self, order: StepOrder) -> StepCursor:
        """Where a listing in `order` goes on after this item."""
        return StepCursor(
            order=order,
            step_id=self.step_id,
            stage=self.stage,
            position=self.index,
            changed=self.changed,
        )

    def failure(self) -> ItemFailed:
        error = self.error
        messages = list(error.messages) if error is not None and error.messages else []
        return ItemFailed(
            self.index,
            status=self.status.name,
            messages=messages or [_WHY.get(self.status, "no result")],
            error_type=error.error_type if error is not None else "",
            step_id=self.step_id,
        )

    def typed(self, registry: TypeRegistry) -> ItemResult:
        """The item's result as the step function declared it, or its `ItemFailed`; the
        stored type names are resolved through `registry` only."""
        if self.status != JobStepStatus.COMPLETED_SUCCESSFULLY:
            return ItemResult(self.index, self.failure())
        if self.result is None:
            return ItemResult(self.index, None)
        step = cast(type[JobStep[Any, Any, Any]], registry.resolve(self.step_type, TypeKind.STEP))
        return ItemResult(
            self.index, step.unwrap_result(registry.load(self.result, TypeKind.RESULT))
        )


@dataclass(frozen=True)
class ItemPage:
    """A page of a job's steps as item outcomes: what a controller host sends a client."""

    items: list[StoredItem]
    next: StepCursor | None

    @classmethod
    def of(cls, page: StepPage) -> ItemPage:
        return cls([StoredItem.of(state) for state in page.steps], page.next)


@dataclass(frozen=True)
class ResultSource:
    """Where a job's results are read: its state (`JobNotFoundError` once it is gone), a page
    of its steps, and the pause between two reads of a job that is still running."""

    job: Callable[[], Awaitable[JobState]]
    page: Callable[[StepQuery], Awaitable[ItemPage]]
    pause: Callable[[], Awaitable[None]]

    @classmethod
    def stored(
        cls,
        steps: JobStepStorage,
        job_id: str,
        job: Callable[[], Awaitable[JobState]],
        pause: Callable[[], Awaitable[None]],
    ) -> ResultSource:
        """Read straight from the job's step storage."""

        async def page(query: StepQuery) -> ItemPage:
            return ItemPage.of(await steps.query(job_id, query))

        return cls(job, page, pause)


async def planned(source: ResultSource) -> JobState:
    """The job once every step of its plan is stored (or it is finished)."""
    while True:
        job = await source.job()
        if job.is_prepared or job.is_finished:
            if job.status == JobStatus.FAILED and not job.is_prepared:
                changes = job.status_changes
                why = "; ".join(changes[-1].exception_messages) if changes else ""
                raise ChoreographyError(
                    f"job {job.id} failed before its steps were prepared: it has no results"
                    + (f" ({why})" if why else "")
                )
            return job
        await source.pause()


class _Stage:
    """One stage's steps in plan order, a page at a time."""

    def __init__(self, source: ResultSource, stage: int) -> None:
        self.source = source
        self.stage = stage
        self.taken: StoredItem | None = None
        """The last step taken: the next read starts after it."""
        self.buffer: deque[StoredItem] = deque()
        self.ended = False

    async def head(self) -> StoredItem | None:
        if not self.buffer and not self.ended:
            await self.read()
        return self.buffer[0] if self.buffer else None

    async def read(self) -> StoredItem | None:
        """Read again from the step after the last taken: the head as it stands now."""
        after = None if self.taken is None else self.taken.cursor(StepOrder.PLAN)
        query = StepQuery(stage=self.stage, order=StepOrder.PLAN, after=after, take=PAGE)
        page = await self.source.page(query)
        self.buffer = deque(page.items)
        self.ended = page.next is None
        return self.buffer[0] if self.buffer else None

    def take(self) -> StoredItem:
        self.taken = self.buffer.popleft()
        return self.taken


async def in_item_order(source: ResultSource) -> AsyncGenerator[StoredItem, None]:
    """Every item's outcome in item order. An item still running is waited for (the source's
    pause between reads), as `ray.get` waits; once the job is finished every item is read as
    it stands. An index with no readable record yields a missing item in its place."""
    job = await planned(source)
    finished = job.is_finished
    stages = [_Stage(source, s.stage) for s in job.progress.stages] or [_Stage(source, 0)]
    heads: list[tuple[int, int]] = []
    for number, stage in enumerate(stages):
        head = await stage.head()
        if head is not None:
            heads.append((head.index, number))
    heapq.heapify(heads)
    expected = 0
    while heads:
        _, number = heapq.heappop(heads)
        stage = stages[number]
        item = await stage.head()
        while item is not None and not (finished or item.settled):
            await source.pause()
            finished = (await source.job()).is_finished  # read before the page it judges
            item = await stage.read()
        if item is None:
            continue
        stage.take()
        for index in range(expected, item.index):
            yield StoredItem.missing(index)
        expected = max(expected, item.index + 1)
        yield item
        following = await stage.head()
        if following is not None:
            heapq.heappush(heads, (following.index, number))
    for index in range(expected, job.progress.total_steps):
        yield StoredItem.missing(index)


async def as_completed(source: ResultSource) -> AsyncGenerator[StoredItem, None]:
    """Every item's outcome once, as it is stored; those left when the job finishes (never
    run, stopped, or stored late) in item order at the end.

    While the job runs, each look reads its steps newest outcome first, for as many new ones
    as the job has counted (its progress counts an outcome once it is stored), and at most
    `SCAN_SLACK` records beyond: a look costs what it finds, not the size of the job."""
    job = await planned(source)
    total = job.progress.total_steps
    seen = bytearray(total)
    yielded = 0
    while not job.is_finished:
        progress = job.progress
        wanted = progress.successful_steps + progress.failed_steps + progress.unreachable_steps
        wanted -= yielded
        budget = wanted + SCAN_SLACK
        after: StepCursor | None = None
        while wanted > 0 and budget > 0:
            query = StepQuery(statuses=_OUTCOMES, order=StepOrder.CHANGED, after=after, take=PAGE)
            page = await source.page(query)
            for item in page.items:
                budget -= 1
                if item.settled and 0 <= item.index < total and not seen[item.index]:
                    seen[item.index] = 1
                    yielded += 1
                    wanted -= 1
                    yield item
            if page.next is None:
                break
            after = page.next
        await source.pause()
        job = await source.job()
    async for item in in_item_order(source):
        if not (0 <= item.index < total and seen[item.index]):
            yield item


async def typed(
    items: AsyncIterator[StoredItem], registry: TypeRegistry
) -> AsyncGenerator[ItemResult, None]:
    """The items' outcomes typed through `registry`."""
    async for item in items:
        yield item.typed(registry)


async def gather(
    source: ResultSource, registry: TypeRegistry, *, return_exceptions: bool = False
) -> list[Any]:
    """Every item's result as one list, in item order, for a job of at most `GATHER_LIMIT`
    items. The first failed item (in item order) raises its `ItemFailed`, unless
    `return_exceptions`: then it stands in the item's place."""
    job = await planned(source)
    total = job.progress.total_steps
    if total > GATHER_LIMIT:
        raise ResultsTooLargeError(
            f"job {job.id} has {total:,} items; gather returns at most {GATHER_LIMIT:,} as one "
            "list: iterate jobs.results(job_id), which reads them a page at a time"
        )
    values: list[Any] = []
    async for item in in_item_order(source):
        value = item.typed(registry).value
        if isinstance(value, ItemFailed) and not return_exceptions:
            raise value
        values.append(value)
    return values
