"""The ledger's step index: each step a position in a sorted list of ids, its stage and its
count arrays at that position. It must answer as a dict and a set would, whatever order the
ids come in, and hold nothing per step beyond that (a stage opened or a step counted must not
allocate per step: a 10-million-step job held a gigabyte that way)."""

from __future__ import annotations

import random
import tracemalloc
from datetime import UTC, datetime

import pytest

from choreography_ray.bench import NoopFanOut, NoopItem, NoopStep
from choreography_ray.engine import planning
from choreography_ray.engine.ledger import StepLedger
from choreography_ray.engine.packed_ids import PackedIds, PlannedIds
from choreography_ray.engine.planning import plan_parts
from choreography_ray.engine.step_index import StepIndex
from choreography_ray.jobs import default_registry
from choreography_ray.jobs.job import new_step_id

NOW = datetime(2024, 1, 1, tzinfo=UTC)


def _index(steps: list[tuple[str, int]]) -> StepIndex:
    index = StepIndex()
    for step_id, stage in steps:
        index.add(step_id, stage)
    return index


def test_counts_per_stage_whichever_way_they_change():
    index = _index([("a", 0), ("b", 0), ("c", 1)])
    index.count("a")
    index.count("a")  # told twice, counted once
    index.count("c")
    assert index.per_stage == {0: 1, 1: 1} and index.counted == 2
    index.uncount("a")
    index.uncount("a")
    assert index.per_stage == {0: 0, 1: 1} and not index.is_counted("a")
    index.clear_counted()
    assert index.counted == 0 and not index.is_counted("c")


def test_ids_in_any_order_answer_as_a_dict_would():
    rng = random.Random(7)
    steps = [(f"step-{n:05d}", rng.randrange(4)) for n in range(2_000)]
    rng.shuffle(steps)  # not sorted: searched in a sorted copy
    index = _index(steps)
    for step_id, stage in steps:
        assert index.stage_of(step_id) == stage
    assert index.stage_of("step-99999") is None and index.stage_of("") is None
    for step_id, _ in steps[::3]:
        index.count(step_id)
    expected: dict[int, int] = {}
    for _, stage in steps[::3]:
        expected[stage] = expected.get(stage, 0) + 1
    assert index.per_stage == expected
    assert [s for s, _ in steps if index.is_counted(s)] == [s for s, _ in steps[::3]]
    in_plan = [step_id for step_id, stage in steps if stage == 2]
    assert [step_id for step_id, _ in index.steps_of(2)] == in_plan  # plan order


def test_steps_counted_before_they_are_known_or_added_after_a_question_stay_counted():
    index = StepIndex()
    index.count("b")  # counted before the plan was read
    index.add("a", 0)
    assert index.is_counted("b") and index.counted == 1 and index.per_stage == {}
    index.add("b", 0)
    index.count("a")
    index.add("c", 1)  # a next part of the plan, after questions were asked
    assert index.is_counted("a") and index.is_counted("b") and not index.is_counted("c")
    assert index.per_stage == {0: 2} and index.stage_of("c") == 1
    index.reset()  # read again from storage: the counts follow the steps
    index.add("a", 0)
    assert index.is_counted("a") and index.counted == 2  # "b" is not indexed now


def test_a_start_counted_after_the_index_changed_is_counted_where_the_step_is_now():
    ledger = StepLedger()
    ledger.index([("m", 0, "", "t"), ("p", 0, "", "t")])
    ledger.open(0)
    started, _ = ledger.start(2, 1, NOW)  # each start keeps where its step was found
    ledger.index([("a", 0, "", "t"), ("b", 0, "", "t")], more=True)  # "m" and "p" move
    ledger.is_counted("")  # searched again: "m" is at position 2 now, "p" at 3
    ledger.settle(started[0].step_id)
    assert ledger.is_counted("m") and not ledger.is_counted("a")
    assert not ledger.is_counted("p") and ledger.outstanding == 3


def _allocated_by(action) -> int:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        action()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_opening_a_stage_and_counting_its_steps_allocate_nothing_per_step():
    steps = 100_000
    ledger = StepLedger()
    ledger.index((new_step_id(), 0, "", "noop") for _ in range(steps))
    # Ids the engine made arrive sorted: the plan's list is searched as it is, not copied.
    assert _allocated_by(lambda: ledger.is_counted("")) < 300_000  # a copy held 800 KB more
    assert _allocated_by(lambda: ledger.open(0)) < 10_000  # a queue of pairs held ~7 MB
    started, _ = ledger.start(steps, 1, NOW)

    def settle() -> None:
        for start in started:
            ledger.settle(start.step_id)

    assert _allocated_by(settle) < 500_000  # a set of them held ~4 MB
    assert ledger.outstanding == 0 and ledger.stage_done(0)


