"""Planning: turning `prepare_steps` into a saved plan, and checking it before anything runs.

Every request must survive the trip through JSON unchanged, because recovery prepares steps
from the saved JSON, never from the objects `prepare_steps` returned; `TypeRegistry.dump_request`
checks that on the JSON text storage writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..jobs.errors import ChoreographyError
from ..jobs.job import StepDetails
from ..jobs.registry import TypeKind, TypeRegistry, trusted
from ..jobs.state import PlannedStep


@dataclass(frozen=True)
class InvalidPlan(Exception):
    reason: str


def build_plan(details: Iterable[StepDetails], registry: TypeRegistry) -> list[PlannedStep]:
    """The plan of `details`, checked; raises `InvalidPlan` with a reason a person can act on."""
    plan: list[PlannedStep] = []
    seen: set[str] = set()
    names: dict[type, str] = {}  # a plan of thousands of steps has a handful of step types
    for index, detail in enumerate(details):
        if not isinstance(detail, StepDetails):
            raise InvalidPlan(
                f"prepare_steps returned {type(detail).__qualname__} at position {index}; "
                "build steps with create_step"
            )
        if detail.step_id in seen:
            raise InvalidPlan(f"step id {detail.step_id!r} is planned twice")
        seen.add(detail.step_id)
        try:
            step_name = names.get(detail.step_type)
            if step_name is None:
                step_name = registry.name_of(detail.step_type)
                registry.resolve(step_name, TypeKind.STEP)
                names[detail.step_type] = step_name
            payload = registry.dump_request(detail.request)
        except ChoreographyError as error:
            raise InvalidPlan(f"step {detail.step_id!r}: {error.message}") from error
        plan.append(
            trusted(
                PlannedStep,
                step_id=detail.step_id,
                stage=detail.stage,
                step_type=step_name,
                name=detail.name,
                request=payload,
            )
        )
    return plan


def plan_size(plan: list[PlannedStep]) -> int:
    """Bytes of the plan's JSON: what deciding inline against external storage weighs."""
    return sum(len(step.model_dump_json()) + 1 for step in plan) + 2
