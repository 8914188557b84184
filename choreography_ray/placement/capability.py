"""What each host can run: the job and step types it imported, and the modules it could not.

A host advertises this once it has imported the cluster's job modules, and again after each
refresh. A job goes only to a controller host that advertises its type, each of its steps only
to a worker host that advertises both the job's type and the step's own (a job may have steps
of several types, and a node may import one step type's module but not another's). A module
that fails to import on one node takes that node out of its types' eligible hosts, not the
module out of the cluster. Plain Python over the advertisements, so the rule is tested without
a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field

PLAN_STORAGE = "external-plan-storage"
"""A host that reads a job's plan stored apart from its record (`hosts_of_type_have`)."""
WORK_MOVES = "work-moves"
"""A worker host that queues urgent starts first and hands back queued runs (`moves_work`)."""

STEP_DECISIONS = "step-decisions"
"""A controller host that reads a step's stored decision in a report, where the previous
release reads a `non_retryable` flag (`reads_decisions`)."""

STEP_POSITIONS = "step-positions"
"""A worker host that reads a step's plan position in the record a first start carries, where
the previous release reads six fields there (`reads_positions`)."""

CAPABILITIES: tuple[str, ...] = (PLAN_STORAGE, WORK_MOVES, STEP_DECISIONS, STEP_POSITIONS)
"""What this release of a host can do that an older one cannot, for clusters that run two
releases during an upgrade. Each is read where it matters; one nobody reads is not advertised
(docs/decisions.md, "Capabilities are advertised only where they are read")."""


class HostAdvert(BaseModel):
    """One host's advertisement, stored as JSON where every host and client reads it."""

    model_config = ConfigDict(frozen=True)

    name: str
    node_id: str
    job_types: list[str] = Field(default_factory=list)
    step_types: list[str] = Field(default_factory=list)
    failed_modules: dict[str, str] = Field(default_factory=dict)
    """Module → why it could not be imported on this host."""
    capabilities: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    """The host's node's labels, for directors."""
    resources: dict[str, float] = Field(default_factory=dict)
    """The host's node's resources, for directors."""

    def hosts(self, job_type: str) -> bool:
        return job_type in self.job_types

    def runs_step(self, step_type: str) -> bool:
        return step_type in self.step_types


def eligible(hosts: Iterable[str], adverts: Mapping[str, HostAdvert], job_type: str) -> list[str]:
    """The `hosts` that can run `job_type`, in their order. A host that has not advertised
    yet (starting, or of a release before advertisements) is taken as able: it ran every type
    before, and refusing it would stop a cluster mid-upgrade."""
    return [name for name in hosts if name not in adverts or adverts[name].hosts(job_type)]


def eligible_for_steps(
    hosts: Iterable[str], adverts: Mapping[str, HostAdvert], step_type: str
) -> list[str]:
    """The `hosts` that can run steps of `step_type`, in their order; as in `eligible`, a
    host that has not advertised is taken as able."""
    return [name for name in hosts if name not in adverts or adverts[name].runs_step(step_type)]


def import_failures(adverts: Iterable[HostAdvert]) -> list[str]:
    """Each module a host could not import, with its node and the reason, one line each."""
    return [
        f"node {advert.node_id} ({advert.name}): module {module}: {reason}"
        for advert in sorted(adverts, key=lambda a: a.name)
        for module, reason in sorted(advert.failed_modules.items())
    ]


def failing_everywhere(answers: list[list[str] | None]) -> dict[str, str]:
    """The modules every host failed to import (each host's failures "module: reason"), with
    one reason each: these are mistakes to refuse, not nodes that differ."""
    per_host = [{f.split(":", 1)[0]: f for f in answer or []} for answer in answers]
    if not per_host:
        return {}
    common = set.intersection(*(set(failures) for failures in per_host))
    return {module: per_host[0][module] for module in sorted(common)}


def not_eligible_reason(
    role: str, job_type: str, hosts: Iterable[str], adverts: Mapping[str, HostAdvert]
) -> str:
    """Why no `role` host can take `job_type`, naming the hosts whose import failed."""
    failures = import_failures(adverts[name] for name in hosts if name in adverts)
    if not failures:
        return f"no {role} host runs job type {job_type!r}"
    return f"no {role} host can run job type {job_type!r}: " + "; ".join(failures)


def no_step_host_reason(
    step_type: str, job_type: str, hosts: Iterable[str], adverts: Mapping[str, HostAdvert]
) -> str:
    """Why none of the worker `hosts` that run `job_type` can take steps of `step_type`,
    naming the hosts whose import failed."""
    failures = import_failures(adverts[name] for name in hosts if name in adverts)
    reason = f"no worker host runs step type {step_type!r} of job type {job_type!r}"
    return reason + (": " + "; ".join(failures) if failures else "")


def everywhere(adverts: Iterable[HostAdvert], capability: str) -> bool:
    """Whether every advertising host has `capability` (and at least one advertises)."""
    found = list(adverts)
    return bool(found) and all(capability in advert.capabilities for advert in found)


def hosts_of_type_have(
    live: Iterable[str], adverts: Mapping[str, HostAdvert], job_type: str, capability: str
) -> bool:
    """Whether every live host that may host `job_type` has `capability`: a host that has not
    advertised is taken as an older release, without it (the safe side during an upgrade)."""
    for name in live:
        advert = adverts.get(name)
        if advert is None:
            return False
        if advert.hosts(job_type) and capability not in advert.capabilities:
            return False
    return True


def reads_positions(advert: HostAdvert | None) -> bool:
    """Whether a worker host reads the plan position in a first start's record (one that has
    not advertised is taken as the previous release, which reads six fields there)."""
    return advert is not None and STEP_POSITIONS in advert.capabilities


def moves_work(advert: HostAdvert) -> bool:
    """Whether a worker host takes urgent starts first and hands back queued runs: a host of
    an older release reads four fields of a start and has no `give_up`."""
    return WORK_MOVES in advert.capabilities


def reads_decisions(advert: HostAdvert | None) -> bool:
    """Whether a controller host reads a step's stored decision in the reports it is sent: a
    host of the previous release (or one that has not advertised, taken as such) reads a
    `non_retryable` flag there, by its truth, and is sent that flag instead."""
    return advert is not None and STEP_DECISIONS in advert.capabilities
