"""Every reading command with `--address none`: a store of this machine read with no Ray at
all, the job types of a module this process had not imported named by `--module`."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from typer.testing import CliRunner

from choreography_ray.cli import app
from choreography_ray.demo import DemoRequest
from choreography_ray.jobs import JobKey, JobProgress, JobState, JobStatus
from choreography_ray.jobs.registry import default_registry
from choreography_ray.storage import open_storage
from choreography_ray.testing import InProcessCluster

runner = CliRunner()
MODULE = "cli_local_ledger_jobs"
"""A module of job types written by the fixture: no other test imports it."""
SOURCE = """
from pydantic import BaseModel

import choreography_ray as cr
from choreography_ray.jobs import Job, JobStep, StepContext


class Books(BaseModel):
    ledgers: int


class Ledger(BaseModel):
    n: int


class Balance(JobStep[Ledger, Ledger, dict], name="cli-local.balance"):
    def initialize_state(self, request: Ledger) -> Ledger:
        return request

    async def perform(self, state: Ledger, ctx: StepContext) -> dict:
        return {"ledger": state.n}


class CloseBooks(Job[Books], name="cli-local.close-books"):
    keep_after_completed = True

    def prepare_steps(self, request: Books):
        return [self.create_step(Balance, Ledger(n=n)) for n in range(request.ledgers)]


@cr.step(name="cli-local.square")
async def square(n: int) -> int:
    return n * n
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A store with a job of the module's type (done), a map of its step function (done) and
    a demo job still running; the module then forgotten, as if never imported, but on the
    path for `--module` to import."""
    where = tmp_path_factory.mktemp("local-reading")
    (where / f"{MODULE}.py").write_text(SOURCE)
    url = f"sqlite:///{where / 'jobs.db'}"
    sys.path.insert(0, str(where))
    before = set(default_registry.names())
    module = importlib.import_module(MODULE)

    async def fill() -> str:
        async with InProcessCluster(url) as cluster:
            books = await cluster.start(module.CloseBooks, module.Books(ledgers=3), job_id="books")
            mapped = await cluster.map(module.square, [1, 2, 3])
            await cluster.wait(books.job_id)
            await cluster.wait(mapped.job_id)
        provider = open_storage(url)
        await provider.initialize()
        running = JobState(
            id="demo-running",
            type="choreography.demo.fan-out",
            status=JobStatus.RUNNING,
            created=datetime(2026, 5, 1, tzinfo=UTC),
            request=default_registry.dump(DemoRequest(steps=10)),
            progress=JobProgress(total_steps=10, successful_steps=4),
        )
        await provider.for_key(JobKey()).jobs.save(running)
        await provider.close()
        return mapped.job_id

    try:
        mapped = asyncio.run(fill())
        forget(before)
        yield {"url": url, "map": mapped, "known": before}
    finally:
        forget(before)
        sys.path.remove(str(where))


def forget(before: set[str]) -> None:
    """The module's types unregistered and the module unloaded: this process knows them no
    more, until `--module` imports it again."""
    for name in set(default_registry.names()) - before:
        default_registry.unregister(name)
    sys.modules.pop(MODULE, None)


@pytest.fixture(autouse=True)
def no_ray(monkeypatch: pytest.MonkeyPatch, store: dict[str, Any]) -> Iterator[None]:
    """Ray refused, and after each test the module forgotten again."""
    import ray

    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Ray was started or joined")

    monkeypatch.setattr(ray, "init", refused)
    yield
    forget(store["known"])


def local(store: dict[str, Any], *args: str) -> Any:
    return runner.invoke(
        app, [*args, "--address", "none", "--storage", store["url"]], catch_exceptions=False
    )


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (("jobs", "list"), "cli-local.close-books"),
        (("jobs", "show", "books"), "3 total, 3 succeeded"),
        (("jobs", "steps", "books", "-o", "json"), '"total": 3'),
        (("jobs", "watch", "books"), "COMPLETED_SUCCESSFULLY"),
        (("status",), "1 running, 2 completed_successfully"),
    ],
)
def test_every_reading_command_reads_a_local_store_with_no_ray(store, args, shown):
    read = local(store, *args, "--module", MODULE)
    assert read.exit_code == 0, read.output
    assert shown in read.output


def test_results_are_decoded_with_the_module_that_registers_their_types(store):
    without = local(store, "jobs", "results", store["map"], "-o", "json")
    assert without.exit_code == 0, without.output
    assert all(item["result"] is None for item in json.loads(without.stdout))
    read = local(store, "jobs", "results", store["map"], "-o", "json", "--module", MODULE)
    assert read.exit_code == 0, read.output
    assert [item["result"] for item in json.loads(read.stdout)] == [1, 4, 9]


def test_without_its_module_a_job_of_another_type_is_left_out_with_a_warning(store, caplog):
    listed = local(store, "jobs", "list")
    assert listed.exit_code == 0, listed.output
    assert "unknown job type 'cli-local.close-books'" in caplog.text
    assert "cli-local.close-books" not in listed.stdout and "demo-run" in listed.stdout


def test_steps_of_a_type_not_known_here_are_counted_naming_the_fix(store):
    shown = local(store, "jobs", "show", store["map"])
    assert shown.exit_code == 0, shown.output
    assert (
        "3 step record(s) cannot be read here: name the module of their types with --module "
        "(or they are damaged)"
    ) in shown.stdout
    known = local(store, "jobs", "show", store["map"], "--module", MODULE)
    assert "cannot be read" not in known.stdout


def test_a_module_that_does_not_import_is_a_usage_error(store):
    read = local(store, "jobs", "list", "--module", "no_such_module_x")
    assert read.exit_code == 2
    assert read.stderr.strip() == (
        "error: cannot import job modules: no_such_module_x: ModuleNotFoundError: No module "
        "named 'no_such_module_x'"
    )


def test_watching_a_job_that_fails_to_finish_in_time_exits_1(store):
    watched = local(store, "jobs", "watch", "demo-running", "--timeout", "0")
    assert watched.exit_code == 1, watched.output
    assert "job demo-running did not finish within 0 s" in watched.stderr


def test_status_as_json_says_there_is_no_cluster(store):
    status = local(store, "status", "-o", "json")
    assert status.exit_code == 0, status.output
    shown = json.loads(status.stdout)
    assert shown["nodes"] == [] and shown["namespace"] is None
    assert shown["jobs"]["by_status"] == {"RUNNING": 1, "COMPLETED_SUCCESSFULLY": 2}
