"""The peer a Python user would pick instead: DBOS Transact, measured like the fan-out.

One workflow with one no-op step per unit, enqueued on a DBOS queue, N units, from the first
enqueue to the last result. DBOS persists, per unit, the workflow's status row (enqueued,
then pending, then its result) and the step's output in its system database: comparable to
choreography_ray's step record with its Running and outcome writes.

Run in a process of its own (DBOS is a process-wide singleton):

    python benchmarks/dbos_peer.py --units 10000 --storage sqlite --directory /tmp/x
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def dbos_fanout(units: int, storage: str, postgres: str, workdir: Path) -> float:
    """Seconds for `units` units, measured in a fresh process."""
    answer = subprocess.run(
        [
            sys.executable,
            str(Path(__file__)),
            "--units",
            str(units),
            "--storage",
            storage,
            "--postgres",
            postgres,
            "--directory",
            str(workdir),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if answer.returncode != 0:
        raise RuntimeError(f"the DBOS run failed:\n{answer.stderr[-2000:]}")
    return float(json.loads(answer.stdout.strip().splitlines()[-1])["seconds"])


def _database_url(storage: str, postgres: str, directory: Path) -> str:
    stamp = time.time_ns()
    if storage == "sqlite":
        return f"sqlite:///{directory / f'dbos-{stamp}.sqlite'}"
    # A database of this run on the same server, created and dropped here.
    import sqlalchemy

    name = f"dbos_bench_{stamp}"
    engine = sqlalchemy.create_engine(postgres, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return postgres.rsplit("/", 1)[0] + f"/{name}"


def _drop(postgres: str, name: str) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--units", type=int, required=True)
    parser.add_argument("--storage", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--directory", default=".")
    args = parser.parse_args()

    from dbos import DBOS, DBOSConfig

    url = _database_url(args.storage, args.postgres, Path(args.directory))
    config: DBOSConfig = {"name": "choreography-bench", "system_database_url": url}
    DBOS(config=config)

    @DBOS.step()
    def noop(n: int) -> int:
        return n

    @DBOS.workflow()
    def unit(n: int) -> int:
        return noop(n)

    DBOS.launch()
    queue = DBOS.register_queue("fanout")
    try:
        began = time.perf_counter()
        handles = [queue.enqueue(unit, n) for n in range(args.units)]
        results = [handle.get_result() for handle in handles]
        seconds = time.perf_counter() - began
        assert results == list(range(args.units))
    finally:
        DBOS.destroy()
        if args.storage == "postgres":
            _drop(args.postgres, url.rsplit("/", 1)[1])
    print(json.dumps({"seconds": seconds, "units": args.units, "storage": args.storage}))


if __name__ == "__main__":
    main()
