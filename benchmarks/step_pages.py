"""How long one page of a 150,000-step job takes to read, per provider and query.

    python benchmarks/step_pages.py [--providers memory,sqlite,postgres] [--steps 150000]

Stores one job of `--steps` step records (two stages, plan positions, a last change each, one
step in fifty failed), then times pages of 50 through `steps.query`: the first page in plan
order, a page deep in the job (the cursor of the step 100,000 places in), the failed steps,
an id prefix, the first page by last change and one deep in it, and the matching count; then
the console's steps and job pages of that job, served over HTTP in this process.
Prints a Markdown table of the median and the slowest of `--runs` reads, in milliseconds.
PostgreSQL runs in a schema of its own, dropped afterwards (as `storage_bench.py` does).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import BaseModel
from storage_bench import drop_schema, url_for  # beside this script

from choreography_ray.jobs import (
    JobKey,
    JobState,
    JobStatus,
    JobStepState,
    JobStepStatus,
    StatusChange,
    TypeKind,
    TypeRegistry,
)
from choreography_ray.jobs.state import to_micros
from choreography_ray.storage import StepCursor, StepOrder, StepQuery, open_storage
from choreography_ray.storage.provider import StorageProvider

PAGE = 50
BATCH = 5_000
BASE = datetime(2026, 1, 1, tzinfo=UTC)


class PageState(BaseModel):
    shard: int
    done: int = 0


class PageStep:
    pass


class PageJob:
    pass


def registry() -> TypeRegistry:
    reg = TypeRegistry()
    reg.register(PageJob, kind=TypeKind.JOB, name="bench.page-job")
    reg.register(PageStep, kind=TypeKind.STEP, name="bench.page-step")
    reg.register(PageState, kind=TypeKind.STATE, name="bench.page-state")
    return reg


def record(reg: TypeRegistry, job_id: str, n: int, steps: int) -> JobStepState:
    """Step n of the plan: stage 0 for the first half, failed one in fifty, each changed
    at its own second."""
    status = JobStepStatus.FAILED if n % 50 == 7 else JobStepStatus.COMPLETED_SUCCESSFULLY
    return JobStepState(
        id=uuid.UUID(int=(n * 2654435761) % (1 << 128)).hex,
        job_id=job_id,
        type="bench.page-step",
        stage=0 if n < steps // 2 else 1,
        position=n,
        status=status,
        status_changes=[StatusChange(status=int(status), occurred=BASE + timedelta(seconds=n))],
        is_prepared=True,
        state=reg.dump(PageState(shard=n)),
    )


async def timed(call: Callable[[], Awaitable[object]], runs: int) -> tuple[float, float]:
    """Median and slowest of `runs` calls, in milliseconds."""
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        await call()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times), max(times)


async def measure(name: str, steps: int, runs: int) -> list[tuple[str, float, float]]:
    reg = registry()
    with tempfile.TemporaryDirectory() as directory:
        provider: StorageProvider = open_storage(url_for(name, Path(directory)), registry=reg)
        await provider.initialize()
        key = JobKey(scope=f"pages-{uuid.uuid4().hex[:8]}", namespace="bench")
        storage = provider.for_key(key).steps
        job_id = "job"
        try:
            for start in range(0, steps, BATCH):
                end = min(steps, start + BATCH)
                await storage.save_many([record(reg, job_id, n, steps) for n in range(start, end)])
            deep = record(reg, job_id, 100_000 % steps, steps)
            plan_cursor = StepCursor(
                order=StepOrder.PLAN, step_id=deep.id, stage=deep.stage, position=deep.position
            )
            changed = to_micros(deep.status_changes[-1].occurred)
            changed_cursor = StepCursor(order=StepOrder.CHANGED, step_id=deep.id, changed=changed)
            failed = frozenset({JobStepStatus.FAILED})
            queries = {
                "first page, plan order": StepQuery(take=PAGE),
                "page 100,000 steps in, plan order": StepQuery(take=PAGE, after=plan_cursor),
                "failed steps, plan order": StepQuery(take=PAGE, statuses=failed),
                "id prefix": StepQuery(take=PAGE, id_prefix=deep.id[:3]),
                "first page, last change": StepQuery(take=PAGE, order=StepOrder.CHANGED),
                "page 100,000 steps in, last change": StepQuery(
                    take=PAGE, order=StepOrder.CHANGED, after=changed_cursor
                ),
            }
            results = []
            for label, query in queries.items():
                page = await storage.query(job_id, query)
                assert page.steps, label
                median, slowest = await timed(lambda q=query: storage.query(job_id, q), runs)
                results.append((label, median, slowest))
            median, slowest = await timed(
                lambda: storage.count(job_id, StepQuery(statuses=failed)), runs
            )
            results.append(("count of failed steps", median, slowest))
            results.extend(await console_pages(provider, key, job_id, plan_cursor, runs))
            return results
        finally:
            await provider.for_key(key).steps.remove_all_for_job(job_id)
            await drop_schema(provider)
            await provider.close()


async def console_pages(
    provider: StorageProvider, key: JobKey, job_id: str, deep: StepCursor, runs: int
) -> list[tuple[str, float, float]]:
    """The console's pages of the job, served over HTTP in this process: what an operator
    waits for (the page rendered, the count of matching steps with it)."""
    from aiohttp.test_utils import TestClient, TestServer

    from choreography_ray.console import ConsoleSettings, JobsReader, create_app

    await provider.for_key(key).jobs.save(
        JobState(id=job_id, key=key, type="bench.page-job", created=BASE, status=JobStatus.RUNNING)
    )
    app = create_app(JobsReader(provider), settings=ConsoleSettings(page_size=PAGE))
    where = f"?scope={key.scope}&namespace={key.namespace}"
    targets = {
        "console: steps page, first": f"/jobs/{job_id}/steps{where}",
        "console: steps page, 100,000 in": f"/jobs/{job_id}/steps{where}&after={deep.token()}",
        "console: failed steps page": f"/jobs/{job_id}/steps{where}&status=failed",
        "console: job page (failed first)": f"/jobs/{job_id}{where}",
    }
    results = []
    async with TestClient(TestServer(app)) as client:

        async def get(target: str) -> None:
            answer = await client.get(target)
            assert answer.status == 200, (target, answer.status, await answer.text())
            await answer.read()

        for label, target in targets.items():
            await get(target)
            median, slowest = await timed(lambda t=target: get(t), runs)
            results.append((label, median, slowest))
    await provider.for_key(key).jobs.remove(job_id)
    return results


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--providers", default="memory,sqlite,postgres")
    parser.add_argument("--steps", type=int, default=150_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    names = [n.strip() for n in args.providers.split(",") if n.strip()]
    measured = {name: await measure(name, args.steps, args.runs) for name in names}
    print(f"{args.steps:,} steps, pages of {PAGE}; median / slowest of {args.runs} reads, ms\n")
    print("| query | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    labels = [label for label, _, _ in measured[names[0]]]
    for row, label in enumerate(labels):
        cells = [f"{measured[n][row][1]:.1f} / {measured[n][row][2]:.1f}" for n in names]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    asyncio.run(main())
