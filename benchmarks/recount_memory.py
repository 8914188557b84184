"""What recovering a large job costs the process that recovers it (in process, no Ray).

    python benchmarks/recount_memory.py --steps 200000
    PYTHONPATH=<a checkout of other code> python benchmarks/recount_memory.py --steps 200000

A no-op fan-out of `--steps` steps runs to completion on an `InProcessCluster` over SQLite
(in a temporary directory); its record is then set back to Running, as a crash between its
last outcome and its completion leaves it, and a fresh manager resumes it: the resume reads
every step record, counts the job again from them and completes it. Printed: the process's
resident memory before the resume and its peak during it (sampled every 10 ms), and how long
the resume took.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import tempfile
import threading
import time

from choreography_ray.bench import BenchRequest, NoopFanOutInBackground
from choreography_ray.engine.clock import SystemClock
from choreography_ray.jobs import JobStatus
from choreography_ray.testing import InProcessCluster


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakSampler:
    """The process's peak resident memory while it is entered."""

    def __init__(self) -> None:
        self.peak = rss_mb()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.01):
            self.peak = max(self.peak, rss_mb())

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


async def measure(steps: int, directory: str) -> str:
    cluster = InProcessCluster(f"sqlite:///{directory}/jobs.db", clock=SystemClock())
    async with cluster:
        result = await cluster.start(NoopFanOutInBackground, BenchRequest(steps=steps))
        while True:
            await asyncio.sleep(1)
            state = await cluster.storage().jobs.get(result.job_id)
            if state.status.is_terminal:
                break
        if state.status != JobStatus.COMPLETED_SUCCESSFULLY:
            raise RuntimeError(f"the job ended {state.status.name}")
        await cluster.crash()
        state.status = JobStatus.RUNNING  # its completion lost: recovery counts it again
        state.progress.successful_steps = 0
        state.status_changes = state.status_changes[:-1]
        await cluster.storage().jobs.save(state)
        gc.collect()
        before = rss_mb()
        with PeakSampler() as sampler:
            began = time.perf_counter()
            answer = await cluster.manager().resume(result.job_id)
            took = time.perf_counter() - began
        final = await cluster.storage().jobs.get(result.job_id)
    counted = final.progress.successful_steps
    if final.status != JobStatus.COMPLETED_SUCCESSFULLY or counted != steps:
        raise RuntimeError(f"recovered as {final.status.name} with {counted} counted")
    return (
        f"{steps:,} records: {answer.name}, RSS before {before:.0f} MB, peak during the resume "
        f"{sampler.peak:.0f} MB (+{sampler.peak - before:.0f} MB), resume {took:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        print(asyncio.run(measure(args.steps, directory)))


if __name__ == "__main__":
    main()
