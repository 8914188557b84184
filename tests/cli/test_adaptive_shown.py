"""`jobs show` prints each adaptive step class's window live, one line per class; a record of
an earlier version, with its one window, still shows it (the reading is stubbed)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from typer.testing import CliRunner

import choreography_ray.cli.jobs as jobs_commands
from choreography_ray.cli import app
from choreography_ray.jobs.state import JobState, WindowState
from choreography_ray.jobs.status import JobStatus
from choreography_ray.storage.protocols import StepCounts

runner = CliRunner()


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> Any:
    def show(**fields: Any) -> tuple[str, Any]:
        state = JobState(
            id="j1", type="t", status=JobStatus.RUNNING, created=datetime(2026, 5, 1, tzinfo=UTC)
        )
        for name, value in fields.items():
            setattr(state, name, value)
        answer = (state, StepCounts(), {})
        monkeypatch.setattr(jobs_commands, "read_cluster", lambda *_, **__: answer)
        text = runner.invoke(app, ["jobs", "show", "j1"], catch_exceptions=False).output
        data = runner.invoke(app, ["jobs", "show", "j1", "-o", "json"], catch_exceptions=False)
        return text, json.loads(data.output)

    return show


def test_jobs_show_prints_a_window_per_adaptive_class(shown):
    text, data = shown(
        adaptive_windows={
            "partner-api": WindowState(window=37, limit=256, throttled=12),
            "geo-api": WindowState(window=16, limit=16),
        }
    )
    assert "adaptive partner-api: window 37/256, throttled 12 times" in text
    assert "adaptive geo-api: window 16/16, throttled 0 times" in text
    assert data["adaptive_windows"]["geo-api"] == {"window": 16, "limit": 16, "throttled": 0}


def test_jobs_show_prints_the_one_window_of_an_older_record(shown):
    text, data = shown(adaptive_window=WindowState(window=3, limit=32, throttled=5))
    assert "adaptive: window 3/32, throttled 5 times" in text
    assert data["adaptive_window"] == {"window": 3, "limit": 32, "throttled": 5}
