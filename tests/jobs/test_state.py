"""Statuses, progress and the stored records of jobs and steps."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from choreography_ray.jobs import (
    FAILED_STEP_STATUSES,
    FINAL_STEP_STATUSES,
    PREPARING_JOB_STATUSES,
    RUNNING_JOB_STATUSES,
    STOP_STATUSES,
    TERMINAL_JOB_STATUSES,
    JobKey,
    JobOwner,
    JobProgress,
    JobStageProgress,
    JobState,
    JobStatus,
    JobStepState,
    JobStepStatus,
    StatusChange,
    StepLease,
)
from choreography_ray.jobs.registry import Payload

from ..strategies import EXAMPLES, job_progresses, job_states, job_step_states

FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def a_job(**fields) -> JobState:
    return JobState(**{"id": "job-1", "type": EXAMPLES.job_type, "created": NOW, **fields})


def a_change(status: int, occurred: datetime = NOW) -> StatusChange:
    return StatusChange(status=status, occurred=occurred)


# -- statuses ---------------------------------------------------------------------------------


def test_job_statuses_have_exactly_the_persisted_values_of_the_reference() -> None:
    assert {s.name: s.value for s in JobStatus} == {
        "NONE": 0,
        "PREPARING_JOB": 1,
        "PREPARING_STEPS": 2,
        "STARTING_STEPS": 3,
        "RUNNING": 4,
        "COMPLETED_SUCCESSFULLY": 5,
        "COMPLETED_WITH_FAILURES": 6,
        "STOPPED": 7,
        "FAILED": 8,
        "REMOVING": 9,
    }


def test_step_statuses_have_exactly_the_persisted_values_of_the_reference() -> None:
    assert {s.name: s.value for s in JobStepStatus} == {
        "UNKNOWN": 0,
        "SCHEDULED": 1,
        "RUNNING": 2,
        "COMPLETED_SUCCESSFULLY": 3,
        "COMPLETED_WITH_FAILURE": 4,
        "STOPPED": 5,
        "FAILED": 6,
        "REMOVING": 7,
        "UNREACHABLE": 8,
    }


def test_running_job_statuses_are_preparing_starting_and_running() -> None:
    assert {
        JobStatus.PREPARING_JOB,
        JobStatus.PREPARING_STEPS,
        JobStatus.STARTING_STEPS,
        JobStatus.RUNNING,
    } == RUNNING_JOB_STATUSES
    assert {s for s in JobStatus if s.is_running} == RUNNING_JOB_STATUSES


def test_terminal_job_statuses_are_the_completed_ones_and_failed() -> None:
    assert {
        JobStatus.COMPLETED_SUCCESSFULLY,
        JobStatus.COMPLETED_WITH_FAILURES,
        JobStatus.FAILED,
    } == TERMINAL_JOB_STATUSES
    assert {s for s in JobStatus if s.is_terminal} == TERMINAL_JOB_STATUSES


def test_stopped_and_removing_are_the_stop_statuses() -> None:
    assert {JobStatus.STOPPED, JobStatus.REMOVING} == STOP_STATUSES


def test_dead_job_cleanup_looks_only_at_the_two_preparing_statuses() -> None:
    assert {JobStatus.PREPARING_JOB, JobStatus.PREPARING_STEPS} == PREPARING_JOB_STATUSES


def test_no_job_status_is_both_running_and_terminal_or_stopping() -> None:
    assert not RUNNING_JOB_STATUSES & TERMINAL_JOB_STATUSES
    assert not RUNNING_JOB_STATUSES & STOP_STATUSES
    assert not TERMINAL_JOB_STATUSES & STOP_STATUSES


def test_final_step_statuses_are_the_outcomes_a_job_counts() -> None:
    assert {
        JobStepStatus.COMPLETED_SUCCESSFULLY,
        JobStepStatus.COMPLETED_WITH_FAILURE,
        JobStepStatus.FAILED,
        JobStepStatus.UNREACHABLE,
    } == FINAL_STEP_STATUSES
    assert {s for s in JobStepStatus if s.is_final} == FINAL_STEP_STATUSES


def test_failed_step_statuses_are_failure_and_completion_with_failure() -> None:
    assert {JobStepStatus.COMPLETED_WITH_FAILURE, JobStepStatus.FAILED} == FAILED_STEP_STATUSES
    assert {s for s in JobStepStatus if s.is_failure} == FAILED_STEP_STATUSES


def test_a_stopped_step_is_not_a_final_outcome() -> None:
    assert not JobStepStatus.STOPPED.is_final
    assert not JobStepStatus.REMOVING.is_final


# -- stage progress ---------------------------------------------------------------------------


def test_a_stage_is_completed_when_successes_failures_and_unreachable_steps_add_up() -> None:
    stage = JobStageProgress(
        stage=1, is_started=True, total_steps=6, successful_steps=3, failed_steps=2
    )
    assert not stage.is_completed
    assert stage.remaining_steps == 1
    done = stage.model_copy(update={"unreachable_steps": 1})
    assert done.is_completed
    assert done.remaining_steps == 0


def test_a_stage_has_failures_only_when_a_step_failed() -> None:
    unreachable_only = JobStageProgress(stage=2, total_steps=3, unreachable_steps=3)
    assert not unreachable_only.has_failures
    assert JobStageProgress(stage=0, total_steps=3, failed_steps=1).has_failures


def test_an_empty_stage_is_completed() -> None:
    assert JobStageProgress(stage=0).is_completed


# -- job progress -----------------------------------------------------------------------------


def test_a_job_is_completed_when_every_step_succeeded_failed_or_is_unreachable() -> None:
    progress = JobProgress(total_steps=5, successful_steps=2, failed_steps=1, unreachable_steps=2)
    assert progress.is_completed


def test_stopped_steps_do_not_complete_a_job() -> None:
    progress = JobProgress(total_steps=3, successful_steps=2, stopped_steps=1)
    assert not progress.is_completed
    assert progress.is_stopped


def test_a_job_with_no_steps_is_completed_and_stopped() -> None:
    assert JobProgress().is_completed
    assert JobProgress().is_stopped


def test_a_job_with_steps_still_running_is_neither_completed_nor_stopped() -> None:
    progress = JobProgress(total_steps=4, successful_steps=1, stopped_steps=2)
    assert not progress.is_completed
    assert not progress.is_stopped


def test_a_stage_that_has_not_started_counts_its_remaining_steps_as_stopped() -> None:
    progress = JobProgress(
        total_steps=5,
        successful_steps=1,
        stopped_steps=1,
        stages=[
            JobStageProgress(stage=0, is_started=True, total_steps=2, successful_steps=1),
            JobStageProgress(stage=1, is_started=False, total_steps=3),
        ],
    )
    assert progress.is_stopped
    assert not progress.is_completed


def test_a_started_stage_does_not_count_its_remaining_steps_as_stopped() -> None:
    progress = JobProgress(
        total_steps=5,
        successful_steps=1,
        stopped_steps=1,
        stages=[
            JobStageProgress(stage=0, is_started=True, total_steps=2, successful_steps=1),
            JobStageProgress(stage=1, is_started=True, total_steps=3),
        ],
    )
    assert not progress.is_stopped


def test_unreachable_steps_of_a_stage_never_started_are_not_counted_twice() -> None:
    # A failed barrier in stage 0 makes every step of stage 1 unreachable.
    progress = JobProgress(
        total_steps=4,
        successful_steps=1,
        failed_steps=1,
        unreachable_steps=2,
        stages=[
            JobStageProgress(
                stage=0, is_started=True, total_steps=2, successful_steps=1, failed_steps=1
            ),
            JobStageProgress(stage=1, is_started=False, total_steps=2, unreachable_steps=2),
        ],
    )
    assert progress.is_completed
    assert progress.is_stopped
    assert progress.has_failures


def test_unreachable_steps_complete_a_job_with_failures() -> None:
    progress = JobProgress(total_steps=3, successful_steps=1, unreachable_steps=2)
    assert progress.is_completed
    assert progress.has_failures


def test_a_job_has_failures_when_a_step_failed() -> None:
    assert JobProgress(total_steps=2, successful_steps=1, failed_steps=1).has_failures


def test_a_job_whose_steps_all_succeeded_has_no_failures() -> None:
    progress = JobProgress(total_steps=2, successful_steps=2, stopped_steps=0)
    assert progress.is_completed
    assert not progress.has_failures


def test_stopped_steps_are_not_failures() -> None:
    assert not JobProgress(total_steps=2, stopped_steps=2).has_failures


@FAST
@given(job_progresses())
def test_a_completed_job_is_always_stopped_too(progress: JobProgress) -> None:
    if progress.is_completed:
        assert progress.is_stopped


# -- job state --------------------------------------------------------------------------------


@FAST
@given(job_states(versions=st.integers(0, 10_000), populated=True))
def test_a_job_state_with_every_field_populated_survives_a_json_round_trip(
    state: JobState,
) -> None:
    assert state.request is not None and state.plan and state.owner is not None
    assert state.quarantine is not None
    assert state.progress.stages and state.status_changes
    assert JobState.model_validate_json(state.model_dump_json()) == _unsaved(state)


def _unsaved(state: Any) -> Any:
    """What a record's JSON holds: everything but its version, which storage keeps beside it
    (a record read back takes the stored version)."""
    assert "version" not in json.loads(state.model_dump_json())  # a key, not some text value
    return state.model_copy(update={"version": 0})


@FAST
@given(job_states(versions=st.integers(0, 10_000)))
def test_any_job_state_survives_a_json_round_trip(state: JobState) -> None:
    assert JobState.model_validate_json(state.model_dump_json()) == _unsaved(state)


@FAST
@given(job_step_states(versions=st.integers(0, 10_000), populated=True))
def test_a_step_state_with_every_field_populated_survives_a_json_round_trip(
    state: JobStepState,
) -> None:
    assert state.lease is not None and state.state is not None and state.result is not None
    assert state.error is not None and state.error.partial_result is not None
    assert JobStepState.model_validate_json(state.model_dump_json()) == _unsaved(state)


@FAST
@given(job_step_states(versions=st.integers(0, 10_000)))
def test_any_step_state_survives_a_json_round_trip(state: JobStepState) -> None:
    assert JobStepState.model_validate_json(state.model_dump_json()) == _unsaved(state)


@FAST
@given(job_states(key=JobKey(scope="s", namespace="n"), job_id="fixed"))
def test_the_job_strategy_keeps_the_key_and_id_it_is_given(state: JobState) -> None:
    assert state.key == JobKey(scope="s", namespace="n")
    assert state.id == "fixed"
    assert state.type == EXAMPLES.job_type
    if state.status_changes:
        assert state.status_changes[-1].status == state.status


@FAST
@given(job_step_states(job_id="job-7"))
def test_the_step_strategy_keeps_the_job_id_it_is_given(state: JobStepState) -> None:
    assert state.job_id == "job-7"
    assert state.type == EXAMPLES.step_type


def test_naive_datetimes_of_a_stored_job_read_as_utc() -> None:
    record = {
        "id": "job-1",
        "type": EXAMPLES.job_type,
        "created": "2024-05-01T12:00:00",
        "status_changes": [{"status": 1, "occurred": "2024-05-01T12:00:01"}],
        "owner": {"host": "node-a", "lease_expires": "2024-05-01T12:01:00"},
    }
    state = JobState.model_validate_json(json.dumps(record))
    assert state.created == NOW
    assert state.created.tzinfo is not None
    assert state.status_changes[0].occurred == NOW + timedelta(seconds=1)
    assert state.owner is not None
    assert state.owner.lease_expires == NOW + timedelta(minutes=1)


def test_naive_datetimes_given_in_code_are_taken_as_utc() -> None:
    naive = datetime(2024, 5, 1, 12, 0)
    state = a_job(created=naive, owner=JobOwner(host="h", lease_expires=naive))
    lease = StepLease(node="n", activation="a", heartbeat=naive)
    for value in (state.created, state.owner.lease_expires, lease.heartbeat):
        assert value == NOW
        assert value.utcoffset() == timedelta(0)


def test_datetimes_in_another_timezone_are_converted_to_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    state = a_job(created=datetime(2024, 5, 1, 14, 0, tzinfo=plus_two))
    assert state.created == NOW
    assert state.created.utcoffset() == timedelta(0)


def test_naive_step_datetimes_read_as_utc() -> None:
    record = {
        "id": "step-1",
        "job_id": "job-1",
        "type": EXAMPLES.step_type,
        "status_changes": [{"status": 2, "occurred": "2024-05-01T12:00:00"}],
        "lease": {"node": "n", "activation": "a", "heartbeat": "2024-05-01T12:00:00"},
    }
    state = JobStepState.model_validate_json(json.dumps(record))
    assert state.status_changes[0].occurred == NOW
    assert state.lease is not None
    assert state.lease.heartbeat == NOW
    assert state.lease.heartbeat.utcoffset() == timedelta(0)


def test_unknown_fields_in_a_stored_job_are_ignored() -> None:
    record = {
        "id": "job-1",
        "type": EXAMPLES.job_type,
        "created": NOW.isoformat(),
        "a_field_from_a_newer_release": {"anything": [1, 2]},
        "progress": {"total_steps": 2, "new_counter": 5},
        "status_changes": [{"status": 1, "occurred": NOW.isoformat(), "extra": True}],
    }
    state = JobState.model_validate_json(json.dumps(record))
    assert state.progress.total_steps == 2
    assert "a_field_from_a_newer_release" not in state.model_dump()
    assert "new_counter" not in state.progress.model_dump()


def test_unknown_fields_in_a_stored_step_are_ignored() -> None:
    record = {"id": "s", "job_id": "j", "type": EXAMPLES.step_type, "heartbeat_v9": 3}
    state = JobStepState.model_validate_json(json.dumps(record))
    assert state.id == "s"
    assert "heartbeat_v9" not in state.model_dump()


def test_a_minimal_job_record_reads_with_defaults_for_later_fields() -> None:
    record = {"id": "job-1", "type": EXAMPLES.job_type, "created": NOW.isoformat()}
    state = JobState.model_validate_json(json.dumps(record))
    assert state.key == JobKey()
    assert state.status is JobStatus.NONE
    assert state.progress == JobProgress()
    assert state.plan is None
    assert not state.has_stored_step_plan
    assert not state.stop_finalized
    assert state.stopped_steps_counted == []
    assert state.recovery_attempts == 0 and state.recovery_error == ""
    assert state.quarantine is None  # a record of a release without quarantine is not in one
    assert state.version == 0


def test_a_job_record_with_the_dropped_completed_steps_counted_still_reads() -> None:
    """Records written before the field was dropped (the activation recounts from steps)."""
    record = {"id": "job-1", "type": EXAMPLES.job_type, "created": NOW.isoformat()}
    state = JobState.model_validate_json(json.dumps({**record, "completed_steps_counted": ["s"]}))
    assert state.id == "job-1" and "completed_steps_counted" not in state.model_dump()


def test_a_minimal_step_record_reads_as_a_first_attempt_in_the_first_stage() -> None:
    state = JobStepState.model_validate_json('{"id": "s", "job_id": "j", "type": "t"}')
    assert state.attempt == 1
    assert state.stage == 0
    assert state.status is JobStepStatus.UNKNOWN
    assert state.lease is None
    assert not state.is_prepared


def test_a_job_is_prepared_once_its_history_has_passed_starting_steps() -> None:
    history = [a_change(JobStatus.PREPARING_JOB), a_change(JobStatus.STARTING_STEPS)]
    stopped_later = [*history, a_change(JobStatus.RUNNING), a_change(JobStatus.STOPPED)]
    assert a_job(status=JobStatus.STARTING_STEPS, status_changes=history).is_prepared
    assert a_job(status=JobStatus.STOPPED, status_changes=stopped_later).is_prepared


def test_a_job_is_not_prepared_without_starting_steps_in_its_history() -> None:
    history = [a_change(JobStatus.PREPARING_JOB), a_change(JobStatus.PREPARING_STEPS)]
    assert not a_job(status=JobStatus.PREPARING_STEPS, status_changes=history).is_prepared


def test_preparedness_comes_from_the_history_not_the_current_status() -> None:
    assert not a_job(status=JobStatus.STARTING_STEPS).is_prepared


@pytest.mark.parametrize("status", list(JobStatus))
def test_a_job_is_preparing_or_running_exactly_in_the_running_statuses(
    status: JobStatus,
) -> None:
    assert a_job(status=status).is_preparing_or_running is (status in RUNNING_JOB_STATUSES)


def test_a_stored_status_reads_back_as_the_enum_member() -> None:
    state = JobState.model_validate_json(
        json.dumps({"id": "j", "type": "t", "created": NOW.isoformat(), "status": 7})
    )
    assert state.status is JobStatus.STOPPED


def test_job_key_defaults_to_the_default_scope_and_namespace() -> None:
    assert JobKey() == JobKey(scope="default", namespace="default")
    assert str(JobKey(scope="a", namespace="b")) == "a/b"


@pytest.mark.parametrize("bad", ["", "   ", "x" * 201])
def test_a_job_key_refuses_a_blank_or_overlong_scope_or_namespace(bad: str) -> None:
    with pytest.raises(ValueError):
        JobKey(scope=bad)
    with pytest.raises(ValueError):
        JobKey(namespace=bad)


def test_job_keys_are_hashable_values() -> None:
    assert len({JobKey(scope="a"), JobKey(scope="a"), JobKey(scope="b")}) == 2


def test_a_prepared_step_record_is_what_validation_would_build():
    state = Payload(type="t", data={"n": 1})
    fast = JobStepState.prepared(id="s", job_id="j", type="step", name="n", stage=2, state=state)
    checked = JobStepState(
        id="s", job_id="j", type="step", name="n", stage=2, is_prepared=True, state=state
    )
    assert fast == checked
    assert fast.model_dump_json() == checked.model_dump_json()
    assert fast.model_fields_set == set(JobStepState.model_fields)
