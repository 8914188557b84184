"""A job module that cannot be imported on a node labelled `placement-tests/no-picky`, as one
whose dependency is missing there: its job runs only where it imported."""

from __future__ import annotations

import ray

from choreography_ray.jobs import Job

from .placement_jobs import CountedStep, Spread

if (
    ray.is_initialized()
    and "placement-tests/no-picky" in ray.get_runtime_context().get_node_labels()
):
    raise ModuleNotFoundError("No module named 'picky_dependency'")


class PickyStep(CountedStep, name="placement-tests.picky-step"):
    """A step type of this module: it runs only where the module imported."""


class PickyJob(Job[Spread], name="placement-tests.picky"):
    keep_after_completed = True

    def prepare_steps(self, request: Spread):
        return [
            self.create_step(CountedStep, request.model_copy(update={"n": n}))
            for n in range(request.steps)
        ]
