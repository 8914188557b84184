"""The author's side of a step: `JobStep`, its context, and how it says it failed.

A step is planned with a request, turns it into its own state once (`initialize_state`), and
then performs on that state — never on the request — so a step run again after a crash starts
from its last checkpoint, not from scratch.
"""

from __future__ import annotations

import inspect
import typing
from abc import ABC, abstractmethod
from collections.abc import Awaitable
from datetime import datetime, timedelta
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel, RootModel

from .adaptive import AdaptiveConcurrency
from .concurrency import ConcurrencyKey
from .errors import ChoreographyError, TypeRegistryError
from .rates import RATE_LIMITED, RateLimit
from .registry import TypeKind, TypeRegistry, default_registry
from .retry import RetryPolicy, check_policy, duration_seconds

TRequest = TypeVar("TRequest", bound=BaseModel)
TState = TypeVar("TState", bound=BaseModel)
TResult = TypeVar("TResult")


class JobRequest(BaseModel):
    """Base class for job requests (any pydantic model works)."""


class StepRequest(BaseModel):
    """Base class for step requests (any pydantic model works)."""


class StepFailed(ChoreographyError):
    """Raise from `perform` to fail the step with messages and, optionally, a partial result.

    `non_retryable` fails the step at once whatever attempts are left. `retry_after` (a
    `timedelta` or seconds) is how long to wait before the next attempt, if the retry policy
    leaves one: it wins over the policy's backoff for this failure (a rate limit that says
    when to come back, say). `throttled` says the service behind the step asked it to slow
    down: a step class with `adaptive` concurrency halves its job's window.
    """

    def __init__(
        self,
        *messages: str,
        partial_result: Any = None,
        non_retryable: bool = False,
        retry_after: timedelta | float | None = None,
        throttled: bool = False,
    ) -> None:
        super().__init__("; ".join(messages) or "step failed")
        self.throttled = throttled
        self.messages = list(messages) or ["step failed"]
        self.partial_result = partial_result
        self.non_retryable = non_retryable
        self.retry_after: float | None = None
        if retry_after is not None:
            self.retry_after = duration_seconds("StepFailed.retry_after", retry_after)


class StepWork(Protocol):
    """What the engine gives a step's context: the run on the worker host, or, for a
    synchronous step in a Ray task, its link back to that run."""

    job_id: str
    step_id: str
    attempt: int

    def checkpoint(self, state: BaseModel | None = None) -> None: ...

    def progress(self, percentage: float, message: str = "") -> None: ...

    @property
    def cancelled(self) -> bool: ...

    async def wait_cancelled(self) -> None: ...

    def now(self) -> datetime: ...


class StepContext:
    """What a running step may ask of the system, and nothing else (docs/jobs.md lists it):
    the engine's run behind it (its worker, record, runner) is not the author's to reach."""

    __slots__ = ("_work",)

    def __init__(self, work: StepWork) -> None:
        self._work = work

    @property
    def job_id(self) -> str:
        return self._work.job_id

    @property
    def step_id(self) -> str:
        return self._work.step_id

    @property
    def attempt(self) -> int:
        """1 for the first attempt, then one more per retry."""
        return self._work.attempt

    @property
    def idempotency_key(self) -> str:
        """Stable for this step across re-runs and retries: deduplicate external effects by it."""
        return f"{self.job_id}/{self.step_id}"

    def checkpoint(self, state: BaseModel | None = None) -> None:
        """Record the step's state (the one passed to `perform` unless given).

        Writes are debounced (`step_checkpoint_batch_interval`, flush interval); a run that
        crashes continues from the last checkpoint that reached storage.
        """
        self._work.checkpoint(state)

    def progress(self, percentage: float, message: str = "") -> None:
        """Report how far the step is, 0 to 100."""
        self._work.progress(percentage, message)

    @property
    def cancelled(self) -> bool:
        """True once the step is asked to stop; long work should check it and return."""
        return self._work.cancelled

    async def wait_cancelled(self) -> None:
        """Return once the step is asked to stop."""
        await self._work.wait_cancelled()

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise StepCancelled()

    def now(self) -> datetime:
        """The engine's clock (a fake one in tests)."""
        return self._work.now()

    def __repr__(self) -> str:
        return f"StepContext(job_id={self.job_id!r}, step_id={self.step_id!r})"


class StepCancelled(ChoreographyError):
    """Raised inside a step that was asked to stop; it ends the run as stopped."""

    def __init__(self) -> None:
        super().__init__("step was cancelled")


