"""How many worker hosts a worker node runs, and how many runs each performs at once.

A worker host is one process, bound to one core by the GIL, so by default a worker node runs one
per CPU, within bounds (`worker_hosts`). An async step mostly waits, so a node performs many at
once; a synchronous step is a Ray task that takes a CPU, so a node performs about as many as it
has CPUs. An explicit limit (the `max_parallel_steps` option, or a node's
`choreography.io/max-parallel-steps` label) caps both kinds alike. Each node's figures are split
among its worker hosts (`step_limits`). Plain arithmetic, so the rules are tested without a
cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

ASYNC_STEPS_PER_CPU = 128
"""By default, async steps a worker node performs at once per CPU of the node. An async step
mostly waits (on a service, a database, a sleep), so a window the size of the CPU count would
leave the node idle: 10 ms steps behind a window of one ran at under 100 per second. 128 per
CPU keeps a 2-CPU node's window (256) where no-op steps reach the host's own CPU limit."""

MAX_WORKER_HOSTS = 8
"""The most worker hosts a node runs when `workers_per_node` is not given. Each host is a
process of about 150 MB, so 8 take about 1.2 GB of the node's memory before any step runs; and
each is one more party to every batch a controller spreads, every stop and every load reading,
so past a few hosts the controller, not the worker hosts, sets the pace of short steps. A
node with more cores keeps them for the steps' own work (Ray tasks, threads); set
`workers_per_node` to run more hosts."""


def worker_hosts(cpus: float | None, limit: int | None = None) -> int:
    """How many worker hosts a worker node runs when `workers_per_node` is not given: one per
    whole CPU of the node (Ray's `CPU` resource of that node), at least 1, at most
    `MAX_WORKER_HOSTS`, and no more than the node's explicit step limit `limit` (each host
    performs at least one step, so more hosts than the limit would perform more than it).

    One host per CPU: a host's step bookkeeping (storage writes, reports, the event loop) is
    bound to one core by the GIL, so one host on a 2-CPU node left a core idle; two were
    measured faster (benchmarks/RESULTS.md)."""
    hosts = min(max(1, int(cpus or 1)), MAX_WORKER_HOSTS)
    return min(hosts, limit) if limit is not None else hosts


def host_part(total: int, hosts: int, index: int) -> int:
    """Worker host `index`'s part of a node's `total` among its `hosts`: the parts differ by
    at most one (the first hosts take the remainder) and add up to `total`, except that no
    part is below one (a host that may perform nothing would hold its runs forever)."""
    base, extra = divmod(total, max(1, hosts))
    return max(1, base + (1 if index < extra else 0))


@dataclass(frozen=True)
class StepLimits:
    """How many runs a worker host performs at once: of any kind, and of synchronous steps,
    whose Ray tasks each take a CPU of the node."""

    performing: int
    synchronous: int


def step_limits(
    limit: int | None, cpus: float | None, hosts: int = 1, index: int = 0
) -> StepLimits:
    """Worker host `index`'s limits, of its node's `hosts` worker hosts: its part of the node's
    explicit `limit` (`max_parallel_steps` or the node's label), which caps both kinds alike;
    else of the figures derived from the node's CPUs: async steps `ASYNC_STEPS_PER_CPU` per CPU,
    synchronous ones one per CPU but one (left to the hosts and Ray). The parts add up to the
    node's figure (`host_part`), except that each host performs at least one of each kind: with
    one host per CPU, a node performs one synchronous step per CPU."""
    if limit is not None:
        part = host_part(limit, hosts, index)
        return StepLimits(part, part)
    whole = max(1, int(cpus or 1))
    return StepLimits(
        performing=host_part(ASYNC_STEPS_PER_CPU * whole, hosts, index),
        synchronous=host_part(max(1, whole - 1), hosts, index),
    )
