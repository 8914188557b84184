"""`jobs list --sort` and `--changed-since`, over a local SQLite store read with no Ray: the
order and the bound are storage's, given in the user's words."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from choreography_ray.cli import app
from choreography_ray.demo import DemoRequest
from choreography_ray.jobs import JobKey, JobState, JobStatus
from choreography_ray.jobs.registry import default_registry
from choreography_ray.storage import open_storage

runner = CliRunner()
NOW = datetime.now(UTC)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Three demo jobs: created b, a, c; last changed a (2 h ago), c (20 min), b (5 min)."""
    url = f"sqlite:///{Path(tmp_path_factory.mktemp('list-order')) / 'jobs.db'}"

    async def fill() -> None:
        provider = open_storage(url)
        await provider.initialize()
        for job_id, created, changed, status in [
            ("b-job", 300, 5, JobStatus.COMPLETED_SUCCESSFULLY),
            ("a-job", 200, 120, JobStatus.FAILED),
            ("c-job", 100, 20, JobStatus.COMPLETED_SUCCESSFULLY),
        ]:
            state = JobState(
                id=job_id,
                type="choreography.demo.fan-out",
                status=status,
                created=NOW - timedelta(minutes=created),
                changed=NOW - timedelta(minutes=changed),
                request=default_registry.dump(DemoRequest(steps=1)),
            )
            await provider.for_key(JobKey()).jobs.save(state)
        await provider.close()

    asyncio.run(fill())
    return url


@pytest.fixture(autouse=True)
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Ray was started or joined")

    monkeypatch.setattr(ray, "init", refused)


def listed(url: str, *args: str) -> list[str]:
    result = runner.invoke(
        app,
        ["jobs", "list", *args, "-o", "json", "--address", "none", "--storage", url],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    return [job["id"] for job in json.loads(result.output)]


@pytest.mark.parametrize(
    ("args", "ids"),
    [
        ((), ["b-job", "a-job", "c-job"]),  # oldest first, as before
        (("--sort", "-created"), ["c-job", "a-job", "b-job"]),
        (("--sort", "changed"), ["a-job", "c-job", "b-job"]),
        (("--sort=-changed",), ["b-job", "c-job", "a-job"]),
        (("--sort", "id"), ["a-job", "b-job", "c-job"]),
        (("--sort", "status"), ["b-job", "c-job", "a-job"]),
        (("--changed-since", "1h"), ["b-job", "c-job"]),
        (("--changed-since", "10m", "--sort", "-changed"), ["b-job"]),
        (("--changed-since", (NOW - timedelta(minutes=30)).isoformat()), ["b-job", "c-job"]),
        (("--changed-since", "3h", "--status", "failed"), ["a-job"]),
        (("--sort", "-changed", "--limit", "2"), ["b-job", "c-job"]),
    ],
)
def test_jobs_list_sorts_and_keeps_the_jobs_changed_since(url, args, ids):
    assert listed(url, *args) == ids


def test_the_json_listing_says_when_each_job_last_changed(url):
    result = runner.invoke(
        app, ["jobs", "list", "-o", "json", "--address", "none", "--storage", url]
    )
    updated = {job["id"]: job["updated"] for job in json.loads(result.output)}
    assert datetime.fromisoformat(updated["b-job"]) > datetime.fromisoformat(updated["c-job"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--sort", "age"), "must be one of created, changed, id, status"),
        (("--changed-since", "yesterday"), "expected a time ago (30s, 15m, 2h, 1d, 1w)"),
    ],
)
def test_a_bad_sort_or_time_is_a_usage_error_naming_what_is_taken(url, args, message):
    result = runner.invoke(
        app, ["jobs", "list", *args, "--address", "none", "--storage", url], terminal_width=200
    )
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
