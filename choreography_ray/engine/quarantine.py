"""Poison jobs: recovery attempts counted before each begins, and the quarantine that ends them.

A job whose recovery never completes — its resume fails every time, or its host dies while
activating it — would be recovered again at every start, for ever, and a job that kills its
host would take the host down at every start. So each recovery is counted on the job's record
(`recovery_attempts`), by compare-and-set, before it runs anything: a host that dies
mid-activation has counted it. A recovery that completes sets the count back to 0 at once. The
attempt that would exceed `max_recovery_attempts` is not made: the job is quarantined instead
(`JobState.quarantine`), durably, and only an explicit resume takes it up again.

Failures that are not the job's do not count. Storage that is down fails the count's own write,
so the attempt never begins; another live owner refuses the activation before the count. A
counted attempt that storage (or another writer's compare-and-set) ends later is given back by
not counting the next attempt on this host (`RecoveryAttempts`); that memory dies with the
host, so a host that crashes still counts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, Protocol, TypeVar

from ..jobs.errors import (
    ChoreographyError,
    JobQuarantinedError,
    StorageUnavailableError,
    VersionConflictError,
)
from ..jobs.state import JobState, Quarantine
from .context import error_messages
from .record import JobRecord, Released

T = TypeVar("T")

MAX_ERROR = 500
"""Characters of a failed recovery's error kept on the record (and in the quarantine reason)."""

NOT_THE_JOBS_FAULT = (StorageUnavailableError, VersionConflictError)
"""Errors that end a counted recovery for a reason outside the job (storage went away, or
another activation wrote the job first): they do not count towards quarantine. Another live
owner (`OwnedElsewhereError`) refuses the activation before anything is counted."""


def refusal(state: JobState) -> JobQuarantinedError | None:
    """The error that refuses a recovery or a report of the job, when it is quarantined."""
    quarantine = state.quarantine
    return None if quarantine is None else JobQuarantinedError(state.id, quarantine.reason)


