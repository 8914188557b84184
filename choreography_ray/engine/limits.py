"""How many runs a worker host performs at once, by the step's kind.

An async step mostly waits, so a node performs many at once; a synchronous step is a Ray task
that takes a CPU, so a node performs about as many as it has CPUs. An explicit limit (the
`max_parallel_steps` option, or a node's `choreography.io/max-parallel-steps` label) caps both
kinds alike. Plain arithmetic, so the rule is tested without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

ASYNC_STEPS_PER_CPU = 128
"""By default, async steps a worker node performs at once per CPU of the node. An async step
mostly waits (on a service, a database, a sleep), so a window the size of the CPU count would
leave the node idle: 10 ms steps behind a window of one ran at under 100 per second. 128 per
CPU keeps a 2-CPU node's window (256) where no-op steps reach the host's own CPU limit."""


@dataclass(frozen=True)
class StepLimits:
    """How many runs a worker host performs at once: of any kind, and of synchronous steps,
    whose Ray tasks each take a CPU of the node."""

    performing: int
    synchronous: int


def step_limits(share: int | None, cpus: float | None, hosts: int = 1) -> StepLimits:
    """A worker host's limits: its `share` of an explicit node limit (`max_parallel_steps` or
    the node's label), which caps both kinds alike; else derived from the node's CPUs, split
    among its `hosts` worker hosts (rounded up): async steps `ASYNC_STEPS_PER_CPU` per CPU,
    synchronous ones one per CPU but one (left to the hosts and Ray)."""
    if share is not None:
        return StepLimits(share, share)
    whole = max(1, int(cpus or 1))
    return StepLimits(
        performing=-(-ASYNC_STEPS_PER_CPU * whole // hosts),
        synchronous=-(-max(1, whole - 1) // hosts),
    )
