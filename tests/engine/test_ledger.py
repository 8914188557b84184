"""The step ledger's counts: outcomes per stage (the stage cursor asks it after every batch of
outcomes), and the stops an execution counted (asked for every stop report)."""

from __future__ import annotations

from datetime import UTC, datetime

from choreography_ray.engine.ledger import StepLedger
from choreography_ray.jobs.state import JobState


def _state() -> JobState:
    return JobState(id="j", type="t", created=datetime.now(UTC))


def test_a_stage_is_done_once_every_step_of_it_is_counted_and_not_before():
    ledger = StepLedger()
    ledger.index([("a", 0, "a", "t"), ("b", 0, "b", "t"), ("c", 1, "c", "t")])
    ledger.counted.add("a")
    ledger.counted.add("a")  # counting twice counts once
    assert not ledger.stage_done(0)
    ledger.counted.add("b")
    assert ledger.stage_done(0)
    assert ledger.first_open_stage() == 1
    ledger.counted.discard("b")  # an outcome taken back (a stop followed by the success)
    assert not ledger.stage_done(0)
    assert ledger.first_open_stage() == 0
    ledger.counted.clear()
    assert not ledger.stage_done(0)
    ledger.counted.update(["a", "b"])
    assert ledger.stage_done(0)
    ledger.counted.clear()
    ledger.counted |= {"a", "b"}
    assert ledger.stage_done(0)


def test_steps_counted_before_their_stages_are_known_count_once_they_are():
    ledger = StepLedger()
    ledger.counted.add("a")
    ledger.counted.add("b")
    ledger.index([("a", 0, "a", "t"), ("b", 0, "b", "t")])
    assert ledger.stage_done(0)


def test_a_stop_is_counted_once_and_the_record_lists_it_once():
    ledger, state = StepLedger(), _state()
    assert ledger.stops.add(state, "a")
    assert not ledger.stops.add(state, "a")
    assert ledger.stops.has(state, "a") and not ledger.stops.has(state, "b")
    assert state.stopped_steps_counted == ["a"]
    assert ledger.stops.discard(state, "a")
    assert not ledger.stops.discard(state, "a")
    assert state.stopped_steps_counted == []


def test_stops_follow_a_list_put_in_the_record_s_place():
    """A recount or a resume puts another list in the record: the counts are read again."""
    ledger, state = StepLedger(), _state()
    ledger.stops.add(state, "a")
    state.stopped_steps_counted = ["b"]
    assert ledger.stops.has(state, "b") and not ledger.stops.has(state, "a")
    assert ledger.stops.add(state, "a")
    assert state.stopped_steps_counted == ["b", "a"]