def not_the_jobs_fault(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, is one the job cannot help."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, NOT_THE_JOBS_FAULT):
            return True
        seen.add(id(current))
        current = current.__cause__
    return False


def describe(error: BaseException) -> str:
    """One line for a failed recovery: our errors read as they are, with the type of the
    author's error under them; any other error with its type first."""
    if not isinstance(error, ChoreographyError):
        return "; ".join(error_messages(error))
    cause = error.__cause__
    under = "" if cause is None or isinstance(cause, ChoreographyError) else type(cause).__name__
    return f"{error} ({under})" if under else str(error)


def _reason(state: JobState, attempts: int) -> str:
    if state.recovery_error:
        return (
            f"{attempts} recoveries in a row did not complete; the last error: "
            f"{state.recovery_error}"
        )
    return (
        f"{attempts} recoveries in a row did not complete and none recorded an error: its "
        "host may have died while activating it"
    )


async def count_attempt(record: JobRecord) -> None:
    """Count a recovery about to begin, or quarantine the job when it would be one too many
    (raising `JobQuarantinedError`). A write that fails lets the job go and raises: an attempt
    whose count is not stored has not begun."""
    state = record.state
    refused = refusal(state)
    if refused is not None:
        raise refused
    if state.recovery_attempts >= record.ctx.options.max_recovery_attempts:
        await _quarantine(record)
    state.recovery_attempts += 1
    try:
        await record.save()
    except Exception as error:
        record.release(f"could not count a recovery attempt: {error}")
        raise


async def _quarantine(record: JobRecord) -> NoReturn:
    state = record.state
    reason = _reason(state, state.recovery_attempts)
    state.quarantine = Quarantine(
        reason=reason, attempts=state.recovery_attempts, since=record.ctx.clock.now()
    )
    try:
        await record.save()
    except Exception as error:
        record.release(f"could not write its quarantine: {error}")
        raise
    record.log.warning("job %s: quarantined, recovery will not retry it: %s", record.id, reason)
    record.release()  # quietly: nothing is to bring it back
    raise JobQuarantinedError(record.id, reason)


async def failed(record: JobRecord, error: BaseException) -> None:
    """Keep why a counted recovery failed, for the quarantine's reason. Best effort: the count
    is what protects the host, and it is already stored."""
    if record.released:
        return
    state = record.state
    previous = state.recovery_error
    state.recovery_error = describe(error)[:MAX_ERROR]
    try:
        await record.save()
    except Exception as write_error:
        state.recovery_error = previous
        record.log.warning("job %s: could not record a failed recovery: %s", record.id, write_error)


async def take_out(record: JobRecord) -> None:
    """An explicit resume takes the job out of quarantine: the mark and the count are cleared
    by compare-and-set before the resume runs."""
    state = record.state
    if state.quarantine is None:
        return
    state.quarantine = None
    state.recovery_attempts = 0
    state.recovery_error = ""
    try:
        await record.save()
    except Exception as error:
        record.release(f"could not take the job out of quarantine: {error}")
        raise
    record.log.warning("job %s: taken out of quarantine by an explicit resume", record.id)


async def completed(record: JobRecord) -> None:
    """A resume or a finished stop completed: the count starts again from 0, written now."""
    state = record.state
    if not state.recovery_attempts and not state.recovery_error:
        return
    state.recovery_attempts = 0
    state.recovery_error = ""
    with contextlib.suppress(Released):  # the count stays raised; the job comes back later
        await record.save_progress()


class Recoverable(Protocol):
    """What `RecoveryAttempts` needs of a job activation."""

    @property
    def id(self) -> str: ...

    @property
    def released(self) -> bool: ...

    @property
    def release_reason(self) -> str: ...

    async def count_recovery(self) -> None: ...

    async def recovery_failed(self, error: BaseException) -> None: ...

    def let_go(self, reason: str) -> None: ...


class RecoveryAttempts:
    """One manager's recoveries: each counted before it begins, unless the attempt before it
    on this host ended for a reason that was not the job's (then this one is its retry)."""

    KEPT = 10_000
    """The most jobs remembered as owed an uncounted attempt (a job another host recovered
    meanwhile is never asked about again here); past it the memory starts afresh."""

    def __init__(self) -> None:
        self._uncounted: set[str] = set()
        self._running: dict[str, tuple[Recoverable, asyncio.Future[Any]]] = {}

    async def run(self, activation: Recoverable, recovery: Callable[[], Awaitable[T]]) -> T:
        """Count the attempt, then run `recovery` (a resume or a stop's finish). A recovery of
        the same activation already under way is joined, not begun again: the reports of a
        job whose owner died arrive by the dozen, and each must not count an attempt."""
        job_id = activation.id
        running = self._running.get(job_id)
        if running is not None and running[0] is activation and not running[1].done():
            return await asyncio.shield(running[1])
        task = asyncio.ensure_future(self._counted(activation, recovery))
        self._running[job_id] = (activation, task)
        try:
            return await asyncio.shield(task)
        finally:
            if task.done() and self._running.get(job_id, (None, None))[1] is task:
                del self._running[job_id]

    async def _counted(self, activation: Recoverable, recovery: Callable[[], Awaitable[T]]) -> T:
        job_id = activation.id
        if job_id in self._uncounted:
            self._uncounted.discard(job_id)
        else:
            await activation.count_recovery()
        try:
            answer = await recovery()
        except Exception as error:
            if not_the_jobs_fault(error):
                self._owe(job_id)
            else:
                await activation.recovery_failed(error)
            # Not left idle: the next call, report or sweep recovers it again (counted).
            activation.let_go(f"its recovery failed: {describe(error)}")
            raise
        if activation.release_reason:
            self._owe(job_id)  # it completed, but a failed write let it go before the reset
        return answer

    def _owe(self, job_id: str) -> None:
        if len(self._uncounted) >= self.KEPT:
            self._uncounted.clear()
        self._uncounted.add(job_id)
