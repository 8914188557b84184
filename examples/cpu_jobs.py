"""A CPU-bound job: count the primes below a limit, one range of numbers per step.

The steps are plain `def perform`: on a cluster each one runs in a Ray task of its own, with
the CPU it declares, so the worker hosts' event loops stay free. A step counts its range in
chunks and checkpoints after each one; a step interrupted by a crash continues from its last
stored chunk instead of from the start of its range.

The host actors import this module by name ("cpu_jobs"): it must be importable wherever they
run. `cpu_bound.py` and `submit.py` show how.
"""

from __future__ import annotations

import asyncio
import itertools

from pydantic import BaseModel

import choreography_ray as cr


class CountPrimesRequest(BaseModel):
    limit: int = 2_000_000
    """Count the primes below this number."""
    ranges: int = 8
    """Split the numbers into this many ranges: one step each."""
    chunk: int = 25_000
    """Numbers a step counts between two checkpoints."""


class PrimeRange(BaseModel):
    start: int
    stop: int
    chunk: int


class PrimeRangeState(BaseModel):
    start: int
    stop: int
    chunk: int
    next: int
    """The first number not counted yet: where a re-run continues."""
    found: int = 0


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n < 4:
        return True
    if n % 2 == 0 or n % 3 == 0:
        return False
    k = 5
    while k * k <= n:
        if n % k == 0 or n % (k + 2) == 0:
            return False
        k += 6
    return True


@cr.step(name="examples.is-prime")
async def prime(n: int) -> bool:
    """A step function: `jobs.map(prime, range(200))` runs one step per number (`submit.py
    --job map`). Async: a test this quick is over before a Ray task of its own would start."""
    return is_prime(n)


class CountPrimesInRange(
    cr.JobStep[PrimeRange, PrimeRangeState, int], name="examples.count-primes-in-range"
):
    resources = {"num_cpus": 1}  # the Ray task of each run takes one CPU

    def initialize_state(self, request: PrimeRange) -> PrimeRangeState:
        return PrimeRangeState(
            start=request.start, stop=request.stop, chunk=request.chunk, next=request.start
        )

    def perform(self, state: PrimeRangeState, ctx: cr.StepContext) -> int:
        size = max(1, state.stop - state.start)
        while state.next < state.stop:
            ctx.raise_if_cancelled()  # a stop ends the run here; a resume continues from `next`
            end = min(state.next + state.chunk, state.stop)
            state.found += sum(1 for n in range(state.next, end) if is_prime(n))
            state.next = end
            ctx.checkpoint(state)
            ctx.progress(100 * (state.next - state.start) / size, f"{state.found} primes")
        return state.found


class CountPrimes(cr.Job[CountPrimesRequest], name="examples.count-primes"):
    keep_after_completed = True  # keep the job and its steps: the results are read from them

    def prepare_steps(self, request: CountPrimesRequest) -> list[cr.StepDetails]:
        ranges = max(1, request.ranges)
        bounds = [request.limit * i // ranges for i in range(ranges + 1)]
        return [
            self.create_step(
                CountPrimesInRange,
                PrimeRange(start=start, stop=stop, chunk=request.chunk),
                name=f"primes-{start}-{stop}",
            )
            for start, stop in itertools.pairwise(bounds)
        ]

    def details(self, request: CountPrimesRequest) -> str:
        return f"count the primes below {request.limit:,} in {request.ranges} ranges"


def prime_counts(storage: str, job_id: str) -> dict[str, int]:
    """Each step's count, by step name, read from the job's storage.

    Step results live with the steps, in storage; a driver reads them there (the job's hooks
    run on a controller host, not in the driver).
    """

    async def read() -> dict[str, int]:
        async with cr.open_storage(storage) as provider:
            steps = await provider.for_key().steps.get_for_job(job_id)
        return {
            step.name: int(step.result.data)  # type: ignore[arg-type]
            for step in steps
            if step.result is not None
        }

    return asyncio.run(read())
