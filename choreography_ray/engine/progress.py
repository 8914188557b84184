"""Progress arithmetic: counting outcomes per job and per stage, and recounting from steps.

Pure functions over `JobProgress`. The job's stored progress is a cache of what step storage
says; `reconcile` rebuilds it from the steps whenever the two may disagree (a new activation,
a lost write).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from ..jobs.state import JobProgress, JobStageProgress
from ..jobs.status import JobStepStatus


def planned(stage_sizes: Mapping[int, int]) -> JobProgress:
    """Progress of a job that has planned its steps and counted nothing yet."""
    total = sum(stage_sizes.values())
    stages = (
        [JobStageProgress(stage=s, total_steps=n) for s, n in sorted(stage_sizes.items())]
        if len(stage_sizes) > 1
        else []
    )
    return JobProgress(total_steps=total, stages=stages)


def stage_entry(progress: JobProgress, stage: int) -> JobStageProgress | None:
    for entry in progress.stages:
        if entry.stage == stage:
            return entry
    return None


def count(progress: JobProgress, stage: int, status: JobStepStatus, n: int = 1) -> None:
    """Count `n` outcomes (success, failure, unreachable or stop) in place."""
    entry = stage_entry(progress, stage)
    if status == JobStepStatus.COMPLETED_SUCCESSFULLY:
        progress.successful_steps += n
        if entry is not None:
            entry.successful_steps += n
    elif status in (JobStepStatus.COMPLETED_WITH_FAILURE, JobStepStatus.FAILED):
        progress.failed_steps += n
        if entry is not None:
            entry.failed_steps += n
    elif status == JobStepStatus.UNREACHABLE:
        progress.unreachable_steps += n
        if entry is not None:
            entry.unreachable_steps += n
    elif status in (JobStepStatus.STOPPED, JobStepStatus.REMOVING):
        progress.stopped_steps += n
    else:
        raise ValueError(f"{status!r} is not an outcome")


def uncount_stop(progress: JobProgress) -> None:
    progress.stopped_steps = max(0, progress.stopped_steps - 1)


def mark_started(progress: JobProgress, stage: int) -> None:
    entry = stage_entry(progress, stage)
    if entry is not None:
        entry.is_started = True


def reconcile(
    progress: JobProgress,
    outcomes: Mapping[tuple[int, JobStepStatus], int],
    started_stages: Iterable[int],
) -> JobProgress:
    """Progress recounted from how many steps of each (stage, status) storage holds.

    Stops are not carried over: a recount starts an execution's stop accounting afresh.
    Failures here are final failures: callers pass only failures that will not be retried.
    """
    totals: Counter[int] = Counter()
    for entry in progress.stages:
        totals[entry.stage] = entry.total_steps
    result = JobProgress(
        total_steps=progress.total_steps,
        stages=[
            JobStageProgress(stage=e.stage, total_steps=e.total_steps) for e in progress.stages
        ],
        message=progress.message,
    )
    for stage in started_stages:
        mark_started(result, stage)
    for (stage, status), n in outcomes.items():
        if status.is_final:
            count(result, stage, status, n)
    return result
