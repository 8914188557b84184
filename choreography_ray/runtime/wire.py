"""How a request (`operations`) crosses to a controller host: to one of this release, as itself;
to one of the previous release, as that release's call (`previous_release`)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

from .operations import Operation
from .previous_release import send_previous

T = TypeVar("T")


def send(handle: Any, operation: Operation[T]) -> Awaitable[T]:
    """Ask the controller host behind `handle` to perform `operation`; its answer, awaited.

    Whether the host has `perform` is read off its handle, which lists the methods of the
    host's own release: exact per host, with no advertisement to read or to go stale."""
    if hasattr(handle, "perform"):
        answer: Awaitable[T] = handle.perform.remote(operation)
        return answer
    previous: Awaitable[T] = send_previous(operation, handle)
    return previous
