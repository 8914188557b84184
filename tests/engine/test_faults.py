"""A storage write that fails, at every write point of a job's life.

For each write N of a reference run, the same job runs again with write N failing once; then
the cluster "restarts" (every activation lost, rehydration from storage). Whatever failed, the
job ends in a documented state, and no outcome is counted twice: the job's counts equal what
step storage says.
"""

from __future__ import annotations

import pytest

from choreography_ray.jobs import JobStatus, JobStepStatus, StartJobError
from choreography_ray.testing import InProcessCluster, WriteFaults

from .fixtures import ScenarioJob, request

KEYS = {"a": 0, "b": 0, "c": 1}
FAILING = "b"


async def _life(faults: WriteFaults, *, fail_step: bool) -> tuple[object, object, object]:
    cluster = InProcessCluster(wrap_storage=faults.wrap)
    await cluster.provider.initialize()
    try:
        import tests.engine.fixtures as fixtures

        fixtures.SCRIPT.behaviour[FAILING].fail = fail_step
        fixtures.SCRIPT.continue_stages.add(0)
        result = await cluster.start(ScenarioJob, request(*KEYS, stages=KEYS))
        await cluster.settle()
        for _ in range(3):
            await cluster.advance(60)  # timers: redelivery, retries
        faults.fail_from = None  # the outage (if any) ends
        # Restart: every activation is lost, and recovery runs from storage.
        await cluster.crash()
        task = await cluster.manager().rehydrate()
        await task
        await cluster.settle()
        state = await cluster.storage().jobs.find(result.job_id)
        steps = await cluster.storage().steps.get_for_job(result.job_id)
        return result, state, steps
    finally:
        await cluster.close()


def _writes_of_a_clean_run(run, fail_step: bool) -> int:
    faults = WriteFaults()
    run(_life(faults, fail_step=fail_step))
    return faults.writes


@pytest.mark.parametrize("outage", [False, True], ids=["one-write", "outage"])
@pytest.mark.parametrize("fail_step", [False, True], ids=["all-succeed", "one-fails"])
def test_every_failed_write_leaves_a_documented_state_and_counts_once(
    run, script, fail_step, outage
):
    """`one-write`: write N fails once. `outage`: every write from N on fails until restart."""
    total = _writes_of_a_clean_run(run, fail_step)
    assert total >= 8  # every write point of start, outcomes and completion
    seen_states: dict[int, str] = {}
    for n in range(1, total + 1):
        script.__init__()
        faults = WriteFaults(fail_from=n) if outage else WriteFaults(fail_at={n})
        result, state, steps = run(_life(faults, fail_step=fail_step))
        where = f"write #{n} ({faults.log[n - 1] if n <= len(faults.log) else '?'})"
        if state is None:
            # Never durable (the first insert failed), or completed and cleared.
            assert result.error in (
                StartJobError.UNKNOWN,
                None,
                StartJobError.NO_JOB_STEPS_TO_START,
            ), where
            seen_states[n] = "absent"
            continue
        seen_states[n] = state.status.name
        if state.status == JobStatus.PREPARING_JOB:
            # Interrupted before its plan was saved: it cannot resume (MissingStepPlan) and
            # dead-job cleanup reaps it, as it has no plan and no step.
            assert state.plan is None and not state.has_stored_step_plan, where
            assert steps == [], where
            continue
        assert state.status in (
            JobStatus.COMPLETED_SUCCESSFULLY,
            JobStatus.COMPLETED_WITH_FAILURES,
            JobStatus.FAILED,
        ), f"{where}: ended {state.status.name}"
        if state.status == JobStatus.FAILED:
            assert state.status_changes[-1].exception_messages, where
            assert state.plan is None, where
            continue
        by_status = {s.id: s.status for s in steps}
        successes = sum(1 for s in by_status.values() if s == JobStepStatus.COMPLETED_SUCCESSFULLY)
        failures = sum(1 for s in by_status.values() if s == JobStepStatus.COMPLETED_WITH_FAILURE)
        assert len(by_status) == len(KEYS), where
        assert state.progress.successful_steps == successes, where
        assert state.progress.failed_steps == failures, where
        assert state.progress.total_steps == len(KEYS), where
        expected = (
            JobStatus.COMPLETED_WITH_FAILURES if fail_step else JobStatus.COMPLETED_SUCCESSFULLY
        )
        assert state.status == expected, where
    assert "COMPLETED_SUCCESSFULLY" in seen_states.values() or fail_step
