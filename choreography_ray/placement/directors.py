"""Directors: the user's say in where a job or a step goes.

A director chooses among the hosts that can run a job type (see `capability`), from their
node's labels and resources. A job director picks the controller host of a new job; a step
director narrows the worker hosts a job's steps are spread over. Either raises
`NoEligibleJobWorker` with a message when no host qualifies: the job then goes through the
moments the placement page describes. Directors are registered once, in the cluster's options
(`job_director`, `step_director`, as importable `module:callable` names), so every host uses
the same.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..jobs.errors import ConfigurationError, NoEligibleJobWorker


@dataclass(frozen=True)
class Candidate:
    """A host a director may choose, with what its node declares."""

    host: str
    node_id: str
    labels: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, float] = field(default_factory=dict)
    """The node's resources in all."""
    available: Mapping[str, float] = field(default_factory=dict)
    """What of them is free now (only known when choosing a controller host)."""
    activations: int = 0
    """The host's live job activations (only known when choosing a controller host)."""


@runtime_checkable
class JobDirector(Protocol):
    """Chooses the controller host of a new job."""

    def choose_controller(self, job_type: str, candidates: Sequence[Candidate]) -> str:
        """One of `candidates`' hosts; `NoEligibleJobWorker` when none qualifies."""
        ...


@runtime_checkable
class StepDirector(Protocol):
    """Chooses the worker hosts a job's steps may go to."""

    def choose_workers(self, job_type: str, candidates: Sequence[Candidate]) -> Sequence[str]:
        """Some of `candidates`' hosts (the steps are spread over them by load);
        `NoEligibleJobWorker` when none qualifies."""
        ...


def load_director(name: str, setting: str) -> Any:
    """The director named `module:callable`: the object, or what calling it returns (a class
    or a factory). A name that does not load is a one-line `ConfigurationError`."""
    module_name, _, attribute = name.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except Exception as error:
        raise ConfigurationError(
            f"{setting}: cannot load {name!r}: {type(error).__name__}: {error}"
        ) from None
    director = found
    if not _is_director(found) and callable(found):
        try:
            director = found()  # a class, or a factory
        except Exception as error:
            raise ConfigurationError(
                f"{setting}: {name!r} failed to make a director: {type(error).__name__}: {error}"
            ) from None
    if not _is_director(director):
        raise ConfigurationError(
            f"{setting}: {name!r} is not a director (it needs choose_controller or choose_workers)"
        )
    return director


def _is_director(value: object) -> bool:
    return isinstance(value, JobDirector | StepDirector) and not isinstance(value, type)


def directed_workers(
    director: StepDirector | None, job_type: str, candidates: Sequence[Candidate]
) -> list[str]:
    """The worker hosts `director` allows among `candidates` (all, without a director).

    What a director answers is checked: hosts it names that are not candidates are ignored,
    and an error other than `NoEligibleJobWorker` becomes one, with the director's message."""
    names = [c.host for c in candidates]
    if director is None or not hasattr(director, "choose_workers"):
        return names
    try:
        chosen = set(director.choose_workers(job_type, candidates))
    except NoEligibleJobWorker:
        raise
    except Exception as error:
        raise NoEligibleJobWorker(
            f"the step director failed for job type {job_type!r}: {type(error).__name__}: {error}"
        ) from error
    allowed = [name for name in names if name in chosen]
    if not allowed:
        raise NoEligibleJobWorker(f"the step director chose no worker host for {job_type!r}")
    return allowed


def directed_controller(
    director: JobDirector | None, job_type: str, candidates: Sequence[Candidate], default: str
) -> str:
    """The controller host `director` chooses among `candidates` (`default` without one)."""
    if director is None or not hasattr(director, "choose_controller"):
        return default
    try:
        chosen = director.choose_controller(job_type, candidates)
    except NoEligibleJobWorker:
        raise
    except Exception as error:
        raise NoEligibleJobWorker(
            f"the job director failed for job type {job_type!r}: {type(error).__name__}: {error}"
        ) from error
    if chosen not in {c.host for c in candidates}:
        raise NoEligibleJobWorker(
            f"the job director chose {chosen!r}, which is not a controller host that runs "
            f"{job_type!r}"
        )
    return chosen
