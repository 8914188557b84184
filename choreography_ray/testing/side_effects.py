"""A job whose steps record every run in a table outside the job system's storage: the side
effects a fault test checks against storage (which outcomes were kept, which work ran again).

    table = SideEffects(tmp_path / "effects.db")
    job_id = jobs.start(RecordRuns, Effects(table=str(table.path), steps=1000, step_seconds=0.01))
    ... a fault ...
    table.runs()   # every run of every step, in the order they began, across processes

The table is a SQLite file, written by every worker host on the machine (one row per run, as
the run begins), so it works on a `MultiNodeCluster` and not across machines. Importing this
module touches neither Ray nor storage: hosts import it by name (`modules=[MODULE]`).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from ..jobs.job import Job, StepDetails
from ..jobs.step import JobStep, StepContext

MODULE = __name__
"""The module hosts import to know these job types."""
HOOKS_TABLE_ENV = "CHOREOGRAPHY_TESTING_HOOKS_TABLE"
"""The environment variable naming the table `RecordRuns.on_stopped` records in."""
ON_STOPPED = "on_stopped"


class Effects(BaseModel):
    """What a `RecordRuns` job does: `steps` steps, each working `step_seconds`."""

    table: str
    """The SQLite file every run is recorded in."""
    steps: int = 1
    step_seconds: float = 0.0
    stop_seconds: float = 0.0
    """How long a run that is told to stop keeps working before it stops."""
    prepare_seconds: float = 0.0
    """How long preparing each step takes (on the controller host), to catch a job mid-way
    through preparing its steps."""
    n: int = 0


class RecordRun(JobStep[Effects, Effects, int], name="choreography.testing.record-run"):
    """Records its run, then works for `step_seconds`; its outcome is its number."""

    def initialize_state(self, request: Effects) -> Effects:
        if request.prepare_seconds:
            time.sleep(request.prepare_seconds)
        return request

    async def perform(self, state: Effects, ctx: StepContext) -> int:
        await asyncio.to_thread(_record, state.table, ctx.job_id, ctx.step_id, state.n, _node())
        try:
            if state.step_seconds > 0:
                await asyncio.sleep(state.step_seconds)
        except asyncio.CancelledError:
            if state.stop_seconds > 0:
                await asyncio.sleep(state.stop_seconds)  # a stop that takes its time
            raise
        return state.n


class RecordRuns(Job[Effects], name="choreography.testing.record-runs"):
    """Its `on_stopped` hook records a run of step `ON_STOPPED` in the table named by the
    hosts' environment variable `HOOKS_TABLE_ENV`, when it is set (a hook sees no request)."""

    keep_after_completed = True

    def on_stopped(self) -> Awaitable[None] | None:
        path = os.environ.get(HOOKS_TABLE_ENV)
        if path:
            return asyncio.to_thread(_record, path, self.info.id, ON_STOPPED, -1)
        return None

    def prepare_steps(self, request: Effects) -> list[StepDetails]:
        return [
            self.create_step(RecordRun, request.model_copy(update={"n": n}))
            for n in range(request.steps)
        ]


@dataclass(frozen=True)
class Run:
    """One run of a step, as it began: `seq` orders runs across every process; `node` is the
    Ray node it ran on (empty outside Ray)."""

    seq: int
    job_id: str
    step_id: str
    n: int
    run: str
    at: float
    node: str = ""


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS runs (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT, "
    "step_id TEXT, n INTEGER, run TEXT, at REAL, node TEXT DEFAULT '')"
)


def _node() -> str:
    """The Ray node this process runs on, when it runs in Ray."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return ""
    return str(ray.get_runtime_context().get_node_id())


def _connect(path: str) -> sqlite3.Connection:
    connection = sqlite3.connect(path, timeout=60)
    connection.execute("PRAGMA journal_mode=WAL")
    return connection


def _record(path: str, job_id: str, step_id: str, n: int, node: str = "") -> None:
    with _connect(path) as connection:
        connection.execute(_SCHEMA)
        connection.execute(
            "INSERT INTO runs (job_id, step_id, n, run, at, node) VALUES (?, ?, ?, ?, ?, ?)",
            (job_id, step_id, n, uuid.uuid4().hex, time.time(), node),
        )


class SideEffects:
    """The runs table: created here, read back in order."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with _connect(str(self.path)) as connection:
            connection.execute(_SCHEMA)

    def mark(self) -> int:
        """The position of the latest run: runs after it began after this call."""
        with _connect(str(self.path)) as connection:
            row = connection.execute("SELECT COALESCE(MAX(seq), 0) FROM runs").fetchone()
        return int(row[0])

    def runs(self, after: int = 0) -> list[Run]:
        """Every run that began after position `after`, in order."""
        with _connect(str(self.path)) as connection:
            rows = connection.execute(
                "SELECT seq, job_id, step_id, n, run, at, node FROM runs WHERE seq > ? "
                "ORDER BY seq",
                (after,),
            ).fetchall()
        return [Run(*row) for row in rows]

    def by_step(self, after: int = 0) -> dict[str, list[Run]]:
        found: dict[str, list[Run]] = defaultdict(list)
        for run in self.runs(after):
            found[run.step_id].append(run)
        return dict(found)
