"""The step ledger: its counts (outcomes per stage, asked after every batch of outcomes; stops
an execution counted, asked for every stop report) and its transitions, each one method."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from choreography_ray.engine.counted import CountedStops
from choreography_ray.engine.ledger import StepLedger
from choreography_ray.jobs.state import JobState

NOW = datetime(2024, 1, 1, tzinfo=UTC)


def _state() -> JobState:
    return JobState(id="j", type="t", created=datetime.now(UTC))


def _ledger(*steps: tuple[str, int]) -> StepLedger:
    ledger = StepLedger()
    ledger.index([(step_id, stage, step_id, "t") for step_id, stage in steps])
    return ledger


def test_a_stage_is_done_once_every_step_of_it_is_counted_and_not_before():
    ledger, state = _ledger(("a", 0), ("b", 0), ("c", 1)), _state()
    ledger.settle("a")
    ledger.settle("a")  # counting twice counts once
    assert not ledger.stage_done(0)
    ledger.count_stop(state, "b")
    ledger.settle("b")
    assert ledger.stage_done(0)
    assert ledger.first_open_stage() == 1
    assert ledger.outstanding == 1
    assert ledger.take_back_stop(state, "b")  # a stop followed by the success
    assert not ledger.stage_done(0)
    assert ledger.first_open_stage() == 0
    assert not ledger.take_back_stop(state, "a")  # no stop of it was counted: it stays counted
    assert ledger.is_counted("a")


def test_steps_counted_before_their_stages_are_known_count_once_they_are():
    ledger = StepLedger()
    ledger.settle("a")
    ledger.settle("b")
    ledger.index([("a", 0, "a", "t"), ("b", 0, "b", "t")])
    assert ledger.stage_done(0)


def test_a_stop_is_counted_once_and_the_record_lists_it_once():
    stops, state = CountedStops(), _state()
    assert stops.add(state, "a")
    assert not stops.add(state, "a")
    assert stops.has(state, "a") and not stops.has(state, "b")
    assert state.stopped_steps_counted == ["a"]
    assert stops.discard(state, "a")
    assert not stops.discard(state, "a")
    assert state.stopped_steps_counted == []


def test_stops_follow_a_list_put_in_the_record_s_place():
    """A recount or a resume puts another list in the record: the counts are read again."""
    ledger, state = StepLedger(), _state()
    ledger.count_stop(state, "a")
    state.stopped_steps_counted = ["b"]
    assert ledger.stop_counted(state, "b") and not ledger.stop_counted(state, "a")
    assert ledger.count_stop(state, "a")
    assert state.stopped_steps_counted == ["b", "a"]


def test_a_step_moves_from_waiting_to_tracked_to_counted():
    ledger = _ledger(("a", 0), ("b", 0), ("c", 0))
    ledger.open(0)
    assert ledger.queued == 3 and ledger.has_work
    starts, sticky = ledger.start(2, generation=1, now=NOW)
    assert [(s.step_id, s.attempt, s.generation) for s in starts] == [("a", 1, 1), ("b", 1, 1)]
    assert sticky == {} and ledger.queued == 1
    assert ledger.room(3) == 1  # two tracked in a window of three
    ledger.place({"h1": ["a"], "h2": ["b"]}, generation=1)
    assert ledger.hosts_in_use() == {"h1", "h2"}
    ledger.settle("a")
    assert ledger.is_counted("a") and ledger.entry("a") is None
    assert ledger.entry("b") is not None and ledger.entry("b").host == "h2"  # type: ignore[union-attr]


def test_queued_steps_go_first_in_order_and_counted_or_tracked_ones_never_start_twice():
    ledger = _ledger(("a", 0), ("b", 0), ("c", 0), ("d", 0))
    ledger.open(0)
    ledger.start(1, generation=1, now=NOW)  # a is tracked
    ledger.settle("b")
    assert ledger.queue([("c", 2), ("b", 2), ("a", 3)], urgent=True) == 2  # b is counted
    starts, _ = ledger.start(10, generation=1, now=NOW)
    # c first (queued ahead), a skipped (tracked), b skipped (counted), c's older entry
    # skipped (c was just started), then the rest.
    assert [(s.step_id, s.attempt, s.urgent) for s in starts] == [("c", 2, True), ("d", 1, False)]


def test_lost_hosts_give_back_their_starts_and_pinned_steps_go_back_to_their_host():
    ledger = _ledger(("a", 0), ("b", 0), ("c", 0))
    ledger.pin({"c": "h1"})
    ledger.open(0)
    _, sticky = ledger.start(3, generation=1, now=NOW)
    assert sticky == {"c": "h1"}
    ledger.place({"h1": ["a", "c"], "h2": ["b"]}, generation=1)
    losses = ledger.losses
    assert ledger.lose(["h1"]) == [("a", 1), ("c", 1)]
    assert ledger.losses == losses + 1
    ledger.place({"h2": ["a"]}, generation=1)  # an answer that came back after the loss
    assert ledger.lose_again(losses) == []  # a is not on a lost host
    assert ledger.entry("b") is not None


def test_old_starts_are_found_by_the_time_they_were_sent():
    ledger = _ledger(("a", 0), ("b", 0))
    ledger.open(0)
    ledger.start(1, generation=1, now=NOW)
    ledger.start(1, generation=1, now=NOW + timedelta(seconds=30))
    assert ledger.started_before(NOW + timedelta(seconds=10)) == {"a": ("", 1)}


def test_a_retrying_step_is_not_queued_by_its_stage_and_counts_against_the_window(run):
    async def scenario():
        ledger = _ledger(("a", 0), ("b", 0))
        ledger.open(0)
        ledger.start(2, generation=1, now=NOW)
        timer = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
        ledger.retry("a", timer)
        assert ledger.entry("a") is None and ledger.is_retrying("a")
        assert ledger.room(2) == 0  # b tracked, a retrying
        ledger.open(0)
        starts, _ = ledger.start(10, generation=1, now=NOW)
        assert starts == []  # a waits out its backoff, b is tracked
        ledger.retry_due("a")
        assert not ledger.is_retrying("a")
        ledger.retry("a", timer)
        assert ledger.drain() == {"a", "b"}  # everything in flight, retries cancelled
        await asyncio.sleep(0)
        assert timer.cancelled() and not ledger.is_retrying("a")

    run(scenario())


def test_a_stop_keeps_steps_tracked_until_each_is_forgotten():
    ledger = _ledger(("a", 0), ("b", 0))
    ledger.stop(["a", "b"], generation=2)
    assert ledger.has_tracked and ledger.entry("a").generation == 2  # type: ignore[union-attr]
    ledger.forget("a")
    ledger.settle("b")
    assert not ledger.has_tracked
