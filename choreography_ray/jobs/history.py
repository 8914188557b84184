"""A job's progress over time: a bounded list of points its writes note, for the console's
chart and rate."""

from __future__ import annotations

PROGRESS_EVERY = 10
"""Seconds between two points of a job's progress history."""
PROGRESS_POINTS = 60
"""The most points a job's progress history keeps (under 1 kB of its record)."""


def noted(history: list[tuple[int, int]], at: int, done: int) -> list[tuple[int, int]]:
    """`history` with the point (at, done) when `PROGRESS_EVERY` seconds passed since its last
    point (else as it is). Past `PROGRESS_POINTS`, every other point of the older half goes:
    the recent minutes stay dense, the whole run stays covered, the size stays bounded."""
    if history and at - history[-1][0] < PROGRESS_EVERY:
        return history
    points = [*history, (at, done)]
    if len(points) > PROGRESS_POINTS:
        half = len(points) // 2
        points = points[:half:2] + points[half:]
    return points
