"""Default job placement: a new job goes to the controller host with the most headroom.

Headroom weighs the free share of the node's CPU and memory (Ray's logical resources, as its
scheduler counts them) and the host's share of the live job activations, as the reference
system's resource-optimized placement weighs CPU, memory and activations. Ties go to the
preferred host (this node's, or the one the client already talks to), so a cluster of idle
equal controllers behaves as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .directors import Candidate

WEIGHTS: Mapping[str, float] = {"cpu": 0.4, "memory": 0.35, "activations": 0.25}
"""How much each part counts; they add up to 1."""


def _free_share(candidate: Candidate, resource: str) -> float:
    total = candidate.resources.get(resource, 0.0)
    if total <= 0:
        return 0.0
    free = candidate.available.get(resource, total)
    return max(0.0, min(1.0, free / total))


def headroom(candidate: Candidate, all_activations: int) -> float:
    """0 (full) to 1 (idle)."""
    busy = candidate.activations / all_activations if all_activations else 0.0
    return (
        WEIGHTS["cpu"] * _free_share(candidate, "CPU")
        + WEIGHTS["memory"] * _free_share(candidate, "memory")
        + WEIGHTS["activations"] * (1.0 - busy)
    )


def most_headroom(candidates: Sequence[Candidate], preferred: str) -> str:
    """The candidate with the most headroom; `preferred` among equals (else the first)."""
    if not candidates:
        raise ValueError("no candidate to choose from")
    total = sum(c.activations for c in candidates)
    order = {c.host: index for index, c in enumerate(candidates)}
    best = max(
        candidates,
        key=lambda c: (round(headroom(c, total), 6), c.host == preferred, -order[c.host]),
    )
    return best.host
