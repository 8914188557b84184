"""How `jobs list` reads its `--sort` and `--changed-since`: the user's words, checked, as the
storage query's order and bound."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from ..jobs.errors import InvalidOptionError
from ..jobs.state import utc
from ..storage.job_order import JobOrder

_UNITS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400, "w": 604_800}
_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
SORT_HELP = (
    "Order by created, changed (last change), id or status; a leading - turns it "
    "(-changed: the latest change first)."
)
SINCE_HELP = (
    "Only jobs whose status or progress changed since then: a time ago (30s, 15m, 2h, 1d, 1w) "
    "or a date and time (2026-05-01, 2026-05-01T12:30; UTC unless it says)."
)


def job_sort(text: str) -> tuple[JobOrder, bool]:
    """The order `text` names and whether it is descending; `InvalidOptionError` naming the
    orders otherwise."""
    raw = text.strip()
    name = raw.removeprefix("-")
    try:
        return JobOrder(name), raw.startswith("-")
    except ValueError:
        names = ", ".join(o.value for o in JobOrder)
        raise InvalidOptionError(
            "--sort",
            f"must be one of {names}, each with a leading - for the other way; got {text!r}",
        ) from None


def changed_since(text: str, now: datetime) -> datetime:
    """The moment `text` names: a time ago counted back from `now`, or a date and time."""
    raw = text.strip()
    ago = _AGO.fullmatch(raw)
    if ago is not None:
        return now - timedelta(seconds=float(ago[1]) * _UNITS[ago[2]])
    try:
        return utc(datetime.fromisoformat(raw))
    except ValueError:
        raise InvalidOptionError(
            "--changed-since",
            f"expected a time ago (30s, 15m, 2h, 1d, 1w) or a date and time (2026-05-01T12:30), "
            f"got {text!r}",
        ) from None
