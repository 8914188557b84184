"""A worker host's limits by the step's kind: explicit caps both, else the node's CPUs."""

from __future__ import annotations

import pytest

from choreography_ray.engine.limits import ASYNC_STEPS_PER_CPU, StepLimits, step_limits


@pytest.mark.parametrize(
    ("share", "cpus", "hosts", "expected"),
    [
        (None, 2, 1, StepLimits(256, 1)),
        (None, 8, 1, StepLimits(1024, 7)),
        (None, 8, 2, StepLimits(512, 4)),  # split among the node's worker hosts, rounded up
        (None, 1, 1, StepLimits(128, 1)),
        (None, None, 1, StepLimits(128, 1)),  # a node that says nothing of its CPUs
        (None, 0.5, 1, StepLimits(128, 1)),  # never below one of each
        (None, 3, 2, StepLimits(192, 1)),
        (5, 8, 1, StepLimits(5, 5)),  # an explicit limit caps both kinds alike
        (5, None, 3, StepLimits(5, 5)),  # a share is already the host's part
    ],
)
def test_step_limits(share, cpus, hosts, expected):
    assert step_limits(share, cpus, hosts) == expected


def test_the_async_window_grows_with_the_node():
    assert step_limits(None, 16).performing == 16 * ASYNC_STEPS_PER_CPU
