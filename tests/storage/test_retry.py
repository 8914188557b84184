"""Transient retries: one log line per retry, and a one-line final error."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from choreography_ray.jobs import JobsOptions
from choreography_ray.jobs.errors import StorageUnavailableError
from choreography_ray.storage import open_storage
from choreography_ray.storage.retry import TransientRetry

DEAD_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:1/nothing?connect_timeout=2"
"""Nothing listens on port 1: psycopg fails at once, with a message of several lines."""


class MultiLineError(ConnectionError):
    pass


def _always_failing() -> None:
    raise MultiLineError("connection failed:\n\tIs the server running?\nHINT:  look here")


def _storage_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "choreography_ray.storage"]


def test_each_retry_logs_one_line_and_the_final_error_is_one_line(caplog):
    retry = TransientRetry(lambda error: True, attempts=4, sleep=lambda seconds: None)
    with (
        caplog.at_level(logging.WARNING, logger="choreography_ray.storage"),
        pytest.raises(StorageUnavailableError) as raised,
    ):
        retry.call(_always_failing)
    records = _storage_records(caplog)
    assert len(records) == 3  # one per retry; the fourth attempt raises
    for record in records:
        assert "\n" not in record.getMessage()
        assert "Is the server running? HINT: look here" in record.getMessage()
    assert "\n" not in str(raised.value)
    assert "Is the server running?" in str(raised.value)


def test_a_dead_postgres_gives_one_line_per_retry_and_one_line_at_the_end(run, caplog):
    options = JobsOptions(transient_retry_attempts=3)
    provider = open_storage(DEAD_POSTGRES, options=options, sleep=lambda seconds: None)
    try:
        with (
            caplog.at_level(logging.WARNING, logger="choreography_ray.storage"),
            pytest.raises(StorageUnavailableError) as raised,
        ):
            run(provider.initialize())
    finally:
        run(provider.close())
    records = _storage_records(caplog)
    assert len(records) == 2
    assert all("\n" not in record.getMessage() for record in records)
    assert "\n" not in str(raised.value)


def test_transient_retries_wait_the_package_backoff_with_at_most_one_base_of_jitter():
    """Waits double from the base delay up to the cap, as every retry loop of the package
    does (`jobs.retry.Backoff`), with up to one base delay of jitter added, never above the
    cap."""
    waits: list[float] = []
    retry = TransientRetry(
        lambda error: True,
        attempts=7,
        base_delay=timedelta(seconds=1),
        max_delay=timedelta(seconds=10),
        sleep=waits.append,
    )
    with pytest.raises(StorageUnavailableError):
        retry.call(_always_failing)
    assert len(waits) == 6
    for wait, low in zip(waits, [1, 2, 4, 8, 10, 10], strict=True):
        assert low <= wait <= min(10, low + 1)
