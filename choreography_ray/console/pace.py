"""How fast a running job goes and when it should end, and its progress as a small chart:
all from the progress history the job keeps in its record (`JobState.progress_history`).

Pure functions of the record and the time, rendered on the server: the chart is an inline SVG
of a few hundred bytes, with its figures in its title for screen readers and tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..jobs.state import JobState
from .html import duration, e

WINDOW = 60
"""Seconds of history the rate is measured over: the last minute."""
WIDTH, HEIGHT = 320, 72


@dataclass(frozen=True)
class Pace:
    """Steps per second over the last minute (None before there is a minute, or a point, to
    measure from), and the seconds left at that rate (None when the rate is none or 0)."""

    rate: float | None
    eta: float | None


def _points(job: JobState, now: datetime) -> list[tuple[int, int]]:
    """The history with the record's own figure as its last point."""
    points = list(job.progress_history)
    end = job.status_changes[-1].occurred if job.is_finished and job.status_changes else now
    at = int((end - job.created).total_seconds())
    done = job.progress.done_steps
    if not points or at > points[-1][0]:
        points.append((at, done))
    return points


def pace(job: JobState, now: datetime) -> Pace:
    points = _points(job, now)
    at, done = points[-1]
    earlier = [p for p in points[:-1] if p[0] <= at - WINDOW] or points[:1]
    since, then = earlier[-1]
    if at <= since:
        return Pace(None, None)
    rate = (done - then) / (at - since)
    remaining = job.progress.total_steps - done
    eta = remaining / rate if rate > 0 and remaining > 0 else None
    return Pace(rate, eta)


def pace_text(job: JobState, now: datetime) -> str:
    """ "12.5 steps/s over the last minute, about 4m 10s left", or why there is none."""
    measured = pace(job, now)
    if measured.rate is None:
        return "not measured yet"
    text = f"{measured.rate:,.1f} steps/s over the last minute"
    if measured.eta is not None:
        text += f", about {duration(measured.eta)} left"
    elif measured.rate <= 0 and not job.progress.is_completed:
        text += ": no step finished in that minute"
    return text


def chart(job: JobState, now: datetime) -> str:
    """Steps done over time, as an inline SVG line from 0 to the job's total."""
    points = _points(job, now)
    total = max(job.progress.total_steps, 1)
    span = max(points[-1][0], 1)
    coordinates = " ".join(
        f"{WIDTH * at / span:.1f},{HEIGHT - HEIGHT * min(done, total) / total:.1f}"
        for at, done in [(0, 0), *points]
    )
    label = (
        f"progress over time: {points[-1][1]} of {job.progress.total_steps} steps after "
        f"{duration(points[-1][0])}"
    )
    return (
        f'<svg class="chart" role="img" aria-label="{e(label)}" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}"><title>{e(label)}</title>'
        f'<rect width="{WIDTH}" height="{HEIGHT}" class="frame"/>'
        f'<polyline points="{coordinates}" class="line"/></svg>'
    )