def test_the_engine_s_ids_are_held_packed_and_others_as_given():
    index = StepIndex()

    def plan() -> None:
        for _ in range(10_000):
            index.add(new_step_id(), 0)

    assert _allocated_by(plan) < 400_000  # 16 bytes each: as strings they held 1 MB
    made = [step_id for step_id, _ in index.steps_of(0)]
    assert [index.stage_of(step_id) for step_id in made] == [0] * len(made)
    # The same digits in capitals are another id: not found as the packed one.
    assert index.stage_of(made[5].upper()) is None
    assert index.stage_of(made[5][:-1] + "g") is None and index.stage_of(made[5][:31]) is None
    index.count(made[5])
    assert not index.is_counted(made[5].upper())
    # An id of the job's own, and one out of order: from there on ids are held as given.
    index.add("my-step", 1)
    index.add(new_step_id(), 1)
    late = new_step_id()
    index.add(made[3] + "x", 1)
    index.add(late, 0)
    assert index.is_counted(made[5]) and index.stage_of("my-step") == 1
    assert index.stage_of(made[3] + "x") == 1 and index.stage_of(late) == 0
    assert index.per_stage == {0: 1} and index.size == len(made) + 4


def test_the_engine_s_ids_out_of_order_are_still_found():
    first, second, third = new_step_id(), new_step_id(), new_step_id()
    index = StepIndex()
    for step_id, stage in ((second, 0), (third, 1), (first, 2)):  # a job that reordered them
        index.add(step_id, stage)
    assert [index.stage_of(s) for s in (first, second, third)] == [2, 0, 1]


def test_a_plan_s_ids_planned_twice_are_found_however_they_come():
    made = [new_step_id() for _ in range(5)]
    seen = PlannedIds()
    assert all(seen.add(step_id) for step_id in made[1:4])  # ascending: packed
    assert not seen.add(made[2])  # again, below the last: searched among the packed
    assert seen.add(made[0])  # below the last, new: noted apart
    assert not seen.add(made[0])
    assert seen.add("mine") and not seen.add("mine")  # a job's own ids
    assert seen.add(made[4]) and not seen.add(made[4])
    assert seen.add(made[3].upper())  # another id (as the index tells them apart)


def test_a_chunk_of_ids_is_noted_as_one_by_one_would_and_the_first_seen_before_is_named():
    made = [new_step_id() for _ in range(12)]
    seen = PlannedIds()
    assert seen.add_all(made[:4]) is None and seen.add_all([]) is None
    assert all(step_id in seen for step_id in made[:4])
    assert seen.add_all([*made[4:6], made[1], made[6]]) == made[1]  # planned twice
    assert made[4] in seen and made[5] in seen and made[6] not in seen  # noted up to it
    assert seen.add_all([made[7], made[7]]) == made[7]  # twice within the chunk
    assert seen.add_all([made[9], made[8]]) is None  # out of order: noted one by one
    assert seen.add_all([made[8]]) == made[8]
    assert seen.add_all(["mine", made[10]]) is None and seen.add_all(["mine"]) == "mine"
    assert seen.add_all([made[11]]) is None and seen.add_all([made[11]]) == made[11]
    upper = made[3].upper()
    assert seen.add_all([upper]) is None and seen.add_all([upper]) == upper


def test_a_run_of_ids_is_packed_whole_or_not_at_all():
    made = [new_step_id() for _ in range(6)]
    packed = PackedIds()
    assert packed.add_run(made[:2]) and packed.add_run([]) and list(packed) == made[:2]
    for refused in (
        [made[1], made[2]],  # not above the last
        [made[3], made[2]],  # not ascending
        [made[2], made[2]],
        [made[2], made[3].upper()],  # not how an id is held
        [made[2], made[3][:31]],
        [made[2][:16] + " " + made[2][17:]],
    ):
        assert not packed.add_run(refused)
        assert list(packed) == made[:2]  # nothing of it added
    assert packed.add_run(made[2:]) and list(packed) == made
    assert [packed.find(step_id) for step_id in made] == list(range(6))


def test_the_engine_s_ids_are_noted_for_the_plan_check_in_16_bytes():
    seen = PlannedIds()

    def plan() -> None:
        for _ in range(10_000):
            seen.add(new_step_id())

    assert _allocated_by(plan) < 400_000  # a set of them held 1.5 MB


