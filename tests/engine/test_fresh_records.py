"""The records a job just prepared, kept for their first starts: the first ones whole, then
those the ledger describes as their states' JSON at their places in the plan; each taken once."""

from __future__ import annotations

import tracemalloc

import pytest

import choreography_ray.engine.fresh as fresh_module
from choreography_ray.engine.fresh import FreshRecords
from choreography_ray.engine.step_index import StepIndex
from choreography_ray.engine.step_types import StepTypes
from choreography_ray.jobs.job import new_step_id
from choreography_ray.jobs.registry import Payload
from choreography_ray.jobs.state import JobStepState

STEP, STATE = "tests.Step", "tests.State"


class Plan:
    """A plan's steps as the ledger indexes them, and their prepared records."""

    def __init__(
        self, ids: list[str], *, stages: int = 1, named: bool = False, small: bool = False
    ) -> None:
        self.index, self.types, self.names = StepIndex(), StepTypes(), {}
        self.records: list[JobStepState] = []
        for position, step_id in enumerate(ids):
            stage, name = position % stages, f"step {position}" if named else ""
            self.index.add(step_id, stage)
            self.types.add(step_id, STEP)
            if name:
                self.names[step_id] = name
            data = {"n": position}
            if not small:
                data.update({"ratio": position / 7, "text": "é\u2028", "big": 10**30})
            self.records.append(
                JobStepState.prepared(
                    id=step_id,
                    job_id="job",
                    type=STEP,
                    name=name,
                    stage=stage,
                    state=Payload(type=STATE, data=data),
                    position=position,
                )
            )

    def take(self, fresh: FreshRecords, step_id: str):
        at = self.index.find(step_id)
        stage = self.index.stage_at(at) or 0
        return fresh.take(step_id, at, stage, self.index, self.types, self.names)


def whole(record: JobStepState, version: int = 1) -> tuple:
    assert record.state is not None
    state = record.state
    return (
        record.type,
        record.name,
        record.stage,
        state.type,
        state.data,
        version,
        record.position,
    )


def engine_ids(count: int) -> list[str]:
    return [new_step_id() for _ in range(count)]


@pytest.fixture
def none_whole(monkeypatch):
    """Every record past the records kept whole: each is kept by its state's JSON, or not."""
    monkeypatch.setattr(fresh_module, "WHOLE_LIMIT", 0)


def test_a_described_record_is_taken_as_it_was_kept_and_only_once(none_whole):
    plan = Plan(engine_ids(50), stages=3, named=True)
    fresh = FreshRecords()
    for first in range(0, 50, 20):  # in batches, as a job prepares them
        batch = plan.records[first : first + 20]
        fresh.keep(batch, [1] * len(batch), plan.index, plan.names, plan.types)
    assert len(fresh) == 50
    assert fresh.take("not indexed", -1, 0, plan.index, plan.types, plan.names) is None
    for record in reversed(plan.records):  # in any order
        assert plan.take(fresh, record.id) == whole(record)
        assert plan.take(fresh, record.id) is None  # a first start only
    assert len(fresh) == 0


def test_a_hundred_thousand_described_records_are_kept_in_under_100_bytes_each(none_whole):
    plan = Plan(engine_ids(100_000), small=True)  # {"n": 12345}, as the benchmark's
    fresh = FreshRecords()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for first in range(0, 100_000, 1000):
            batch = plan.records[first : first + 1000]
            fresh.keep(batch, [1] * len(batch), plan.index, plan.names, plan.types)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(fresh) == 100_000
    assert held / 100_000 < 100  # kept whole, each took about 190 bytes more than its record


def _not_described() -> tuple[Plan, list[int]]:
    plan = Plan(engine_ids(7))
    records = plan.records
    records[1].name = "a name the ledger does not know"
    records[2].stage = 4
    records[3].type = "tests.OtherStep"
    records[4].state = Payload(type="tests.OtherState", data={"n": 4})
    versions = [1, 1, 1, 1, 1, 2, 1]  # the sixth was stored before: not version 1
    return plan, versions


def test_records_the_ledger_does_not_describe_as_they_are_are_read_back(none_whole):
    plan, versions = _not_described()
    fresh = FreshRecords()
    fresh.keep(plan.records, versions, plan.index, plan.names, plan.types)
    taken = [plan.take(fresh, record.id) for record in plan.records]
    assert taken == [whole(plan.records[0]), None, None, None, None, None, whole(plan.records[6])]


