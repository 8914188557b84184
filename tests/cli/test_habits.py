"""The command line's habits, on a store of this machine read with `--address none` (no Ray):
id prefixes, prepared steps, `--limit 0`, text printed as text, examples in every help,
Ctrl-C, a storage outage in one line, the demo's rate, and the browser tests' skip."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from choreography_ray.cli import app
from choreography_ray.demo import DemoJob, DemoRequest, IndexShard, ShardState
from choreography_ray.jobs import (
    JobKey,
    JobProgress,
    JobStageProgress,
    JobState,
    JobStatus,
    JobStepState,
    JobStepStatus,
    StatusChange,
    StepError,
)
from choreography_ray.jobs.registry import default_registry
from choreography_ray.jobs.state import KeyWait
from choreography_ray.storage import open_storage

runner = CliRunner()
BASE = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
IDS = ["3f2a9c1e5d7b4a60", "3f2a9c1e77777777", "9b1d00c0ffee0000"]


def _job(job_id: str, minute: int, **changes: Any) -> JobState:
    values: dict[str, Any] = {
        "id": job_id,
        "type": DemoJob.name,
        "status": JobStatus.RUNNING,
        "created": BASE + timedelta(minutes=minute),
        "request": default_registry.dump(DemoRequest(steps=4)),
        "progress": JobProgress(total_steps=150, successful_steps=3),
    }
    values.update(changes)
    return JobState(**values)


def _step(job_id: str, n: int, status: JobStepStatus, **changes: Any) -> JobStepState:
    values: dict[str, Any] = {
        "id": f"step-{n:03}",
        "job_id": job_id,
        "type": IndexShard.name,
        "name": f"index-{n}",
        "position": n,
        "status": status,
        "state": default_registry.dump(ShardState(shard=n, work=1)),
    }
    if status != JobStepStatus.UNKNOWN:
        values["status_changes"] = [StatusChange(status=int(status), occurred=BASE)]
    values.update(changes)
    return JobStepState(**values)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store with three jobs (two of whose ids start alike) and 150 steps of the first:
    three done, one failed, the rest prepared and never run (one waits for its key)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('habits') / 'jobs.db'}"

    async def fill() -> None:
        provider = open_storage(url, registry=default_registry)
        await provider.initialize()
        storage = provider.for_key(JobKey())
        details = "install with pip install 'choreography-ray[postgres]' first"
        await storage.jobs.save(_job(IDS[0], 0, details=details))
        for minute, job_id in enumerate(IDS[1:], start=1):
            await storage.jobs.save(_job(job_id, minute))
        await storage.jobs.save(_story())
        steps = [_step(IDS[0], n, JobStepStatus.UNKNOWN) for n in range(150)]
        for n in range(3):
            steps[n] = _step(IDS[0], n, JobStepStatus.COMPLETED_SUCCESSFULLY)
        steps[3] = _step(
            IDS[0],
            3,
            JobStepStatus.FAILED,
            error=StepError(messages=["shard [3] broke: see [logs]"]),
        )
        steps[4] = _step(
            IDS[0],
            4,
            JobStepStatus.UNKNOWN,
            waiting_for_key=KeyWait(key="tenant-a", limit=2, since=BASE),
        )
        await storage.steps.save_many(steps)
        await provider.close()

    asyncio.run(fill())
    return url


def invoke(*args: str) -> Any:
    return runner.invoke(app, list(args), catch_exceptions=False)


def local(store: str, *args: str) -> Any:
    return invoke(*args, "--address", "none", "--storage", store)


def test_address_none_lists_a_local_store_without_ray(store, monkeypatch):
    from choreography_ray.runtime import connection, control_store

    def no_ray(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Ray was asked")

    monkeypatch.setattr(connection, "init_ray", no_ray)
    monkeypatch.setattr(control_store, "reach", no_ray)
    listed = local(store, "jobs", "list", "--wide")
    assert listed.exit_code == 0, listed.output
    assert all(job_id in listed.output for job_id in IDS)


def test_a_unique_id_prefix_names_its_job(store):
    shown = local(store, "jobs", "show", "9b1d", "-o", "json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["id"] == IDS[2]
    steps = local(store, "jobs", "steps", "3f2a9c1e5d", "-o", "json", "--limit", "2")
    assert steps.exit_code == 0, steps.output
    assert json.loads(steps.output)["job_id"] == IDS[0]


def test_an_ambiguous_prefix_is_refused_listing_the_jobs_it_starts(store):
    shown = local(store, "jobs", "show", "3f2a9c1e")
    assert shown.exit_code == 2
    assert IDS[0] in shown.stderr and IDS[1] in shown.stderr and "give more" in shown.stderr
    assert len(shown.stderr.strip().splitlines()) == 1


def test_an_unknown_id_is_not_found(store):
    shown = local(store, "jobs", "show", "ffff")
    assert shown.exit_code == 3
    assert "no job with id 'ffff'" in shown.stderr


def _story() -> JobState:
    """A job recovered on another host, stopped, resumed and finished, its first stage done."""
    changes = [
        (JobStatus.RUNNING, "host-a", 0),
        (JobStatus.RUNNING, "host-b", 5),
        (JobStatus.STOPPED, "host-b", 9),
        (JobStatus.RUNNING, "host-b", 12),
    ]
    progress = JobProgress(
        total_steps=4,
        successful_steps=2,
        stages=[
            JobStageProgress(stage=0, is_started=True, total_steps=2, successful_steps=2),
            JobStageProgress(stage=1, is_started=True, total_steps=2),
        ],
    )
    return _job(
        "story-0001",
        3,
        progress=progress,
        status_changes=[
            StatusChange(status=int(s), host=h, occurred=BASE + timedelta(minutes=m))
            for s, h, m in changes
        ],
    )


def test_a_job_s_history_tells_its_story_and_a_finished_stage_says_so(store):
    shown = local(store, "jobs", "show", "story")
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert "  stage 0: finished, 2/2 succeeded, 0 failed" in lines
    assert "  stage 1: started, 0/2 succeeded, 0 failed" in lines
    history = [line.split("  ", 2)[-1] for line in lines if line.startswith("  2026-")]
    assert history == [
        "RUNNING",
        "RUNNING  recovered on host-b: the owner changed from host-a",
        "STOPPED  stopped",
        "RUNNING  resumed",
    ]


def test_an_unknown_step_status_is_refused_naming_each_status_once(store):
    refused = local(store, "jobs", "steps", IDS[0], "--status", "bogus")
    assert refused.exit_code == 2
    named = refused.stderr.strip().split("one of: ")[1].split(", ")
    assert "failed" in named and "prepared" in named and len(named) == len(set(named))


def test_prepared_steps_are_shown_and_filtered_as_prepared(store):
    prepared = local(store, "jobs", "steps", IDS[0], "--status", "prepared", "-o", "json")
    assert prepared.exit_code == 0, prepared.output
    assert json.loads(prepared.output)["total"] == 146
    table = local(store, "jobs", "steps", IDS[0], "--limit", "6")
    rows = table.output.splitlines()[1:7]
    assert [row.split()[1] for row in rows] == [
        "COMPLETED_SUCCESSFULLY",
        "COMPLETED_SUCCESSFULLY",
        "COMPLETED_SUCCESSFULLY",
        "FAILED",
        "PREPARED",
        "PREPARED",
    ]


def test_a_step_waiting_for_its_key_says_so(store):
    table = local(store, "jobs", "steps", IDS[0], "--limit", "6", "--wide")
    row = table.output.splitlines()[5]
    assert "PREPARED (waiting)" in row and "waiting: key tenant-a at its limit 2" in row
    listed = json.loads(local(store, "jobs", "steps", IDS[0], "--limit", "6", "-o", "json").output)
    waits = [step["waiting_for_key"] for step in listed["steps"]]
    assert waits == [None, None, None, None, "waiting: key tenant-a at its limit 2", None]


def test_limit_zero_lists_every_step_and_a_page_says_how_to_go_on(store):
    paged = local(store, "jobs", "steps", IDS[0], "-o", "json")
    every = local(store, "jobs", "steps", IDS[0], "--limit", "0", "-o", "json")
    assert every.exit_code == 0, every.output
    assert len(json.loads(paged.output)["steps"]) == 100
    answer = json.loads(every.output)
    assert len(answer["steps"]) == 150 and answer["next"] is None
    following = json.loads(paged.output)["next"]
    rest = local(store, "jobs", "steps", IDS[0], "--after", following, "-o", "json")
    assert json.loads(rest.output)["steps"][0]["id"] == "step-100"
    table = local(store, "jobs", "steps", IDS[0], "--limit", "10")
    assert "10 of 150 steps; the next: --after " in table.output


def test_a_bad_cursor_is_a_usage_error(store):
    bad = local(store, "jobs", "steps", IDS[0], "--after", "nonsense")
    assert bad.exit_code == 2
    assert "is not a page cursor" in bad.stderr


def test_text_with_square_brackets_prints_as_it_is(store):
    shown = local(store, "jobs", "show", IDS[0])
    assert "pip install 'choreography-ray[postgres]' first" in shown.output
    failed = local(store, "jobs", "steps", IDS[0], "--status", "failed", "--wide")
    assert "shard [3] broke: see [logs]" in failed.output
    missing = local(store, "jobs", "show", "a[b]")
    assert "no job with id 'a[b]'" in missing.stderr


def _commands(group: Any, prefix: str = "") -> list[tuple[str, Any]]:
    found = []
    for name, command in sorted(group.commands.items()):
        if hasattr(command, "commands"):
            found.extend(_commands(command, f"{prefix}{name} "))
        else:
            found.append((prefix + name, command))
    return found


def test_every_command_s_help_ends_with_an_example():
    commands = _commands(typer.main.get_command(app))
    assert len(commands) > 15
    for name, command in commands:
        last = (command.help or "").strip().splitlines()[-1]
        assert last.startswith("Example: choreography "), f"{name}: {last!r}"


def test_ctrl_c_prints_one_line_saying_what_is_safe(store, monkeypatch):
    from choreography_ray.cli import jobs

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(jobs, "read_cluster", interrupted)
    listed = local(store, "jobs", "list")
    assert listed.exit_code == 130
    assert listed.stderr.strip() == "interrupted: nothing was changed; what is stored is as it was"


def test_ctrl_c_while_the_demo_starts_ray_says_nothing_was_started(store, monkeypatch):
    from choreography_ray.cli import runs

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(runs, "connect", interrupted)
    demo = invoke("demo", "--storage", store)
    assert demo.exit_code == 130
    [line] = demo.stderr.strip().splitlines()
    assert line.startswith("interrupted while starting Ray: no demo job was started or changed")


def test_a_storage_outage_is_one_line_not_a_line_per_retry(monkeypatch, caplog):
    monkeypatch.setenv("CHOREOGRAPHY_TRANSIENT_RETRY_BASE_DELAY", "0.01")
    unreachable = "postgresql+psycopg://postgres@127.0.0.1:9/none?connect_timeout=2"
    with caplog.at_level(logging.WARNING, logger="choreography_ray.storage"):
        shown = invoke("jobs", "show", "some-job", "--address", "none", "--storage", unreachable)
    assert shown.exit_code == 4, shown.output
    assert len(shown.stderr.strip().splitlines()) == 1
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]


def test_the_demo_s_rate_counts_the_steps_of_this_run(capsys):
    from choreography_ray.cli.runs import _summary

    state = _job("demo", 0, progress=JobProgress(total_steps=100, successful_steps=100))
    _summary(state, 10.0, done_before=60)
    printed = capsys.readouterr().out
    assert "40 steps in 10.0 s, 60 done before (4 steps/s this run" in printed


def test_the_browser_tests_skip_naming_what_is_missing(tmp_path: Path):
    from ..console.browsing import missing_browser

    chromium = tmp_path / "chromium"
    assert missing_browser(str(chromium), "no-such-driver") == (
        f"Chromium (no {chromium}; apt-get install chromium) and chromedriver (no "
        "no-such-driver; apt-get install chromium-driver)"
    )
    chromium.write_text("")
    assert missing_browser(str(chromium), "no-such-driver").startswith("chromedriver")
    assert missing_browser(str(chromium), sys.executable) is None