def test_checking_a_plan_keeps_its_ids_in_16_bytes_each(monkeypatch):
    chunk = 2_000
    monkeypatch.setattr(planning, "PLAN_CHUNK", chunk)
    job, total = NoopFanOut(), 8 * chunk
    details = (job.create_step(NoopStep, NoopItem(n=n)) for n in range(total))
    parts = plan_parts(details, default_registry)
    held: dict[int, int] = {}
    tracemalloc.start()
    try:
        for planned, part in enumerate(parts, 1):
            del part  # what stays is the plan check's, and the part being built
            held[planned] = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(held) == 8
    grown = held[7] - held[2]  # five parts of ids noted: 80 bytes each as a set's strings
    assert grown < 0.5 * 80 * 5 * chunk  # packed: about 200 KB, with the arrays' growth


def test_steps_added_counted_answer_as_counting_them_after_would():
    """A recount flags each step as it is indexed, a part of the records at a time: in order
    (packed ids) or not, one stage or several, the counts are those of counting afterwards."""
    rng = random.Random(11)
    packed = [(new_step_id(), rng.randrange(3)) for _ in range(1_000)]
    chosen = [(f"step-{n:04d}", rng.randrange(3)) for n in range(1_000)]
    rng.shuffle(chosen)
    for steps in (packed, chosen, [(s, 0) for s, _ in packed], [(s, 5) for s, _ in chosen]):
        done = {step_id for step_id, _ in steps if rng.random() < 0.4}
        flagged = StepIndex()
        for step_id, stage in steps:
            flagged.add(step_id, stage, step_id in done)
        counted_after = _index(steps)
        for step_id in done:
            counted_after.count(step_id)
        assert flagged.per_stage == counted_after.per_stage
        assert flagged.counted == counted_after.counted == len(done)
        assert [s for s, _ in steps if flagged.is_counted(s)] == [s for s, _ in steps if s in done]
        for stage in flagged.stages():
            assert flagged.stage_done(stage) == counted_after.stage_done(stage)
    # Flags are forgotten with the counts, and a part added after a question keeps them.
    index = StepIndex()
    index.add("a", 0, True)
    index.clear_counted()
    assert index.counted == 0 and not index.is_counted("a")
    index.add("b", 1, True)
    assert index.is_counted("b") and index.per_stage == {1: 1}
    index.add("c", 1, True)  # after a question
    assert index.counted == 2 and index.per_stage == {1: 2} and not index.is_counted("a")


def test_a_report_of_a_started_step_is_checked_without_a_search(monkeypatch):
    """Every report first asks whether its step is counted: a started step answers from its
    start's position, as its count does, rather than a search per report."""
    ledger = StepLedger()
    ids = [new_step_id() for _ in range(3)]
    ledger.index((step_id, 0, "", "noop") for step_id in ids)
    ledger.open(0)
    ledger.start(2, 1, NOW)
    searches: list[str] = []
    search = PackedIds.find

    def counting(self: PackedIds, step_id: str) -> int:
        searches.append(step_id)
        return search(self, step_id)

    monkeypatch.setattr(PackedIds, "find", counting)
    assert not ledger.is_counted(ids[0]) and not ledger.is_counted(ids[1])
    ledger.settle(ids[0])
    assert ledger.is_counted(ids[0])  # no longer started: found by a search
    assert searches == [ids[0]]
    assert not ledger.is_counted(ids[2]) and searches == [ids[0], ids[2]]


def test_a_run_of_ids_is_held_at_its_positions_or_not():
    ids = [new_step_id() for _ in range(8)]
    index = StepIndex()
    for step_id in ids:
        index.add(step_id, 0)
    assert index.holds_run(0, ids) and index.holds_run(3, ids[3:6]) and index.holds_run(2, [])
    assert not index.holds_run(2, ids[3:6])  # not at those positions
    assert not index.holds_run(6, [*ids[6:], new_step_id()])  # past the end
    assert not index.holds_run(3, [ids[3], ids[5], ids[4]])  # in another order
    assert not index.holds_run(3, [ids[3].upper()])  # not how an id is held
    assert not index.holds_run(3, [ids[3][:31], ids[3][31] + ids[4]])  # the two, split wrong
    assert not index.holds_run(3, [ids[3][:16] + " " + ids[3][17:]])
    assert not index.holds_run(-1, ids[:1])
    mixed = StepIndex()
    for step_id in ["step-c", "step-a", "step-b"]:  # the job's own ids: held as given, sorted
        mixed.add(step_id, 0)
    assert mixed.holds_run(0, ["step-a", "step-b", "step-c"])
    assert not mixed.holds_run(0, ["step-c", "step-a", "step-b"])
    assert not mixed.holds_run(-1, ["step-a"])