def test_up_to_the_whole_limit_every_record_is_kept_whole():
    plan, versions = _not_described()
    fresh = FreshRecords()
    fresh.keep(plan.records, versions, plan.index, plan.names, plan.types)
    for record, version in zip(plan.records, versions, strict=True):
        assert plan.take(fresh, record.id) == whole(record, version)


def test_past_the_whole_limit_a_plan_of_the_jobs_own_ids_out_of_order_is_read_back(none_whole):
    plan = Plan(["step-c", "step-a", "step-b", "step-d"])  # the index sorts them
    fresh = FreshRecords()
    fresh.keep(plan.records, [1] * 4, plan.index, plan.names, plan.types)
    # The batch does not lie at its places in the sorted index: none is kept.
    assert [plan.take(fresh, record.id) for record in plan.records] == [None] * 4


def test_past_the_whole_limit_a_batch_with_a_gap_is_read_back(none_whole):
    plan = Plan(engine_ids(6))
    batch = plan.records[:2] + plan.records[3:]  # the third was stored before (a recovery)
    fresh = FreshRecords()
    fresh.keep(batch, [1] * 5, plan.index, plan.names, plan.types)
    assert [plan.take(fresh, record.id) for record in plan.records] == [None] * 6
    # An index without the third step holds the batch one after another, but not each record
    # at its place in the plan: the fourth would be found where the plan has the third.
    short = Plan([record.id for record in batch])
    fresh.keep(batch, [1] * 5, short.index, short.names, short.types)
    assert [short.take(fresh, record.id) for record in batch] == [None] * 5


def test_kept_states_are_let_go_when_the_index_moves_its_steps(none_whole):
    ids = engine_ids(10)
    plan = Plan(ids)
    fresh = FreshRecords()
    fresh.keep(plan.records, [1] * 10, plan.index, plan.names, plan.types)
    plan.index.reset()  # indexed again (a recount): positions may differ now
    for step_id in reversed(ids):
        plan.index.add(step_id, 0)
    for step_id in ids:
        assert plan.take(fresh, step_id) is None  # never another step's state
    assert len(fresh) == 0


def test_past_the_whole_limit_records_are_kept_within_their_budget(monkeypatch):
    plan = Plan(engine_ids(10), small=True)  # states of one size: {"n": 0} to {"n": 9}
    size = len(fresh_module.to_json(plan.records[0].state.data))  # type: ignore[union-attr]
    monkeypatch.setattr(fresh_module, "DATA_BYTES", 3 * (size + fresh_module._HELD) + 2)
    monkeypatch.setattr(fresh_module, "WHOLE_LIMIT", 4)
    fresh = FreshRecords()
    fresh.keep(plan.records, [1] * 10, plan.index, plan.names, plan.types)
    assert len(fresh) == 7
    taken = [plan.take(fresh, record.id) for record in plan.records]
    assert taken[:7] == [whole(record) for record in plan.records[:7]]
    assert taken[7:] == [None, None, None]  # the worker reads these back


def test_a_state_kept_again_and_refused_is_not_delivered_stale(none_whole):
    plan = Plan(engine_ids(3))
    fresh = FreshRecords()
    fresh.keep(plan.records, [1] * 3, plan.index, plan.names, plan.types)
    fresh.keep(plan.records[1:2], [2], plan.index, plan.names, plan.types)  # stored again
    taken = [plan.take(fresh, record.id) for record in plan.records]
    assert taken == [whole(plan.records[0]), None, whole(plan.records[2])]


def test_a_step_asked_at_another_steps_place_takes_nothing_from_it(none_whole):
    plan = Plan(engine_ids(3))
    fresh = FreshRecords()
    fresh.keep(plan.records, [1] * 3, plan.index, plan.names, plan.types)
    first, second = plan.records[0], plan.records[1]
    assert fresh.take(first.id, 1, 0, plan.index, plan.types, plan.names) is None
    assert plan.take(fresh, second.id) == whole(second)  # still there for its own step
    assert plan.take(fresh, first.id) == whole(first)


def test_a_state_too_deep_to_read_back_here_is_read_back_by_the_worker(none_whole):
    plan = Plan(engine_ids(2), small=True)
    deep: dict = {"n": 0}
    for _ in range(250):  # written as JSON, but deeper than pydantic's parser reads (200)
        deep = {"a": deep}
    record = plan.records[1]
    assert record.state is not None
    record.state = Payload.model_construct(type=STATE, data=deep)
    fresh = FreshRecords()
    fresh.keep(plan.records, [1] * 2, plan.index, plan.names, plan.types)
    assert plan.take(fresh, plan.records[0].id) == whole(plan.records[0])
    assert plan.take(fresh, record.id) is None
