"""The storage contract of a page of steps: filter, order and keyset paging, in every provider.

Each test runs once per provider, as the rest of the contract suite does.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from choreography_ray.jobs import JobStepStatus, StatusChange, TypeKind
from choreography_ray.storage import StepCursor, StepOrder, StepQuery

from .conftest import STEP_TYPE

OTHER_STEP_TYPE = "contract.other-step"


class OtherStep:
    pass


def _changed(make, minutes: int, status: JobStepStatus = JobStepStatus.RUNNING):
    """A status history whose last change is `minutes` after the factory's base time."""
    return [StatusChange(status=int(status), occurred=make.at(minutes))]


def _every_page(run, storage, job_id: str, query: StepQuery) -> list[list[str]]:
    """The ids of every page, following each page's cursor to the end."""
    pages = []
    while True:
        page = run(storage.steps.query(job_id, query))
        pages.append([step.id for step in page.steps])
        if page.next is None:
            return pages
        query = query.model_copy(update={"after": page.next})
        assert len(pages) < 100, "the cursor does not move"


def test_plan_order_is_stage_then_plan_position_then_id(run, storage, make):
    # Saved out of order, positions running against ids: the position decides, not the id.
    steps = [
        make.step("job", "a", stage=1, position=5),
        make.step("job", "b", stage=0, position=2),
        make.step("job", "c", stage=0, position=1),
        make.step("job", "d", stage=1, position=3),
        make.step("job", "e", stage=0, position=1),  # a tie on position goes by id
        make.step("job", "f", stage=0, position=0),
    ]
    run(storage.steps.save_many(steps))
    run(storage.steps.save(make.step("other-job", "0")))
    page = run(storage.steps.query("job", StepQuery()))
    assert [s.id for s in page.steps] == ["f", "c", "e", "b", "d", "a"]
    assert page.next is None
    assert page.steps[0].position == 0 and page.steps[-1].position == 5


def test_a_step_keeps_its_plan_position_through_later_writes(run, storage, make):
    first = make.step("job", "z", position=0)
    second = make.step("job", "a", position=1)
    run(storage.steps.save_many([first, second]))
    stored = run(storage.steps.get("job", "z"))
    stored.status = JobStepStatus.RUNNING
    stored.status_changes = _changed(make, 1)
    run(storage.steps.save(stored))
    assert run(storage.steps.get("job", "z")).position == 0
    assert [s.id for s in run(storage.steps.query("job")).steps] == ["z", "a"]


def test_pages_follow_their_cursors_through_every_step_once(run, storage, make):
    steps = [make.step("job", f"s{n:02}", stage=n % 3, position=n) for n in range(20)]
    run(storage.steps.save_many(steps))
    whole = [s.id for s in run(storage.steps.query("job", StepQuery(take=0))).steps]
    assert len(whole) == 20
    pages = _every_page(run, storage, "job", StepQuery(take=6))
    assert [len(page) for page in pages] == [6, 6, 6, 2]
    assert [i for page in pages for i in page] == whole


def test_a_last_page_that_is_exactly_full_says_it_is_the_last(run, storage, make):
    run(storage.steps.save_many([make.step("job", f"s{n}", position=n) for n in range(4)]))
    pages = _every_page(run, storage, "job", StepQuery(take=2))
    assert pages == [["s0", "s1"], ["s2", "s3"]]


def test_a_page_of_steps_filters_by_status_stage_type_and_id_prefix(run, storage, make, registry):
    registry.register(OtherStep, kind=TypeKind.STEP, name=OTHER_STEP_TYPE)
    steps = [
        make.step("job", "ab-1", stage=0, position=0, status=JobStepStatus.FAILED),
        make.step("job", "ab-2", stage=1, position=1, status=JobStepStatus.RUNNING),
        make.step("job", "AB-3", stage=0, position=2, status=JobStepStatus.RUNNING),
        make.step("job", "abc", stage=1, position=3, type=OTHER_STEP_TYPE),
        make.step("job", "a%_", stage=0, position=4),
        make.step("job", "a%x", stage=0, position=5),
        make.step("job", "b", stage=0, position=6),
    ]
    run(storage.steps.save_many(steps))

    def ids(**filter):
        query = StepQuery(**filter)
        listed = [s.id for s in run(storage.steps.query("job", query)).steps]
        assert run(storage.steps.count("job", query)) == len(listed)
        return listed

    running = frozenset({JobStepStatus.RUNNING})
    assert ids(statuses=running) == ["AB-3", "ab-2"]
    assert ids(statuses=running | {JobStepStatus.FAILED}) == ["ab-1", "AB-3", "ab-2"]
    assert ids(stage=1) == ["ab-2", "abc"]
    assert ids(type=OTHER_STEP_TYPE) == ["abc"]
    assert ids(type=STEP_TYPE, stage=1) == ["ab-2"]
    # A prefix is matched exactly: by case, and with no wildcard in it.
    assert ids(id_prefix="ab") == ["ab-1", "ab-2", "abc"]
    assert ids(id_prefix="AB") == ["AB-3"]
    assert ids(id_prefix="a%_") == ["a%_"]
    assert ids(id_prefix="a%") == ["a%_", "a%x"]
    assert ids(id_prefix="ab-", statuses=running) == ["ab-2"]
    assert ids(id_prefix="zz") == []
    assert ids(id_prefix="ab-1") == ["ab-1"]


