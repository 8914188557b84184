"""Priorities with aging: which job goes first while jobs wait for the same workers.

A job's priority is a whole number stored with it (higher goes first; 0 by default). While it
waits its *effective* priority rises, by `JobsOptions.priority_aging` points a minute of
waiting: a job of priority 0 behind a stream of priority-10 work gets its turn after at most
10 / `priority_aging` minutes, so nothing starves. With `JobsOptions.finish_started_jobs` a
job also gains up to that many points in proportion to the share of its steps already done:
started jobs finish before new ones spread the workers thin.

A job whose points are all 0 costs nothing here: the worker's run queue takes its jobs in
turn without reading a clock (`RunQueue`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from ..jobs.errors import InvalidOptionError
from ..jobs.state import JobState


def check_priority(priority: Any) -> int:
    """`priority` if it is a whole number (not a boolean), else a one-line error."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidOptionError("priority", f"expected a whole number, got {priority!r}")
    if abs(priority) > 1_000_000:
        raise InvalidOptionError("priority", f"must be within ±1,000,000, got {priority}")
    return priority


def points(priority: int, done: int, total: int, finish_started: float) -> float:
    """A job's standing before any wait: its priority, plus `finish_started` points in
    proportion to the share of its `total` steps `done`."""
    if not finish_started or not total:
        return float(priority)
    return priority + finish_started * done / total


def effective(points: float, waited: float, aging: float) -> float:
    """The standing of a job that has waited `waited` seconds, aging `aging` points a minute."""
    return points + aging * waited / 60.0


def activation_order(jobs: Iterable[JobState], now: datetime, aging: float) -> list[JobState]:
    """Jobs in the order a controller host activates them (rehydration, the reconciliation
    sweep): the highest effective priority first, aged since each was created; then the
    oldest. Without priorities that is the oldest first."""

    def standing(job: JobState) -> tuple[float, datetime, str]:
        waited = (now - job.created).total_seconds()
        return (-effective(job.priority, waited, aging), job.created, job.id)

    return sorted(jobs, key=standing)
