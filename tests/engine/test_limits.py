"""A node's worker hosts from its CPUs, and a worker host's limits by the step's kind:
explicit caps both, else the node's CPUs, split among the node's worker hosts."""

from __future__ import annotations

import pytest

from choreography_ray.engine.limits import (
    ASYNC_STEPS_PER_CPU,
    MAX_WORKER_HOSTS,
    StepLimits,
    host_part,
    step_limits,
    worker_hosts,
)


@pytest.mark.parametrize(
    ("cpus", "limit", "hosts"),
    [
        (2, None, 2),  # one per CPU
        (1, None, 1),
        (4, None, 4),
        (2.5, None, 2),  # whole CPUs
        (0.5, None, 1),  # at least one
        (0, None, 1),
        (None, None, 1),  # a node that says nothing of its CPUs
        (8, None, 8),
        (64, None, MAX_WORKER_HOSTS),  # at most the cap
        (8, 3, 3),  # no more hosts than the node's explicit step limit
        (8, 1, 1),
        (2, 16, 2),
    ],
)
def test_a_node_runs_one_worker_host_per_cpu_within_bounds(cpus, limit, hosts):
    assert worker_hosts(cpus, limit) == hosts


def test_the_cap_is_eight():
    assert MAX_WORKER_HOSTS == 8


@pytest.mark.parametrize(
    ("total", "hosts", "parts"),
    [
        (8, 2, [4, 4]),
        (7, 2, [4, 3]),  # the first hosts take the remainder
        (10, 4, [3, 3, 2, 2]),
        (1, 2, [1, 1]),  # never below one
        (256, 2, [128, 128]),
    ],
)
def test_a_nodes_figure_is_split_among_its_hosts(total, hosts, parts):
    assert [host_part(total, hosts, index) for index in range(hosts)] == parts


@pytest.mark.parametrize(
    ("limit", "cpus", "hosts", "index", "expected"),
    [
        (None, 2, 1, 0, StepLimits(256, 1)),
        (None, 8, 1, 0, StepLimits(1024, 7)),
        (None, 8, 2, 0, StepLimits(512, 4)),  # split among the node's worker hosts
        (None, 8, 2, 1, StepLimits(512, 3)),  # 7 synchronous steps: 4 + 3
        (None, 1, 1, 0, StepLimits(128, 1)),
        (None, None, 1, 0, StepLimits(128, 1)),  # a node that says nothing of its CPUs
        (None, 0.5, 1, 0, StepLimits(128, 1)),  # never below one of each
        (None, 3, 2, 0, StepLimits(192, 1)),
        (None, 3, 2, 1, StepLimits(192, 1)),
        (None, 2, 2, 0, StepLimits(128, 1)),  # the default on a 2-CPU node: two hosts
        (None, 2, 2, 1, StepLimits(128, 1)),  # each performs at least one synchronous step
        (5, 8, 1, 0, StepLimits(5, 5)),  # an explicit limit caps both kinds alike
        (5, None, 3, 0, StepLimits(2, 2)),  # the node's limit, split: 2 + 2 + 1
        (5, None, 3, 2, StepLimits(1, 1)),
        (4, 8, 2, 1, StepLimits(2, 2)),
    ],
)
def test_step_limits(limit, cpus, hosts, index, expected):
    assert step_limits(limit, cpus, hosts, index) == expected


@pytest.mark.parametrize("cpus", [1, 2, 3, 4, 8, 16])
def test_the_default_hosts_of_a_node_perform_its_figures_exactly(cpus):
    """The derived hosts of a node add up to the node's own figures: async steps 128 per CPU,
    and at most one synchronous step per host beyond the CPUs but one."""
    hosts = worker_hosts(cpus)
    parts = [step_limits(None, cpus, hosts, index) for index in range(hosts)]
    assert sum(p.performing for p in parts) == ASYNC_STEPS_PER_CPU * cpus
    assert sum(p.synchronous for p in parts) == max(hosts, cpus - 1)


@pytest.mark.parametrize(("limit", "cpus"), [(1, 8), (3, 8), (7, 4), (100, 16)])
def test_an_explicit_node_limit_holds_with_the_default_hosts(limit, cpus):
    hosts = worker_hosts(cpus, limit)
    parts = [step_limits(limit, cpus, hosts, index) for index in range(hosts)]
    assert sum(p.performing for p in parts) == sum(p.synchronous for p in parts) == limit


def test_the_async_window_grows_with_the_node():
    assert step_limits(None, 16).performing == 16 * ASYNC_STEPS_PER_CPU
