"""Start and report batches as Ray carries them between hosts.

Ray packs an actor call's argument with msgpack and hands every value msgpack does not take
itself (a tuple, a model) to a Python callback that pickles it apart: about a microsecond a
message more. The batches are lists of plain values, so that a no-op step's start and report
cross without that callback; what comes out the other side is what msgpack reads back (lists),
and each release's unpacking reads it by position.
"""

from __future__ import annotations

from typing import Any

import msgpack
from ray._raylet import MessagePackSerializer

from choreography_ray.engine.messages import (
    StepReport,
    StepStart,
    pack_reports,
    pack_starts,
    unpack_reports,
    unpack_starts,
)
from choreography_ray.engine.stored_steps import prepared_record
from choreography_ray.jobs.state import StepDecision, StepError
from choreography_ray.jobs.status import JobStepStatus

PREPARED = ("step.Type", "name", 1, "state.Type", {"n": 1, "tags": ["a"]}, 3, 7)
STARTS = [
    StepStart("s1", 2, 1, PREPARED),
    StepStart("s2", 2, 3, None, urgent=True),
]
REPORTS = [
    StepReport("s1", JobStepStatus.COMPLETED_SUCCESSFULLY, 2, 1, 1, "one", ("int", 5)),
    StepReport("s2", JobStepStatus.STOPPED, 2, 1, 0, "", None),
]


def carried(packed: list[Any]) -> tuple[list[Any], list[Any]]:
    """`packed` through Ray's argument packing: what the other side reads, and every value
    that went to the pickling callback on the way."""
    pickled: list[Any] = []

    def callback(value: Any) -> int:
        pickled.append(value)
        return len(pickled) - 1

    data = MessagePackSerializer.dumps(packed, callback)
    return msgpack.unpackb(data), pickled


def test_starts_cross_without_a_pickled_value_in_every_release_s_shape():
    for shape in ({}, {"urgency": False}, {"positions": False}):
        read, pickled = carried(pack_starts(STARTS, **shape))
        assert pickled == [], shape
        assert [start.step_id for start in unpack_starts(read)] == ["s1", "s2"]


def test_a_carried_start_builds_the_record_the_job_prepared():
    read, _ = carried(pack_starts(STARTS))
    first, second = unpack_starts(read)
    record = prepared_record("job", "s1", first.prepared)
    assert (record.type, record.name, record.stage, record.version, record.position) == (
        "step.Type",
        "name",
        1,
        3,
        7,
    )
    assert record.state is not None and record.state.data == {"n": 1, "tags": ["a"]}
    assert (second.prepared, second.attempt, second.urgent) == (None, 3, True)
    # A worker host of the previous release reads four fields and a record of six.
    old, _ = carried(pack_starts(STARTS, urgency=False, positions=False))
    step_id, generation, attempt, prepared = old[0]
    assert (step_id, generation, attempt) == ("s1", 2, 1)
    assert prepared_record("job", step_id, prepared).position == 0


def test_reports_cross_without_a_pickled_value_and_read_back_equal():
    for decisions in (True, False):
        read, pickled = carried(pack_reports(REPORTS, decisions=decisions))
        assert pickled == []
        assert unpack_reports(read) == REPORTS


def test_a_failure_s_error_and_decision_cross_too():
    """Only a failure carries a model (its error), which Ray pickles; its decision crosses
    as JSON."""
    decision = StepDecision(attempt=1, retry=False)
    failed = StepReport(
        "s3",
        JobStepStatus.COMPLETED_WITH_FAILURE,
        2,
        1,
        error=StepError(messages=["no"]),
        decision=decision,
    )
    read, pickled = carried(pack_reports([failed]))
    assert pickled == [failed.error]
    read[0][7] = pickled[0]  # as Ray puts the pickled value back in its place
    assert unpack_reports(read) == [failed]