class JobStep(ABC, Generic[TRequest, TState, TResult]):
    """A unit of a job's work. Subclass with concrete request, state and result types:

        class RebuildShard(JobStep[ShardRequest, ShardState, int], name="rebuild-shard"):
            def initialize_state(self, request): return ShardState(shard=request.shard)
            async def perform(self, state, ctx): ...

    Defining the class registers it, and its request, state and result types, in the type
    registry under stable names (the class's `name`, or its module path).
    """

    name: ClassVar[str]
    request_type: ClassVar[type[BaseModel]]
    state_type: ClassVar[type[BaseModel]]
    result_type: ClassVar[type[BaseModel]]
    """A model class; a plain result type (int, list[str], …) is wrapped in a RootModel."""
    result_is_root: ClassVar[bool] = False
    registry: ClassVar[TypeRegistry]

    state_is_request: ClassVar[bool] = False
    """Set when `initialize_state` returns its request as it is (never changed): the step's
    first state is then stored from the plan's copy of the request, which planning already
    wrote and checked, rather than written again (a microsecond of the controller's a step).
    Step functions set it. A state that is another object is written as usual."""
    checkpoint_after_every_batch: ClassVar[bool] = False
    """Persist every checkpoint instead of debouncing them."""
    resources: ClassVar[dict[str, float]] = {}
    """Ray resources a synchronous `perform` needs (e.g. {"num_cpus": 1}); async steps run on
    the worker host's event loop and take none."""
    retry_policy: ClassVar[RetryPolicy | None] = None
    """How this step's failures are retried; None leaves it to the job class, then the
    options. Wins whole over theirs (see `RetryPolicy`)."""
    adaptive: ClassVar[AdaptiveConcurrency | None] = None
    """Adapt the window of this step's jobs to what the service behind it takes (AIMD; see
    `AdaptiveConcurrency`); None keeps the window fixed."""
    rate_limit: ClassVar[RateLimit | str | None] = None
    """At most so many runs of this step type begin per period across the cluster ("100/s",
    "5000/h", or a `RateLimit`); the others wait their turn (docs/scheduling.md)."""
    concurrency: ClassVar[ConcurrencyKey | None] = None
    """At most `max_running` runs of this step type with one key perform at once across the
    cluster; the key is a field of the step's state (what `perform` is given) or a callable
    over it. The others wait without a worker slot (docs/scheduling.md)."""

    def __init_subclass__(
        cls, *, name: str | None = None, registry: TypeRegistry | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        args = _generic_args(cls, JobStep)
        if args is None:
            return  # an intermediate generic base; its concrete subclasses register
        request_type, state_type, result_type = args
        cls.registry = registry or default_registry
        cls.name = name or f"{cls.__module__}.{cls.__qualname__}"
        cls.request_type = _model(request_type, "request", cls)
        cls.state_type = _model(state_type, "state", cls)
        cls.registry.register(cls.request_type, kind=TypeKind.REQUEST)
        cls.registry.register(cls.state_type, kind=TypeKind.STATE)
        if isinstance(result_type, type) and issubclass(result_type, BaseModel):
            cls.result_type = result_type
            cls.result_is_root = False
            cls.registry.register(result_type, kind=TypeKind.RESULT)
        else:
            # A subclass of its own: pydantic caches RootModel[int], and a class has one name.
            root = type(
                f"{cls.__name__}Result",
                (RootModel[result_type],),  # type: ignore[valid-type]
                {"__module__": cls.__module__},
            )
            cls.result_type = root
            cls.result_is_root = True
            cls.registry.register(root, kind=TypeKind.RESULT, name=f"{cls.name}:result")
        cls.registry.register(cls, kind=TypeKind.STEP, name=cls.name)
        check_policy(cls)
        if cls.concurrency is not None:
            if not isinstance(cls.concurrency, ConcurrencyKey):
                raise TypeRegistryError(
                    f"{cls.__qualname__}: concurrency is a ConcurrencyKey, not {cls.concurrency!r}"
                )
            cls.concurrency.check(cls.state_type, cls.__qualname__)
        if cls.rate_limit is not None:
            cls.rate_limit = RateLimit.of(cls.rate_limit)
            RATE_LIMITED.add(cls.name)

    @abstractmethod
    def initialize_state(self, request: TRequest) -> TState:
        """Copy what the work needs from the request into the step's state (once, at prepare)."""

    @abstractmethod
    def perform(self, state: TState, ctx: StepContext) -> TResult | Awaitable[TResult]:
        """Do the work. Return the result; raise `StepFailed` (or anything) to fail."""

    def create_cancelled_result_from_current_state(self, state: TState) -> TResult | None:
        """The partial result of a step stopped before or while it ran; None by default."""
        return None

    @classmethod
    def is_async(cls) -> bool:
        cached = cls.__dict__.get("_is_async")
        if cached is None:
            cached = inspect.iscoroutinefunction(cls.perform)
            cls._is_async = cached  # type: ignore[attr-defined]
        return bool(cached)

    @classmethod
    def wrap_result(cls, value: Any) -> BaseModel | None:
        """The result as a registered model instance, ready to store."""
        if value is None and cls.result_is_root is False:
            return None
        if cls.result_is_root:
            return cls.result_type.model_validate(value)
        if isinstance(value, cls.result_type):
            return value
        return cls.result_type.model_validate(value)

    @classmethod
    def unwrap_result(cls, model: BaseModel | None) -> Any:
        if model is None:
            return None
        return model.root if cls.result_is_root else model  # type: ignore[attr-defined]


def _model(candidate: Any, role: str, owner: type) -> type[BaseModel]:
    if isinstance(candidate, type) and issubclass(candidate, BaseModel):
        return candidate
    raise TypeRegistryError(
        f"{owner.__qualname__}: the {role} type must be a pydantic model, got {candidate!r}"
    )


def _generic_args(cls: type, base: type) -> tuple[Any, ...] | None:
    """The concrete type arguments `cls` gives `base`, or None while they are still open."""
    for klass in cls.__mro__:
        for original in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(original) is base:
                args = typing.get_args(original)
                if any(isinstance(a, TypeVar) for a in args):
                    return None
                return args
    return None
