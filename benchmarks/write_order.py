"""What persist-first costs beside the seed's report-first, counted in-process (no Ray).

    python benchmarks/write_order.py --steps 1000 --runs 3
    python benchmarks/write_order.py --steps 1000 --runs 3 --storage sqlite

The engine persists every outcome before it reports it. The seed reports a failure or a stop
first, and persists it once the job has accepted it (a success is persisted, then reported, in
both). This script runs, on a fresh `InProcessCluster` each time (one worker host):

  failures  a job of N steps that each fail at once (non-retryable; the stage goes on), from
            the start to the job's completion, with the default `max_parallel_steps` (or
            `--parallel`), so outcomes reach the job in several batches;
  stop      a job of N steps that all run until cancelled (`max_parallel_steps` = N), stopped:
            from the stop to the stop's finalization (every step reported).

and counts, as built: step-record rows written and the flushes (group commits) that wrote them,
job-record writes, storage calls (reads and writes), report messages (batches a worker sent) and
the reports in them, and the wall time. From the same counters it derives what report-first
would cost, under the seed's rules: each report batch of failures or stops is answered only
once the job has counted it (a second message, which the worker waits for), and only then is
the batch's outcome written, so a quick step's Running write can no longer join its outcome's
group commit. See docs/decisions.md, "Stopping and draining", for the reading of the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import choreography_ray as cr
from choreography_ray.jobs.job import JobStageFailureBehavior
from choreography_ray.storage.protocols import JobsStorage
from choreography_ray.testing import InProcessCluster


class Batch(BaseModel):
    steps: int


class Item(BaseModel):
    n: int


class FailAtOnce(cr.JobStep[Item, Item, int], name="benchmarks.write-order.fail"):
    def initialize_state(self, request: Item) -> Item:
        return request

    async def perform(self, state: Item, ctx: cr.StepContext) -> int:
        raise cr.StepFailed(f"item {state.n} failed", non_retryable=True)


class RunUntilStopped(cr.JobStep[Item, Item, int], name="benchmarks.write-order.run"):
    def initialize_state(self, request: Item) -> Item:
        return request

    async def perform(self, state: Item, ctx: cr.StepContext) -> int:
        await ctx.wait_cancelled()
        raise cr.StepCancelled()


class Failures(cr.Job[Batch], name="benchmarks.write-order.failures"):
    keep_after_completed_with_failures = True

    def prepare_steps(self, request: Batch) -> list[Any]:
        return [self.create_step(FailAtOnce, Item(n=n)) for n in range(request.steps)]

    def failure_behavior_for(self, stage: int) -> JobStageFailureBehavior:
        return JobStageFailureBehavior.CONTINUE_WITH_NEXT_STAGE


class Stoppable(cr.Job[Batch], name="benchmarks.write-order.stoppable"):
    def prepare_steps(self, request: Batch) -> list[Any]:
        return [self.create_step(RunUntilStopped, Item(n=n)) for n in range(request.steps)]


class _Counted:
    """A store whose every call is counted (and timed, for writes of step records)."""

    def __init__(self, inner: Any, name: str, counts: Counter[str], flush_seconds: list[float]):
        self._inner = inner
        self._name = name
        self._counts = counts
        self._flush_seconds = flush_seconds

    def __getattr__(self, attribute: str) -> Any:
        target = getattr(self._inner, attribute)
        if not callable(target) or attribute.startswith("_"):
            return target
        what = f"{self._name}.{attribute}"

        async def call(*args: Any, **kwargs: Any) -> Any:
            self._counts[what] += 1
            began = time.perf_counter()
            try:
                return await target(*args, **kwargs)
            finally:
                if what == "steps.save_many":
                    self._flush_seconds.append(time.perf_counter() - began)

        return call


@dataclass
class Counts:
    """What one scenario did, as built."""

    seconds: float = 0.0
    storage: Counter[str] = field(default_factory=Counter)
    flush_seconds: list[float] = field(default_factory=list)
    rows_in_window: int = 0
    flushes_in_window: int = 0
    reports: int = 0
    report_messages: int = 0

    def wrap(self, storage: JobsStorage) -> JobsStorage:
        return JobsStorage(
            key=storage.key,
            jobs=_Counted(storage.jobs, "jobs", self.storage, self.flush_seconds),
            steps=_Counted(storage.steps, "steps", self.storage, self.flush_seconds),
            plans=(
                _Counted(storage.plans, "plans", self.storage, self.flush_seconds)
                if storage.plans
                else None
            ),
        )

    @property
    def calls(self) -> int:
        return sum(self.storage.values())

    @property
    def job_writes(self) -> int:
        return self.storage["jobs.save"]


def _count_reports(cluster: InProcessCluster, counts: Counts) -> None:
    deliver = cluster.report

    async def report(job_key: Any, job_id: str, reports: Any) -> None:
        counts.report_messages += 1
        counts.reports += len(reports)
        await deliver(job_key, job_id, reports)

    cluster.report = report  # type: ignore[method-assign]


async def _scenario(
    kind: str, steps: int, storage_url: str | None, parallel: int | None
) -> tuple[Counts, Counts]:
    """(the whole run, the measured window: the failures' run or the stop)."""
    whole = Counts()
    options = cr.JobsOptions(max_parallel_steps=steps if kind == "stop" else parallel)
    cluster = InProcessCluster(storage_url, options=options, wrap_storage=whole.wrap)
    async with cluster:
        _count_reports(cluster, whole)
        worker = cluster.worker
        if kind == "failures":
            before = _snapshot(whole, worker)
            began = time.perf_counter()
            result = await cluster.start(Failures, Batch(steps=steps))
            state = await cluster.wait(result.job_id)
            assert state is not None and state.progress.failed_steps == steps, state
        else:
            result = await cluster.start(Stoppable, Batch(steps=steps))
            await cluster.settle()  # every step runs, its Running written
            before = _snapshot(whole, worker)
            began = time.perf_counter()
            await cluster.manager().stop(result.job_id)
            state = await cluster.wait(result.job_id)
            assert state is not None and state.stop_finalized, state
            assert state.progress.stopped_steps == steps, state.progress
        window = _since(before, whole, worker)
        window.seconds = time.perf_counter() - began
    return whole, window


def _snapshot(counts: Counts, worker: Any) -> Counts:
    stats = worker.writers.stats()
    return Counts(
        storage=Counter(counts.storage),
        flush_seconds=list(counts.flush_seconds),
        rows_in_window=stats["step_rows"],
        flushes_in_window=stats["step_batches"],
        reports=counts.reports,
        report_messages=counts.report_messages,
    )


def _since(before: Counts, now: Counts, worker: Any) -> Counts:
    stats = worker.writers.stats()
    storage = Counter(now.storage)
    storage.subtract(before.storage)
    return Counts(
        storage=+storage,
        flush_seconds=now.flush_seconds[len(before.flush_seconds) :],
        rows_in_window=stats["step_rows"] - before.rows_in_window,
        flushes_in_window=stats["step_batches"] - before.flushes_in_window,
        reports=now.reports - before.reports,
        report_messages=now.report_messages - before.report_messages,
    )


@dataclass
class Derived:
    """Report-first's cost for the same window, from the counters of the run as built."""

    rows: int
    flushes_at_least: int
    messages: int
    waits: int


def derive(kind: str, steps: int, window: Counts) -> Derived:
    """Report-first, under the seed's rules, for the same outcomes:

    - every report batch (a message) is answered once the job has counted it: a second
      message per batch, and the worker waits for it before it writes the batch's outcomes;
    - the outcome is written after the answer, so it cannot share a group commit with the
      step's Running write: for quick failures, one row more per step than as built, whose
      Running and outcome went out together (the stop's steps wrote Running before the stop,
      so their rows do not change);
    - the outcomes of a batch are written once its answer is back: at least one flush per
      answered batch, besides the flushes of the Running writes.
    """
    if kind == "failures":
        rows = 2 * steps  # Running, then the outcome once accepted
        running_flushes = max(1, window.flushes_in_window)
    else:
        rows = window.rows_in_window
        running_flushes = 0
    return Derived(
        rows=rows,
        flushes_at_least=running_flushes + window.report_messages,
        messages=2 * window.report_messages,
        waits=window.report_messages,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--storage", choices=("memory", "sqlite"), default="memory")
    parser.add_argument("--parallel", type=int, default=None, help="failures' max_parallel_steps")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        for kind in ("failures", "stop"):
            runs: list[Counts] = []
            for index in range(args.runs):
                url = None
                if args.storage == "sqlite":
                    url = f"sqlite:///{Path(directory) / f'{kind}-{index}.db'}"
                _, window = asyncio.run(_scenario(kind, args.steps, url, args.parallel))
                runs.append(window)
            _print(kind, args.steps, args.storage, runs)
    print(f"\n(default max_parallel_steps here: {cr.JobsOptions().effective_max_parallel_steps})")


def _median(runs: list[Counts], value: Callable[[Counts], float]) -> float:
    return statistics.median(value(run) for run in runs)


def _print(kind: str, steps: int, storage: str, runs: list[Counts]) -> None:
    middle = sorted(runs, key=lambda run: run.seconds)[len(runs) // 2]
    derived = derive(kind, steps, middle)
    flush = statistics.median(middle.flush_seconds) if middle.flush_seconds else 0.0
    print(f"\n== {kind}: N={steps}, {storage}, median of {len(runs)} runs by wall time ==")
    print(f"wall seconds              {_median(runs, lambda r: r.seconds):.3f}")
    print("                          as built (persist-first)   report-first (derived)")
    print(f"step-record rows          {middle.rows_in_window:>10}                 {derived.rows}")
    print(
        f"step-record flushes       {middle.flushes_in_window:>10}"
        f"                 >= {derived.flushes_at_least}"
    )
    print(
        f"report messages           {middle.report_messages:>10}"
        f"                 {derived.messages} ({derived.waits} answers waited for)"
    )
    print(f"reports                   {middle.reports:>10}                 {middle.reports}")
    print(f"job-record writes         {middle.job_writes:>10}                 (same)")
    print(f"storage calls             {middle.calls:>10}")
    print(f"median flush seconds      {flush:>10.5f}")
    print(
        "storage calls by kind     "
        + ", ".join(f"{k}={v}" for k, v in sorted(middle.storage.items()))
    )


if __name__ == "__main__":
    main()
