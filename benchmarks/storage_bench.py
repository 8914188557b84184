"""Storage throughput per provider, beside raw sqlite3 measured in the same run.

    python benchmarks/storage_bench.py [--providers memory,sqlite,postgres,mongomock] [--runs 5]

For each provider: rows/s for `save_many` of 10,000 new step records, for versioned updates of
those records in batches of 100, and for single-record versioned updates. Raw sqlite3 (one
batched insert; single-row commits, both in WAL mode) is the yardstick. Prints a Markdown table
of medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sqlite3
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from pydantic import BaseModel

from choreography_ray.jobs import JobKey, JobStepState, JobStepStatus, TypeKind, TypeRegistry
from choreography_ray.storage import open_storage

ROWS = 10_000
BATCH = 100
SINGLE = 2_000


class BenchState(BaseModel):
    shard: int
    done: int = 0


class BenchStep:
    pass


def registry() -> TypeRegistry:
    reg = TypeRegistry()
    reg.register(BenchStep, kind=TypeKind.STEP, name="bench.step")
    reg.register(BenchState, kind=TypeKind.STATE, name="bench.state")
    return reg


def steps(reg: TypeRegistry, job_id: str, count: int) -> list[JobStepState]:
    return [
        JobStepState(
            id=f"step-{n:06}",
            job_id=job_id,
            type="bench.step",
            status=JobStepStatus.SCHEDULED,
            stage=n % 2,
            is_prepared=True,
            state=reg.dump(BenchState(shard=n)),
        )
        for n in range(count)
    ]


def url_for(name: str, workdir: Path) -> str:
    if name == "memory":
        return f"memory://bench-{uuid.uuid4().hex}"
    if name == "sqlite":
        return f"sqlite:///{workdir / uuid.uuid4().hex}.db"
    if name == "postgres":
        base = os.environ.get(
            "CHOREOGRAPHY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        )
        sep = "&" if "?" in base else "?"
        return f"{base}{sep}schema=bench_{uuid.uuid4().hex[:12]}"
    if name == "mongomock":
        return f"mongomock://localhost/bench_{uuid.uuid4().hex[:12]}"
    if name == "mongodb":
        return os.environ["CHOREOGRAPHY_TEST_MONGODB_URL"]
    raise SystemExit(f"unknown provider {name!r}")


async def measure(name: str, workdir: Path) -> dict[str, float]:
    reg = registry()
    provider = open_storage(url_for(name, workdir), registry=reg)
    await provider.initialize()
    try:
        store = provider.for_key(JobKey(scope="bench", namespace=uuid.uuid4().hex[:8]))
        batch = steps(reg, "job", ROWS)
        start = time.perf_counter()
        versions = await store.steps.save_many(batch)
        insert = ROWS / (time.perf_counter() - start)

        for step, version in zip(batch, versions, strict=True):
            step.version = version
            step.status = JobStepStatus.RUNNING
        start = time.perf_counter()
        for offset in range(0, ROWS, BATCH):
            chunk = batch[offset : offset + BATCH]
            for step, version in zip(chunk, await store.steps.save_many(chunk), strict=True):
                step.version = version
        batched = ROWS / (time.perf_counter() - start)

        start = time.perf_counter()
        for step in batch[:SINGLE]:
            step.status = JobStepStatus.COMPLETED_SUCCESSFULLY
            step.version = await store.steps.save(step)
        single = SINGLE / (time.perf_counter() - start)
        if name == "postgres":
            await drop_schema(provider)
        return {"insert": insert, "batched": batched, "single": single}
    finally:
        await provider.close()


async def drop_schema(provider) -> None:
    schema = provider.url.query.get("schema")
    engine = getattr(provider, "engine", None)
    if schema and engine is not None:
        from sqlalchemy import text

        def drop() -> None:
            with engine.begin() as connection:
                connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))

        await asyncio.to_thread(drop)


def raw_sqlite(workdir: Path, *, encode: bool = False) -> dict[str, float]:
    """The yardstick: sqlite3 with WAL and a JSON column like ours, no framework.

    With `encode`, the timed loops also turn each step into JSON with pydantic, as every
    provider must: the fair floor for a provider's own overhead.
    """
    reg = registry()
    records = steps(reg, "job", ROWS)
    documents = [s.model_dump_json() for s in records]
    db = sqlite3.connect(workdir / f"raw-{uuid.uuid4().hex}.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(
        "CREATE TABLE steps (job_id TEXT, step_id TEXT, status INT, version INT, state TEXT,"
        " PRIMARY KEY (job_id, step_id))"
    )
    start = time.perf_counter()
    if encode:
        documents = [s.model_dump_json() for s in records]
    rows = [("job", f"step-{n:06}", 1, 1, doc) for n, doc in enumerate(documents)]
    db.execute("BEGIN")
    db.executemany("INSERT INTO steps VALUES (?, ?, ?, ?, ?)", rows)
    db.execute("COMMIT")
    insert = ROWS / (time.perf_counter() - start)
    start = time.perf_counter()
    for n in range(SINGLE):
        db.execute("BEGIN")
        db.execute(
            "UPDATE steps SET status = 3, version = version + 1, state = ?"
            " WHERE job_id = 'job' AND step_id = ? AND version = 1",
            (records[n].model_dump_json() if encode else documents[n], f"step-{n:06}"),
        )
        db.execute("COMMIT")
    single = SINGLE / (time.perf_counter() - start)
    db.close()
    return {"insert": insert, "batched": float("nan"), "single": single}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--providers", default="memory,sqlite,postgres,mongomock")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    names = [n.strip() for n in args.providers.split(",") if n.strip()]
    results: dict[str, list[dict[str, float]]] = {"raw sqlite3": [], "raw sqlite3 + JSON": []}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for _ in range(args.runs):
            results["raw sqlite3"].append(raw_sqlite(workdir))
            results["raw sqlite3 + JSON"].append(raw_sqlite(workdir, encode=True))
            for name in names:
                results.setdefault(name, []).append(asyncio.run(measure(name, workdir)))
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(f"median of {args.runs} runs; rows/s\n")
    print("| provider | save_many 10,000 new | updates in batches of 100 | single updates |")
    print("|---|---:|---:|---:|")
    for name, runs in results.items():
        cells = []
        for column in ("insert", "batched", "single"):
            values = [r[column] for r in runs]
            median = statistics.median(values)
            cells.append("—" if median != median else f"{median:,.0f}")
        print(f"| {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
