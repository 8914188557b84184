"""The choice of hosts for a job and for its steps: the hosts that can run the job's type,
narrowed by the registered director, then for each step the hosts that run its own type, the
steps spread over them by load. What `runtime` calls; plain Python over the hosts'
advertisements, so it is tested without a cluster."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..engine.messages import StepStart
from ..engine.step_types import StepTypes
from ..jobs.errors import ConfigurationError, NoEligibleJobWorker
from .capability import (
    HostAdvert,
    eligible,
    eligible_for_steps,
    no_step_host_reason,
    not_eligible_reason,
)
from .directors import Candidate, directed_controller, directed_workers, load_director
from .headroom import most_headroom
from .spreading import Spread, WorkerLoads, spread

log = logging.getLogger("choreography_ray.placement")


def candidates(
    hosts: list[str],
    adverts: Mapping[str, HostAdvert],
    load: Mapping[str, HostLoad] | None = None,
) -> list[Candidate]:
    """The hosts as a director sees them (a host that has not advertised shows no labels)."""
    found = []
    load = load or {}
    for name in hosts:
        advert = adverts.get(name)
        now = load.get(name, HostLoad())
        found.append(
            Candidate(
                name,
                advert.node_id if advert else "",
                advert.labels if advert else {},
                advert.resources if advert else {},
                now.available,
                now.activations,
            )
        )
    return found


@dataclass(frozen=True)
class HostLoad:
    """How busy a host is now: its node's free resources and its live job activations."""

    available: Mapping[str, float] = field(default_factory=dict)
    activations: int = 0


class Placement:
    """Chooses controller and worker hosts with the cluster's directors."""

    def __init__(self, job_director: str | None = None, step_director: str | None = None) -> None:
        self.problem: str | None = None
        """Why a registered director could not be loaded: every choice fails with it."""
        self.job_director = self._load(job_director, "job_director")
        self.step_director = self._load(step_director, "step_director")

    def _load(self, name: str | None, setting: str) -> object:
        if name is None:
            return None
        try:
            return load_director(name, setting)
        except ConfigurationError as error:
            log.error("%s", error)
            self.problem = str(error)
            return None

    def _check(self) -> None:
        if self.problem is not None:
            raise NoEligibleJobWorker(self.problem)

    def eligible_workers(
        self, job_type: str, live: list[str], adverts: Mapping[str, HostAdvert]
    ) -> list[str]:
        """The live worker hosts the steps of `job_type` may go to; `NoEligibleJobWorker`
        with the reason when there is none."""
        self._check()
        able = eligible(live, adverts, job_type)
        if not able:
            raise NoEligibleJobWorker(not_eligible_reason("worker", job_type, live, adverts))
        return directed_workers(
            self.step_director,  # type: ignore[arg-type]
            job_type,
            candidates(able, adverts),
        )

    def step_hosts(
        self,
        job_type: str,
        step_type: str,
        workers: list[str],
        adverts: Mapping[str, HostAdvert],
    ) -> list[str]:
        """Those of `workers` (eligible for `job_type`) that run `step_type` ("" when not
        known: all of them); `NoEligibleJobWorker` with the reason when there is none."""
        if not step_type:
            return workers
        able = eligible_for_steps(workers, adverts, step_type)
        if not able:
            raise NoEligibleJobWorker(no_step_host_reason(step_type, job_type, workers, adverts))
        return able

    def spread(
        self,
        job_type: str,
        starts: Sequence[StepStart],
        sticky: Mapping[str, str],
        workers: list[str],
        adverts: Mapping[str, HostAdvert],
        loads: WorkerLoads,
        step_types: StepTypes | None = None,
        on_loop: Callable[[str], bool] | None = None,
    ) -> Spread:
        """Which of `workers` (eligible for `job_type`) takes which start: each on a host that
        runs its step's type, by load, a sticky step back on its host; `on_loop` says which
        step types perform on the hosts' event loops (see `spreading`)."""
        return spread(
            starts,
            sticky,
            lambda step_type: self.step_hosts(job_type, step_type, workers, adverts),
            loads,
            step_types,
            on_loop,
        )

    def controller(
        self,
        job_type: str,
        live: list[str],
        adverts: Mapping[str, HostAdvert],
        preferred: str,
        load: Mapping[str, HostLoad] | None = None,
    ) -> str:
        """The controller host of a new job of `job_type`, among those that run the type: the
        director's choice, else the one with the most headroom (`preferred` among equals)."""
        self._check()
        able = eligible(live, adverts, job_type)
        if not able:
            raise NoEligibleJobWorker(not_eligible_reason("controller", job_type, live, adverts))
        found = candidates(able, adverts, load)
        return directed_controller(
            self.job_director,  # type: ignore[arg-type]
            job_type,
            found,
            most_headroom(found, preferred),
        )