def test_the_count_ignores_the_cursor_and_the_page_size(run, storage, make):
    run(storage.steps.save_many([make.step("job", f"s{n}", position=n) for n in range(5)]))
    first = run(storage.steps.query("job", StepQuery(take=2)))
    assert first.next is not None
    after = StepQuery(take=2, after=first.next)
    assert run(storage.steps.count("job", after)) == 5
    assert run(storage.steps.count("nobody", StepQuery())) == 0


def test_last_change_order_lists_the_latest_change_first_and_never_run_steps_last(
    run, storage, make
):
    steps = [
        make.step("job", "old", status_changes=_changed(make, 1)),
        make.step("job", "new", status_changes=_changed(make, 9)),
        make.step("job", "mid-a", status_changes=_changed(make, 5)),
        make.step("job", "mid-b", status_changes=_changed(make, 5)),
        make.step("job", "never", status=JobStepStatus.UNKNOWN),
        make.step("job", "never-2", status=JobStepStatus.UNKNOWN),
    ]
    run(storage.steps.save_many(steps))
    expected = ["new", "mid-b", "mid-a", "old", "never-2", "never"]
    query = StepQuery(order=StepOrder.CHANGED)
    assert [s.id for s in run(storage.steps.query("job", query)).steps] == expected
    for take in (1, 2, 4):
        pages = _every_page(run, storage, "job", query.model_copy(update={"take": take}))
        assert [i for page in pages for i in page] == expected


def test_a_step_that_changes_moves_to_the_front_of_the_last_change_order(run, storage, make):
    run(
        storage.steps.save_many(
            [make.step("job", f"s{n}", status_changes=_changed(make, n)) for n in range(3)]
        )
    )
    step = run(storage.steps.get("job", "s0"))
    step.status = JobStepStatus.COMPLETED_SUCCESSFULLY
    step.status_changes = [*step.status_changes, *_changed(make, 10, step.status)]
    run(storage.steps.save(step))
    query = StepQuery(order=StepOrder.CHANGED)
    assert [s.id for s in run(storage.steps.query("job", query)).steps] == ["s0", "s2", "s1"]


def test_an_unreadable_step_is_left_out_of_its_page_and_paging_goes_on(
    run, support, provider, storage, key, make
):
    run(storage.steps.save_many([make.step("job", f"s{n}", position=n) for n in range(4)]))
    run(
        support.write_raw_step(
            provider,
            key,
            "job",
            "s1x",
            document="[1, 2",
            status=int(JobStepStatus.RUNNING),
            stage=0,
        )
    )
    # The raw record has no position of its own (0): it sorts after s0 by id, and its page
    # lists one step fewer.
    pages = _every_page(run, storage, "job", StepQuery(take=2))
    assert [i for page in pages for i in page] == ["s0", "s1", "s2", "s3"]
    assert all(len(page) <= 2 for page in pages)


def test_a_cursor_travels_as_a_short_token(run, storage, make):
    run(storage.steps.save_many([make.step("job", f"s{n}", position=n) for n in range(3)]))
    first = run(storage.steps.query("job", StepQuery(take=1)))
    assert first.next is not None
    token = first.next.token()
    assert token.isascii() and "=" not in token and len(token) < 60
    again = StepQuery(take=1, after=StepCursor.parse(token))
    assert [s.id for s in run(storage.steps.query("job", again)).steps] == ["s1"]


@pytest.mark.parametrize("token", ["", "not a cursor", "WzEsMl0", "e30"])
def test_a_token_that_is_no_cursor_is_a_clear_error(token):
    with pytest.raises(ValueError, match="not a page cursor"):
        StepCursor.parse(token)


def test_a_cursor_of_one_order_cannot_continue_another():
    cursor = StepCursor(order=StepOrder.PLAN, step_id="s1")
    with pytest.raises(ValidationError, match="plan order, not in changed order"):
        StepQuery(order=StepOrder.CHANGED, after=cursor)


def test_a_page_sees_only_its_own_job_and_partition(run, provider, storage, make, key):
    run(storage.steps.save(make.step("job", "mine")))
    other = provider.for_key(key.model_copy(update={"namespace": "tenant-b"}))
    run(other.steps.save(make.step("job", "theirs")))
    run(storage.steps.save(make.step("job-2", "sibling")))
    assert [s.id for s in run(storage.steps.query("job")).steps] == ["mine"]
    assert run(storage.steps.count("job")) == 1


def test_last_change_ties_and_times_compare_to_the_microsecond(run, storage, make):
    base = make.at(0)
    steps = [
        make.step(
            "job",
            f"s{n}",
            status_changes=[StatusChange(status=2, occurred=base + timedelta(microseconds=n))],
        )
        for n in range(3)
    ]
    run(storage.steps.save_many(steps))
    pages = _every_page(run, storage, "job", StepQuery(order=StepOrder.CHANGED, take=1))
    assert pages == [["s2"], ["s1"], ["s0"]]
