"""Directors the placement tests register by name, as a user's module would hold them."""

from __future__ import annotations

from collections.abc import Sequence

from choreography_ray.jobs import NoEligibleJobWorker
from choreography_ray.placement.directors import Candidate


class OnDemandOnly:
    """Steps of billing jobs only on nodes labelled spot=false; other jobs anywhere."""

    def choose_workers(self, job_type: str, candidates: Sequence[Candidate]) -> list[str]:
        if not job_type.startswith("billing."):
            return [c.host for c in candidates]
        chosen = [c.host for c in candidates if c.labels.get("spot") == "false"]
        if not chosen:
            raise NoEligibleJobWorker("no on-demand node (label spot=false) runs workers")
        return chosen


class BiggestNode:
    """New jobs on the controller whose node has the most memory."""

    def choose_controller(self, job_type: str, candidates: Sequence[Candidate]) -> str:
        return max(candidates, key=lambda c: c.resources.get("memory", 0)).host


class Broken:
    def choose_workers(self, job_type: str, candidates: Sequence[Candidate]) -> list[str]:
        raise RuntimeError("boom")

    def choose_controller(self, job_type: str, candidates: Sequence[Candidate]) -> str:
        return "nobody"


def make_on_demand_only() -> OnDemandOnly:
    return OnDemandOnly()


not_a_director = 42
