"""`@step` and `@job`: functions made step and job types, typed by their annotations."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

import choreography_ray as cr
from choreography_ray.jobs import TypeKind, TypeRegistry
from choreography_ray.jobs.errors import InvalidRequestError, TypeRegistryError


class Image(BaseModel):
    url: str


class Thumb(BaseModel):
    url: str
    width: int


class Batch(BaseModel):
    urls: list[str]


@dataclasses.dataclass
class Point:
    x: int
    y: int


@pytest.fixture
def registry() -> TypeRegistry:
    return TypeRegistry()


def test_a_step_function_is_a_registered_step_type_typed_by_its_annotations(registry):
    @cr.step(name="tests.fn.resize", registry=registry)
    async def resize(image: Image, ctx: cr.StepContext) -> Thumb:
        return Thumb(url=image.url, width=ctx.attempt)

    assert registry.resolve("tests.fn.resize", TypeKind.STEP) is resize.step_type
    assert resize.step_type.request_type is Image  # a model item is stored as itself
    assert resize.step_type.result_type is Thumb
    assert resize.step_type.is_async()
    assert resize.name == "tests.fn.resize"


def test_a_builtin_or_dataclass_item_is_stored_in_a_root_model_named_after_the_step(registry):
    @cr.step(name="tests.fn.norm", registry=registry)
    def norm(point: Point) -> float:
        return (point.x**2 + point.y**2) ** 0.5

    model = registry.resolve("tests.fn.norm:item", TypeKind.REQUEST)
    assert norm.step_type.request_type is model
    assert registry.knows("tests.fn.norm:result", TypeKind.RESULT)
    assert not norm.step_type.is_async()  # a plain def runs off the loop, as sync steps do
    request = norm.item({"x": 3, "y": 4})
    assert request.root == Point(3, 4)  # type: ignore[attr-defined]
    assert norm.call(request, None) == 5.0  # type: ignore[arg-type]


def test_the_context_goes_to_the_parameter_annotated_step_context_wherever_it_is(registry):
    seen: list[Any] = []

    @cr.step(name="tests.fn.ctx-first", registry=registry)
    def first(ctx: cr.StepContext, value: int) -> int:
        seen.append(ctx)
        return value + 1

    assert first.call(first.item(41), "the context") == 42  # type: ignore[arg-type]
    assert seen == ["the context"]


def test_the_decorated_function_is_still_the_function(registry):
    @cr.step(registry=registry)
    def double(value: int) -> int:
        return value * 2

    assert double(21) == 42
    assert (
        double.name
        == f"{__name__}.test_the_decorated_function_is_still_the_function.<locals>.double"
    )
    assert double.__name__ == "double"


def test_unannotated_items_and_results_are_any_json(registry):
    @cr.step(name="tests.fn.any", registry=registry)
    def echo(value):  # type: ignore[no-untyped-def]
        return value

    assert echo.item({"a": [1, 2]}).root == {"a": [1, 2]}  # type: ignore[attr-defined]


def test_max_attempts_is_a_retry_policy_and_resources_go_to_the_ray_task(registry):
    @cr.step(name="tests.fn.opts", max_attempts=3, num_cpus=2, memory=1e9, registry=registry)
    def heavy(value: int) -> int:
        return value

    assert heavy.step_type.retry_policy == cr.RetryPolicy(maximum_attempts=3)
    assert heavy.step_type.resources == {"num_cpus": 2, "memory": 1e9}

    policy = cr.RetryPolicy(maximum_attempts=2, initial_interval=timedelta(seconds=5))

    @cr.step(
        name="tests.fn.policy",
        retry_policy=policy,
        checkpoint_after_every_batch=True,
        registry=registry,
    )
    def light(value: int) -> int:
        return value

    assert light.step_type.retry_policy is policy
    assert light.step_type.checkpoint_after_every_batch


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 2, "retry_policy": cr.RetryPolicy()}, "not both"),
        ({"max_attempts": 0}, "maximum_attempts"),
        ({"num_cpus": -1}, "'num_cpus' must be a number >= 0"),
        ({"retry_policy": 3}, "must be a RetryPolicy"),
    ],
)
def test_bad_step_options_are_refused_when_decorating(registry, options, message):
    with pytest.raises(cr.ChoreographyError, match=message):

        @cr.step(name="tests.fn.bad", registry=registry, **options)
        def bad(value: int) -> int:
            return value


def test_a_step_function_takes_exactly_one_item(registry):
    with pytest.raises(TypeRegistryError, match="has no default"):

        @cr.step(name="tests.fn.two", registry=registry)
        def two(a: int, b: int) -> int:
            return a + b

    with pytest.raises(TypeRegistryError, match="must take the item"):

        @cr.step(name="tests.fn.none", registry=registry)
        def none(ctx: cr.StepContext) -> int:
            return 1

    @cr.step(name="tests.fn.defaults", registry=registry)
    def with_default(a: int, scale: int = 2) -> int:
        return a * scale

    assert with_default.call(with_default.item(3), None) == 6  # type: ignore[arg-type]


def test_an_item_that_does_not_fit_the_annotation_is_refused_naming_it(registry):
    @cr.step(name="tests.fn.typed", registry=registry)
    def typed(image: Image) -> int:
        return 1

    assert typed.item({"url": "a"}) == Image(url="a")
    with pytest.raises(InvalidRequestError, match=r"takes Image items, not 42"):
        typed.item(42)


def test_plan_makes_a_step_of_the_item_for_a_job(registry):
    @cr.step(name="tests.fn.plan", registry=registry)
    def planned(value: int) -> int:
        return value

    details = planned.plan(7, stage=2, name="seven")
    assert details.step_type is planned.step_type
    assert details.request.root == 7  # type: ignore[attr-defined]
    assert (details.stage, details.name) == (2, "seven")
    assert planned.plan(7).step_id != details.step_id
    with pytest.raises(ValueError, match="stage must be a whole number"):
        planned.plan(7, stage=-1)


def test_a_job_function_is_a_registered_job_type_whose_steps_are_what_it_returns(registry):
    @cr.step(name="tests.fn.job-step", registry=registry)
    def resize(image: Image) -> int:
        return 1

    @cr.job(name="tests.fn.batch", keep_after_completed=True, max_active_steps=5, registry=registry)
    def batch(request: Batch):  # type: ignore[no-untyped-def]
        return [resize.plan(Image(url=u)) for u in request.urls]

    job_type = registry.resolve("tests.fn.batch", TypeKind.JOB)
    assert job_type is batch.job_type
    assert job_type.request_type is Batch
    assert (job_type.keep_after_completed, job_type.max_active_steps) == (True, 5)
    steps = job_type().prepare_steps(Batch(urls=["a", "b"]))
    assert [s.request.url for s in steps] == ["a", "b"]
    assert cr.jobs.functions.job_class(batch) is job_type


def test_a_job_function_takes_its_request_as_a_pydantic_model(registry):
    with pytest.raises(TypeRegistryError, match="annotate its request with a pydantic model"):

        @cr.job(name="tests.fn.untyped", registry=registry)
        def untyped(request: int):  # type: ignore[no-untyped-def]
            return []

    with pytest.raises(TypeRegistryError, match="takes one parameter"):

        @cr.job(name="tests.fn.two-params", registry=registry)
        def two(request: Image, other: Image):  # type: ignore[no-untyped-def]
            return []


def test_redecorating_the_same_function_replaces_its_registration(registry):
    """A re-executed module (a notebook cell, a reload) defines the function again."""

    def define() -> Any:
        @cr.step(name="tests.fn.again", registry=registry)
        def again(value: int) -> int:
            return value

        return again

    first, second = define(), define()
    assert registry.resolve("tests.fn.again", TypeKind.STEP) is second.step_type
    assert first.step_type is not second.step_type
