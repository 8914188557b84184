"""What a worker reads from a step's record before it runs the step: whether the record
already holds the step's outcome (the start is answered with it, nothing runs), and the record
a job sent with a step's first start; and whether another live host runs the step."""

from __future__ import annotations

import asyncio

from ..jobs.errors import StartJobStepError
from ..jobs.registry import Payload, trusted
from ..jobs.state import JobKey, JobStepState
from ..jobs.status import JobStepStatus
from .messages import Prepared, StartOutcome, StartResult, StepReport, StepStart
from .ports import StepPeers
from .retrying import Verdict, decide
from .run_host import payload_tuple


def prepared_record(job_id: str, step_id: str, prepared: Prepared) -> JobStepState:
    """The record a job just prepared and stored, as it sent it with the step's first start."""
    step_type, name, stage, state_type, state_data, version = prepared[:6]
    return JobStepState.prepared(
        id=step_id,
        job_id=job_id,
        type=step_type,
        name=name,
        stage=stage,
        state=trusted(Payload, type=state_type, data=state_data),
        position=prepared[6] if len(prepared) > 6 else 0,
        version=version,
    )


def settled(start: StepStart, state: JobStepState) -> StartResult | None:
    """The answer to a start of a step whose record says it needs no run, else None. A
    stored failure runs again only for a start of a later attempt, and never once its job
    decided it final (a start left over from before that decision)."""
    finished = stored_outcome(state)
    if finished is not None:
        retry = start.attempt > state.attempt and decide(finished, None).verdict is Verdict.RETRY
        if not retry:
            return StartResult(start.step_id, StartOutcome.COMPLETED, report=finished)
    if state.status == JobStepStatus.FAILED:
        return StartResult(
            start.step_id,
            StartOutcome.FAILED,
            StartJobStepError.UNRECOVERABLE_FAILED_STATE,
            "the step failed unrecoverably",
        )
    return None


FINISHED = frozenset(
    {
        JobStepStatus.COMPLETED_SUCCESSFULLY,
        JobStepStatus.COMPLETED_WITH_FAILURE,
        JobStepStatus.UNREACHABLE,
    }
)
"""Stored statuses that are a step's outcome (a failed one may still get another attempt)."""


def stored_outcome(
    state: JobStepState, statuses: frozenset[JobStepStatus] = FINISHED
) -> StepReport | None:
    """The report of a step whose stored record holds its outcome (one of `statuses`), else
    None: a job that never heard it counts it from here."""
    if state.status in statuses:
        return outcome_report(state, state.generation, state.attempt)
    return None


def outcome_report(state: JobStepState, generation: int, attempt: int) -> StepReport:
    """The report of the outcome `state` holds, as run `generation`/`attempt` stored it: the
    one way a report is made, by the run that wrote it and from a record read back. It carries
    the decision stored for its own failed attempt, no other: a run stopped before it performed
    keeps the record's earlier decision, which would only cross hosts (and a host of the
    previous release cannot unpickle one)."""
    error = state.error
    decision = state.decision
    if decision is not None and (
        decision.attempt != attempt or state.status != JobStepStatus.COMPLETED_WITH_FAILURE
    ):
        decision = None
    return StepReport(
        step_id=state.id,
        status=state.status,
        generation=generation,
        attempt=attempt,
        stage=state.stage,
        name=state.name,
        result=payload_tuple(state.result or (error.partial_result if error else None)),
        error=error,
        decision=decision,
    )


async def running_elsewhere(
    peers: StepPeers | None,
    host: str,
    job_key: JobKey,
    job_id: str,
    stored: dict[str, JobStepState],
) -> dict[str, str]:
    """Steps whose record says another live worker host runs them, and which host: that
    host is asked (one call per host), and a step it still runs is not started here, so
    its work never runs twice at once. A host that is gone or does not answer runs
    nothing."""
    if peers is None:
        return {}
    asked: dict[str, list[JobStepState]] = {}
    for state in stored.values():
        lease = state.lease
        if (
            state.status == JobStepStatus.RUNNING
            and lease is not None
            and lease.host
            and lease.host != host  # this name's earlier incarnation runs nothing
        ):
            asked.setdefault(lease.host, []).append(state)
    if not asked:
        return {}

    async def ask(peer: str, states: list[JobStepState]) -> dict[str, str]:
        assert peers is not None
        try:
            activation, running = await peers.running(
                peer, job_key, job_id, [state.id for state in states]
            )
        except Exception:
            return {}
        runs = set(running)
        return {
            state.id: peer
            for state in states
            if state.id in runs and state.lease is not None and state.lease.activation == activation
        }

    found: dict[str, str] = {}
    for answer in await asyncio.gather(*(ask(p, s) for p, s in asked.items())):
        found.update(answer)
    return found
