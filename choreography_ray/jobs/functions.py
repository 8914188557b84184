"""Steps and jobs from plain functions: `@step` and `@job`.

A step function is one piece of work over one item, the way Ray users write a task:

    @cr.step(name="thumbs.resize", max_attempts=3)
    async def resize(image: Image) -> Thumb: ...

Decorating it makes a `JobStep` class behind it, registered under the step's name like any
step class, so a host that imports the function's module finds the step by name, and recovery
on another node prepares and runs it from the stored JSON. The item and the result are typed
by the function's annotations: a pydantic model is stored as itself, anything else (a
builtin, a dataclass, `list[str]`, ...) in a `RootModel` registered as `<name>:item`, as
results are. A parameter annotated `StepContext` is given the run's context.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, ClassVar, Generic, TypeVar, overload

from pydantic import BaseModel, RootModel, ValidationError

from .errors import InvalidRequestError, TypeRegistryError
from .job import Job, StepDetails, check_stage, new_step_id, planned_step
from .registry import TypeKind, TypeRegistry, default_registry
from .retry import RetryPolicy
from .step import JobStep, StepContext

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R", bound=BaseModel)


class _FunctionPerform:
    """What every function step does: its state is its item, and `perform` calls the function.
    Mixed in ahead of `JobStep[Item, Item, Result]`, which registers the concrete class."""

    function: ClassVar[StepFunction[Any]]
    state_is_request: ClassVar[bool] = True

    def initialize_state(self, request: BaseModel) -> BaseModel:
        return request  # the item is all the work needs; a re-run starts from it again


class _AsyncPerform(_FunctionPerform):
    async def perform(self, state: BaseModel, ctx: StepContext) -> Any:
        return await self.function.call(state, ctx)


class _SyncPerform(_FunctionPerform):
    def perform(self, state: BaseModel, ctx: StepContext) -> Any:
        return self.function.call(state, ctx)


class StepFunction(Generic[F]):
    """A function made a step by `@step`: call it as before, plan it with `.plan(item)`,
    run it over many items with `jobs.map(fn, items)`."""

    def __init__(
        self,
        function: F,
        *,
        name: str | None,
        retry_policy: RetryPolicy | None,
        resources: dict[str, float],
        checkpoint_after_every_batch: bool,
        registry: TypeRegistry,
    ) -> None:
        if not callable(function) or not inspect.isfunction(inspect.unwrap(function)):
            raise TypeRegistryError(f"@step decorates a function, not {function!r}")
        self.function = function
        self.name = name or f"{function.__module__}.{function.__qualname__}"
        self.__name__ = function.__name__
        self.__qualname__ = function.__qualname__
        self.__module__ = function.__module__
        self.__doc__ = function.__doc__
        self.__wrapped__ = function
        signature = inspect.signature(function)
        hints = _hints(function)
        self._context_at: str | None = None
        item: inspect.Parameter | None = None
        for parameter in signature.parameters.values():
            if hints.get(parameter.name) is StepContext:
                self._context_at = parameter.name
            elif item is None:
                item = parameter
            elif parameter.default is inspect.Parameter.empty and parameter.kind not in (
                inspect.Parameter.VAR_POSITIONAL,
                inspect.Parameter.VAR_KEYWORD,
            ):
                raise TypeRegistryError(
                    f"step function {self.name!r} takes one item; its parameter "
                    f"{parameter.name!r} has no default (a StepContext parameter is given "
                    "the run's context)"
                )
        if item is None or item.kind in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            raise TypeRegistryError(
                f"step function {self.name!r} must take the item as a parameter of its own"
            )
        self._item_at = item.name
        self.item_type: Any = hints.get(item.name, Any)
        self.result_type: Any = hints.get("return", Any)
        if isinstance(self.item_type, type) and issubclass(self.item_type, BaseModel):
            model: type[BaseModel] = self.item_type
            self._item_is_root = False
        else:
            model = types.new_class(
                f"{function.__name__}_item",
                (RootModel[self.item_type],),  # type: ignore[name-defined]
                exec_body=lambda ns: ns.update({"__module__": function.__module__}),
            )
            registry.register(model, kind=TypeKind.REQUEST, name=f"{self.name}:item")
            self._item_is_root = True
        self.item_model = model
        perform: type = _AsyncPerform if inspect.iscoroutinefunction(function) else _SyncPerform
        body = {
            "__module__": function.__module__,
            "__qualname__": function.__qualname__,
            "__doc__": function.__doc__,
            "function": self,
            "retry_policy": retry_policy,
            "resources": resources,
            "checkpoint_after_every_batch": checkpoint_after_every_batch,
        }
        self.step_type: type[JobStep[Any, Any, Any]] = types.new_class(
            function.__name__,
            (perform, JobStep[model, model, self.result_type]),  # type: ignore[valid-type,name-defined]
            {"name": self.name, "registry": registry},
            lambda ns: ns.update(body),
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The function itself, as if undecorated."""
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<step function {self.name!r}>"

    def item(self, value: Any) -> BaseModel:
        """`value` as the stored request of a step: validated into the item's type (a model
        item given as itself stays as it is); whether it survives the round trip through JSON
        is checked when the plan is made. `InvalidRequestError` when it does not fit."""
        model = self.item_model
        if not self._item_is_root and isinstance(value, model):
            return value
        try:
            return model.model_validate(value)
        except ValidationError as error:
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise InvalidRequestError(
                f"step {self.name!r} takes {_type_name(self.item_type)} items, not {shown}: "
                f"{error.errors()[0].get('msg', 'invalid')}"
            ) from None

    def stored(self, value: Any) -> BaseModel:
        """An item already validated into the item's type, as the step's stored request."""
        return self.item_model.model_construct(value) if self._item_is_root else value

    def plan(self, item: Any, *, stage: int = 0, name: str = "") -> StepDetails:
        """One step of this function over `item`, for a job's plan (`@job`'s function or a
        `Job.prepare_steps`): a new identity, its stage (0 first) and an optional name."""
        stage = check_stage(stage)
        return planned_step(new_step_id(), self.step_type, self.item(item), stage, name)

    def call(self, state: BaseModel, ctx: StepContext) -> Any:
        """Call the function with the stored item (and the context where it asks for one)."""
        item = state.root if self._item_is_root else state  # type: ignore[attr-defined]
        kwargs = {self._item_at: item}
        if self._context_at is not None:
            kwargs[self._context_at] = ctx
        return self.function(**kwargs)


