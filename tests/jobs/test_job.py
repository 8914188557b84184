"""What `Job.create_step` gives a planned step."""

from __future__ import annotations

import time
import uuid
from dataclasses import FrozenInstanceError
from enum import IntEnum

import pytest
from pydantic import BaseModel

from choreography_ray.jobs.errors import TypeRegistryError
from choreography_ray.jobs.job import Job, StepDetails, _OrderedIds, new_job_id, new_step_id
from choreography_ray.jobs.step import JobStep, StepContext


def test_new_step_ids_are_distinct_version_7_uuids_in_hex_in_increasing_order():
    """Increasing, so that a plan's rows go to the end of the steps table's key index."""
    before = time.time_ns() // 1_000_000
    ids = [new_step_id() for _ in range(3000)]  # several batches of the id pool
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    for value in ids[::97]:
        parsed = uuid.UUID(hex=value)
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert parsed.hex == value
        assert before <= parsed.int >> 80 <= after  # milliseconds since the epoch


def test_new_job_ids_are_version_7_uuids_in_hex_in_increasing_order():
    """A job's id leads the keys of its step records: increasing, so that a new job's rows go
    to the end of each index rather than among an older job's."""
    ids = [new_job_id() for _ in range(50)]
    assert len(set(ids)) == len(ids) and ids == sorted(ids)
    assert all(uuid.UUID(hex=value).version == 7 for value in ids)


def test_a_millisecond_whose_counter_runs_out_moves_to_the_next_and_stays_in_order():
    ids = _OrderedIds()
    first = ids()
    ids._seq = (1 << 30) - 2  # as if a billion ids were made within this millisecond
    ids._last = int(first[:12], 16) + 1000  # and the clock had not moved since
    made = [ids() for _ in range(4)]
    assert [first, *made] == sorted([first, *made]) and len(set(made)) == 4
    assert int(made[-1][:12], 16) == int(first[:12], 16) + 1001


class _Request(BaseModel):
    key: str


class _Other(BaseModel):
    value: int = 0


class _Step(JobStep[_Request, _Request, int], name="tests.job.create-step"):
    async def perform(self, state: _Request, ctx: StepContext) -> int:
        return 1


class _Planning(Job[_Request], name="tests.job.create-step-job"):
    def prepare_steps(self, request: _Request) -> list[StepDetails]:
        return []


@pytest.mark.parametrize("cached", [False, True])
def test_create_step_refuses_what_it_cannot_plan_with_a_reason_before_and_after_a_good_step(
    cached,
):
    """The step classes it has checked are remembered, so a plan of thousands of steps checks
    its class once; a bad call still gets its own reason either way."""
    job = _Planning()
    if cached:
        job.create_step(_Step, _Request(key="a"))
    with pytest.raises(TypeRegistryError, match="is not a JobStep class"):
        job.create_step(_Request, _Request(key="a"))  # type: ignore[arg-type]
    with pytest.raises(TypeRegistryError, match="is not a JobStep class"):
        job.create_step([_Step], _Request(key="a"))  # type: ignore[arg-type]  # unhashable
    with pytest.raises(TypeError, match="takes a _Request request, got _Other"):
        job.create_step(_Step, _Other())  # type: ignore[arg-type]
    for stage in (-1, True, 1.0, "1"):
        with pytest.raises(ValueError, match="stage must be a whole number >= 0"):
            job.create_step(_Step, _Request(key="a"), stage=stage)  # type: ignore[arg-type]


def test_create_step_gives_every_field_it_was_given():
    class Stage(IntEnum):
        LATER = 3

    job = _Planning()
    request = _Request(key="a")
    made = job.create_step(_Step, request, stage=Stage.LATER, name="n", step_id="given")
    assert made == StepDetails(step_id="given", step_type=_Step, request=request, stage=3, name="n")
    assert made.request is request
    fresh = job.create_step(_Step, request)
    assert (fresh.stage, fresh.name, len(fresh.step_id)) == (0, "", 32)
    with pytest.raises(FrozenInstanceError):
        fresh.stage = 1  # type: ignore[misc]
