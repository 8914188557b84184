"""Bounded retries of transient storage failures.

A dropped connection or a timeout is retried with exponential backoff and jitter, a bounded
number of times; any other error surfaces at once. Each provider says which errors are
transient. `sleep` is injectable so that tests never wait. Each retry logs one line, and the
final error is one line: drivers' messages (psycopg's) span several, which would make a log of
a few retries unreadable.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Generic, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from ..jobs.errors import StorageUnavailableError
from ..jobs.retry import Backoff

log = logging.getLogger("choreography_ray.storage")

RETRY_MESSAGE = "%s: transient error on attempt %d, retrying: %s"
"""The warning each retry logs (its template: a filter tells these records by it)."""


def not_a_retry(record: logging.LogRecord) -> bool:
    """A log filter that leaves out the retry warnings: for a command that prints the final
    error as one line, where each retry's line would only repeat it."""
    return record.msg is not RETRY_MESSAGE


T = TypeVar("T")


class TransientRetry:
    """Runs a storage call, retrying it while it fails with a transient error."""

    def __init__(
        self,
        is_transient: Callable[[BaseException], bool],
        *,
        attempts: int = 5,
        base_delay: timedelta = timedelta(milliseconds=100),
        max_delay: timedelta = timedelta(seconds=5),
        sleep: Callable[[float], None] = time.sleep,
        what: str = "storage",
    ) -> None:
        self.is_transient = is_transient
        self.attempts = attempts
        self.base_delay = base_delay.total_seconds()
        self.max_delay = max_delay.total_seconds()
        self.backoff = Backoff.between(base_delay, max_delay)
        self.sleep = sleep
        self.what = what

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)`, retried while it fails with a transient error.

        Nearly every call succeeds at once, and building a retry loop costs more than a
        single-row write, so the loop is built only after a first transient failure, which it
        then counts as its first attempt: attempts, delays and logging are the same.
        """
        try:
            return fn(*args)
        except Exception as error:
            if not self.is_transient(error):
                raise
            first: BaseException = error
        return self._retry(_Replay(first, fn), *args)

    def _retry(self, fn: Callable[..., T], *args: object) -> T:
        retrying = Retrying(
            retry=retry_if_exception(self.is_transient),
            stop=stop_after_attempt(self.attempts),
            wait=self._wait,
            sleep=self.sleep,
            before_sleep=self._log,
            reraise=False,
        )
        try:
            return retrying(fn, *args)
        except Exception as error:  # tenacity wraps the last transient failure
            last = getattr(error, "last_attempt", None)
            if last is not None:
                cause = last.exception()
                raise StorageUnavailableError(
                    f"{self.what} failed {self.attempts} times with a transient error; "
                    f"last: {type(cause).__name__}: {one_line(cause)}"
                ) from cause
            raise

    def _wait(self, state: RetryCallState) -> float:
        """The package's backoff, with up to one base delay of jitter on top (never above the
        cap), so that clients that failed together do not all try again together."""
        delay = self.backoff.nth(state.attempt_number) + random.uniform(0, self.base_delay)
        return min(self.max_delay, delay)

    def _log(self, state: RetryCallState) -> None:
        outcome = state.outcome
        error = outcome.exception() if outcome is not None else None
        log.warning(
            RETRY_MESSAGE,
            self.what,
            state.attempt_number,
            one_line(error) if error is not None else "no error",
        )


def one_line(error: BaseException) -> str:
    """The error's message on one line: runs of whitespace, newlines included, become a space."""
    return " ".join(str(error).split())


class _Replay(Generic[T]):
    """Fails once more with the error the first attempt raised, then calls `fn`."""

    def __init__(self, error: BaseException, fn: Callable[..., T]) -> None:
        self.error: BaseException | None = error
        self.fn = fn

    def __call__(self, *args: Any) -> T:
        error, self.error = self.error, None
        if error is not None:
            raise error
        return self.fn(*args)