def _type_name(annotation: Any) -> str:
    return annotation.__qualname__ if isinstance(annotation, type) else repr(annotation)


def _hints(function: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(function)
    except Exception as error:
        raise TypeRegistryError(
            f"the annotations of {function.__module__}.{function.__qualname__} cannot be "
            f"resolved: {error}"
        ) from error


@overload
def step(function: F, /) -> StepFunction[F]: ...


@overload
def step(
    *,
    name: str | None = None,
    max_attempts: int | None = None,
    retry_policy: RetryPolicy | None = None,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    memory: float | None = None,
    resources: dict[str, float] | None = None,
    checkpoint_after_every_batch: bool = False,
    registry: TypeRegistry | None = None,
) -> Callable[[F], StepFunction[F]]: ...


def step(
    function: F | None = None,
    /,
    *,
    name: str | None = None,
    max_attempts: int | None = None,
    retry_policy: RetryPolicy | None = None,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    memory: float | None = None,
    resources: dict[str, float] | None = None,
    checkpoint_after_every_batch: bool = False,
    registry: TypeRegistry | None = None,
) -> StepFunction[F] | Callable[[F], StepFunction[F]]:
    """Make a function a step type, registered under `name` (default: its module path).

    `max_attempts` is `RetryPolicy(maximum_attempts=...)` with the policy's default backoff
    (give `retry_policy` for another; not both). `num_cpus`, `num_gpus`, `memory` and
    `resources` are what a plain `def` takes in its Ray task (an `async def` runs on the
    worker host's event loop and takes none), as `JobStep.resources` says.
    """
    if max_attempts is not None:
        if retry_policy is not None:
            raise TypeRegistryError("give max_attempts or retry_policy, not both")
        retry_policy = RetryPolicy(maximum_attempts=max_attempts)
    if retry_policy is not None and not isinstance(retry_policy, RetryPolicy):
        raise TypeRegistryError(f"retry_policy must be a RetryPolicy, got {retry_policy!r}")
    needs = dict(resources or {})
    for key, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus), ("memory", memory)):
        if value is not None:
            needs[key] = value
    for key, value in needs.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise TypeRegistryError(f"step resource {key!r} must be a number >= 0, got {value!r}")

    def decorate(fn: F) -> StepFunction[F]:
        return StepFunction(
            fn,
            name=name,
            retry_policy=retry_policy,
            resources=needs,
            checkpoint_after_every_batch=checkpoint_after_every_batch,
            registry=registry or default_registry,
        )

    return decorate if function is None else decorate(function)


