"""What an activation needs from its surroundings, bundled once per partition."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..jobs.options import JobsOptions
from ..jobs.registry import TypeRegistry
from ..jobs.state import JobKey, JobOwner
from ..jobs.status import JobStatus
from ..storage.protocols import JobsStorage
from .clock import Clock
from .concurrency import KeyWaiters
from .ports import StepDispatcher

T = TypeVar("T")


@dataclass(frozen=True)
class EngineContext:
    key: JobKey
    storage: JobsStorage
    registry: TypeRegistry
    options: JobsOptions
    clock: Clock
    dispatcher: StepDispatcher
    externalize_plans: bool = True
    """Store large plans apart from the job where storage can (every host must support it)."""
    plans_apart: Callable[[str], Awaitable[bool]] | None = None
    """Whether every live host that hosts a job type can read a plan stored apart (asked
    per job as it saves its plan, during a rolling upgrade); None: all can."""
    owner: JobOwner | None = None
    """This host's identity; when set, activating a job claims it by compare-and-set."""
    owner_alive: Callable[[JobOwner], Awaitable[bool]] | None = None
    """Whether another host that owns a job still runs it."""
    on_status: Callable[[JobStatus], None] | None = None
    """Told every status a job enters (metrics)."""
    active_hosts: Callable[[], Awaitable[frozenset[str]]] | None = None
    """The worker hosts that are part of the cluster now (the watchdog's membership; a job
    can override how it is read with `Job.get_active_hosts`). None: every host counts as
    alive, so a step is restarted only once its lease expired."""
    keys: KeyWaiters = field(default_factory=KeyWaiters)
    """The partition's jobs waiting here for their concurrency keys."""


async def maybe_await(value: T | Awaitable[T]) -> T:
    """Hooks may be plain or async methods."""
    if inspect.isawaitable(value):
        return await value
    return value


def error_messages(error: BaseException) -> list[str]:
    return [f"{type(error).__name__}: {error}"] if str(error) else [type(error).__name__]


def describe(value: Any) -> str:
    return type(value).__qualname__