def _observed(index: StepIndex, steps: list[str]) -> tuple[object, ...]:
    """Everything the ledger asks of an index, for every step."""
    return (
        [index.find(step_id) for step_id in steps],
        [index.stage_of(step_id) for step_id in steps],
        [index.is_counted(step_id) for step_id in steps],
        index.stage_sizes(),
        index.per_stage,
        index.counted,
        {stage: list(index.steps_of(stage)) for stage in index.stages()},
        {stage: index.stage_done(stage) for stage in index.stages()},
    )


_IDS = [new_step_id() for _ in range(12)]


def _parts(*parts: list[tuple[int, int, bool]]) -> list[list[tuple[str, int, bool]]]:
    """Parts of (index into `_IDS`, stage, counted)."""
    return [[(_IDS[at], stage, counted) for at, stage, counted in part] for part in parts]


@pytest.mark.parametrize(
    ("parts", "ask_between"),
    [
        (_parts([(0, 0, False), (1, 0, False), (2, 0, False)]), False),  # packed whole
        (_parts([(0, 2, False), (1, 2, False)], [(2, 2, False)]), False),  # the first stage is 2
        (_parts([(0, 0, False), (1, 0, False)], [(2, 1, False), (3, 1, False)]), False),
        (_parts([(0, 0, False), (1, 1, False), (2, 0, False)], [(3, 0, False)]), False),
        (_parts([(0, 0, False), (1, 0, True), (2, 0, False)], [(3, 0, False)]), False),
        (_parts([(0, 0, False), (1, 0, False)], [(2, 0, False), (3, 0, False)]), True),
        (_parts([(1, 0, False), (0, 0, False)], [(2, 0, False)]), False),  # not ascending
        (_parts([(0, 0, False)], [], [(1, 0, False)]), False),  # an empty part
    ],
)
def test_a_part_added_at_once_answers_as_its_steps_added_one_by_one(parts, ask_between):
    """`add_all` packs a part in a few calls only where that is what adding each step gives:
    not for a later stage, mixed stages, counted steps, ids out of order, or an index whose
    stages, flags or search list already exist (`ask_between`: a question after each part)."""
    one_by_one, at_once = StepIndex(), StepIndex()
    steps: list[str] = []
    for part in parts:
        for step_id, stage, counted in part:
            one_by_one.add(step_id, stage, counted)
        at_once.add_all(
            [step_id for step_id, _, _ in part],
            [stage for _, stage, _ in part],
            {at for at, (_, _, counted) in enumerate(part) if counted},
        )
        steps += [step_id for step_id, _, _ in part]
        if ask_between:
            assert _observed(at_once, steps) == _observed(one_by_one, steps)
    assert _observed(at_once, steps) == _observed(one_by_one, steps)


def test_a_part_of_the_job_s_own_ids_is_added_one_by_one():
    """Ids the job chose are held as strings from the first that does not pack."""
    one_by_one, at_once = StepIndex(), StepIndex()
    for part in (["step-b", "step-a"], [_IDS[0], _IDS[1]], ["STEP-C"]):
        for step_id in part:
            one_by_one.add(step_id, 0)
        at_once.add_all(part, [0] * len(part))
    steps = ["step-b", "step-a", _IDS[0], _IDS[1], "STEP-C"]
    assert _observed(at_once, steps) == _observed(one_by_one, steps)


def test_the_ledger_indexes_a_recount_s_counted_steps_in_their_parts():
    ledger = StepLedger()
    ids = [new_step_id() for _ in range(6)]
    ledger.index(((s, 0, "", "noop") for s in ids[:3]), counted={ids[1]})
    ledger.index(((s, 0, "", "noop") for s in ids[3:]), more=True, counted={ids[4], ids[5]})
    assert [ledger.is_counted(s) for s in ids] == [False, True, False, False, True, True]
    assert ledger.stage_sizes() == {0: 6}


def test_a_part_s_steps_and_stages_must_pair_up():
    index = StepIndex()
    with pytest.raises(ValueError, match="2 steps with 1 stages"):
        index.add_all(_IDS[:2], [0])
    with pytest.raises(ValueError):
        index.add_all(_IDS[:1], [])
    assert len(index.stage_sizes()) == 0