class _FunctionPlan:
    """The job of a `@job` function: its steps are what the function returns."""

    plans: ClassVar[Callable[[Any], Any]]

    def prepare_steps(self, request: BaseModel) -> Any:
        return type(self).plans(request)


class JobFunction(Generic[F]):
    """A function made a job type by `@job`: start it with `jobs.start(fn, request)`."""

    def __init__(self, function: F, job_type: type[Job[Any]]) -> None:
        self.function = function
        self.job_type = job_type
        self.name = job_type.name
        self.__name__ = function.__name__
        self.__qualname__ = function.__qualname__
        self.__module__ = function.__module__
        self.__doc__ = function.__doc__
        self.__wrapped__ = function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<job function {self.name!r}>"


def job(
    *,
    name: str | None = None,
    keep_after_completed: bool = False,
    keep_after_completed_with_failures: bool = True,
    max_active_steps: int | None = None,
    max_step_attempts: int | None = None,
    retry_policy: RetryPolicy | None = None,
    registry: TypeRegistry | None = None,
) -> Callable[[Callable[[R], Iterable[StepDetails] | Awaitable[Iterable[StepDetails]]]], Any]:
    """Make a function that plans steps a job type: it takes the job's request (a pydantic
    model, by its annotation) and returns its steps, `[resize.plan(x) for x in request.images]`
    (a `stage=` on `plan` for stages). The settings are the `Job` class's of the same names."""

    def decorate(function: Callable[..., Any]) -> JobFunction[Any]:
        if not inspect.isfunction(function):
            raise TypeRegistryError(f"@job decorates a function, not {function!r}")
        parameters = list(inspect.signature(function).parameters.values())
        if len(parameters) != 1:
            raise TypeRegistryError(
                f"job function {function.__qualname__} takes one parameter, its request"
            )
        request_type = _hints(function).get(parameters[0].name)
        if not (isinstance(request_type, type) and issubclass(request_type, BaseModel)):
            raise TypeRegistryError(
                f"job function {function.__qualname__}: annotate its request with a pydantic "
                f"model, got {request_type!r}"
            )
        body = {
            "__module__": function.__module__,
            "__qualname__": function.__qualname__,
            "__doc__": function.__doc__,
            "plans": staticmethod(function),
            "keep_after_completed": keep_after_completed,
            "keep_after_completed_with_failures": keep_after_completed_with_failures,
            "max_active_steps": max_active_steps,
            "max_step_attempts": max_step_attempts,
            "retry_policy": retry_policy,
        }
        job_type: type[Job[Any]] = types.new_class(
            function.__name__,
            (_FunctionPlan, Job[request_type]),  # type: ignore[valid-type]
            {
                "name": name or f"{function.__module__}.{function.__qualname__}",
                "registry": registry or default_registry,
            },
            lambda ns: ns.update(body),
        )
        return JobFunction(function, job_type)

    return decorate


def job_class(job_type: type[Job[Any]] | JobFunction[Any]) -> type[Job[Any]]:
    """The `Job` class a start names: the class itself, or a `@job` function's."""
    return job_type.job_type if isinstance(job_type, JobFunction) else job_type
