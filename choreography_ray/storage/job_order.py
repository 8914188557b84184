"""The orders a listing of jobs can take, and the last-change time kept beside each job record.

Every provider keeps the job's last change (`JobState.last_change`, in microseconds) in a
column or field of its own, so a listing filters and sorts by it without reading records.
Records written by earlier releases get it once, from their status history (`stored_change`).
"""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from typing import Any

from ..jobs.state import to_micros, utc


class JobOrder(StrEnum):
    """What a listing of jobs sorts by; every order ends with the id, so it is total."""

    CREATED = "created"
    """Creation time, then id."""
    CHANGED = "changed"
    """Last change (status or progress), then id."""
    ID = "id"
    """Id alone."""
    STATUS = "status"
    """Status (in the order `JobStatus` numbers them), then creation time, then id."""


def stored_change(record: str | bytes | dict[str, Any] | None, created_us: int) -> int:
    """The last change of a stored job record of an earlier release, in microseconds: the
    latest of its creation, its last status change and its `changed` field. A record that
    does not read keeps its creation time (it is skipped in listings anyway)."""
    try:
        document = record if isinstance(record, dict) else json.loads(record or "null")
        times = [created_us]
        changes = document.get("status_changes") or []
        if changes:
            times.append(to_micros(utc(datetime.fromisoformat(changes[-1]["occurred"]))))
        if document.get("changed"):
            times.append(to_micros(utc(datetime.fromisoformat(document["changed"]))))
        return max(times)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        return created_us
