"""`jobs results` prints a map's results in item order, for people and as JSON for scripts,
read from the storage a map ran on in-process (the cluster's reading is replaced by opening
that storage, as `read_cluster` does once it has found it)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import choreography_ray as cr
import choreography_ray.cli.results as results_command
from choreography_ray.cli import app
from choreography_ray.cli.common import guard
from choreography_ray.console.reader import JobsReader
from choreography_ray.engine import results as reading
from choreography_ray.storage import open_storage
from choreography_ray.testing import InProcessCluster

runner = CliRunner()


@cr.step(name="tests.cli.results.area")
async def area(side: int) -> dict[str, int]:
    if side < 0:
        raise ValueError(f"a side of {side}")
    return {"side": side, "area": side * side}


@pytest.fixture
def stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A map of five items, the second failing, run to its end on a SQLite file; the command
    reads that file."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def mapped() -> str:
        async with InProcessCluster(url) as cluster:
            started = await cluster.map(area, [3, -1, 4, 0, 12])
            await cluster.wait(started.job_id)
            return started.job_id

    job_id = asyncio.run(mapped())

    def read_cluster(storage: Any, address: Any, work: Any, **_: Any) -> Any:
        async def reading_() -> Any:
            provider = open_storage(url)
            await provider.initialize()
            try:
                return await work(JobsReader(provider), None)
            finally:
                await provider.close()

        return guard(lambda: asyncio.run(reading_()))  # as read_cluster: errors as one line

    monkeypatch.setattr(results_command, "read_cluster", read_cluster)
    return {"job_id": job_id}


def test_results_print_as_json_in_item_order_with_each_failure_in_place(stored, monkeypatch):
    monkeypatch.setattr(reading, "PAGE", 2)  # three pages
    result = runner.invoke(app, ["jobs", "results", stored["job_id"], "--output", "json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert [item["index"] for item in printed] == [0, 1, 2, 3, 4]
    assert printed[0] == {
        "index": 0,
        "status": "COMPLETED_SUCCESSFULLY",
        "result": {"side": 3, "area": 9},
        "error": None,
    }
    assert printed[1] == {
        "index": 1,
        "status": "COMPLETED_WITH_FAILURE",
        "result": None,
        "error": {"type": "ValueError", "messages": ["ValueError: a side of -1"]},
    }
    assert [item["result"]["area"] for item in printed if item["result"]] == [9, 16, 0, 144]


def test_results_print_one_line_per_item_for_people(stored):
    result = runner.invoke(app, ["jobs", "results", stored["job_id"]])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 5
    assert lines[0].split() == ["0", "COMPLETED_SUCCESSFULLY", '{"side":', "3,", '"area":', "9}"]
    assert "COMPLETED_WITH_FAILURE" in lines[1] and "ValueError: a side of -1" in lines[1]


def test_results_of_an_unknown_job_exit_3(stored):
    result = runner.invoke(app, ["jobs", "results", "no-such-job", "--output", "json"])
    assert result.exit_code == 3
    assert "no job with id 'no-such-job'" in result.output
