"""Steps spread over worker hosts by their load: pure functions over the hosts' loads, without
a cluster."""

from __future__ import annotations

import pytest

from choreography_ray.engine.messages import StepStart
from choreography_ray.engine.step_types import StepTypes
from choreography_ray.jobs import NoEligibleJobWorker
from choreography_ray.placement.spreading import (
    SMALL_BATCH,
    WorkerLoad,
    WorkerLoads,
    shares,
    spread,
)


def starts(n: int, prefix: str = "s") -> list[StepStart]:
    return [StepStart(f"{prefix}{i}", 1) for i in range(n)]


def loads(**answers: tuple[int, int]) -> WorkerLoads:
    found = WorkerLoads()
    for host, (runs, capacity) in answers.items():
        found.answered(host, WorkerLoad(runs, capacity), 0)
    return found


def sizes(spread_shares: dict[str, list[StepStart]]) -> dict[str, int]:
    return {host: len(part) for host, part in spread_shares.items()}


# -- how many each host takes ------------------------------------------------------------------


def test_a_loaded_host_gets_fewer_steps() -> None:
    assert shares(6, [8, 0], [4, 4]) == [0, 6]  # the idle one takes all until it is as busy
    assert shares(20, [8, 0], [4, 4]) == [6, 14]  # then both fill evenly
    assert shares(4, [3, 1], [2, 2]) == [1, 3]


def test_hosts_alike_split_evenly_and_the_extra_steps_go_to_the_first_in_order() -> None:
    assert shares(5, [0, 0, 0], [2, 2, 2]) == [2, 2, 1]
    assert shares(1, [0, 0], [2, 2]) == [1, 0]
    assert shares(1, [1, 1], [2, 2]) == [1, 0]


def test_a_bigger_node_takes_more_in_proportion_to_its_parallelism() -> None:
    assert shares(9, [0, 0], [1, 2]) == [3, 6]
    assert shares(9, [3, 0], [1, 2]) == [1, 8]  # 4/1 and 8/2: equally loaded after


def test_a_small_batch_of_async_steps_goes_whole_to_the_least_loaded_host() -> None:
    """`on_loop`: the steps perform on the hosts' event loops, so one host runs them as well
    as two, for one call and one group commit."""
    assert shares(10, [0, 0], [128, 128], on_loop=True) == [10, 0]  # not 5 and 5
    assert shares(10, [3, 0], [128, 128], on_loop=True) == [0, 10]  # the least loaded
    assert shares(10, [0, 0], [16, 128], on_loop=True) == [0, 10]  # the larger among equals
    assert shares(SMALL_BATCH, [0, 0, 0], [128] * 3, on_loop=True) == [SMALL_BATCH, 0, 0]
    assert shares(4, [0, 0], [4, 4], on_loop=True) == [4, 0]  # as many as it performs at once
    assert shares(4, [2, 0], [4, 4], on_loop=True) == [0, 4]  # by load it would be [1, 3]
    assert shares(6, [126, 125], [128, 128], on_loop=True) == [0, 6]  # busy: [2, 4] by load


def test_a_small_batch_of_synchronous_steps_is_shared_by_load() -> None:
    """A host performs one synchronous step per CPU of its part of the node, whatever async
    parallelism it answers: two hosts run two at once."""
    assert shares(10, [0, 0], [128, 128]) == [5, 5]
    assert shares(4, [0, 0], [4, 4]) == [2, 2]


def test_a_batch_larger_than_small_is_shared_by_load() -> None:
    assert shares(SMALL_BATCH + 1, [0, 0], [128, 128], on_loop=True) == [9, 8]


def test_a_small_batch_larger_than_a_hosts_parallelism_is_shared_by_load() -> None:
    assert shares(5, [0, 0], [4, 4], on_loop=True) == [3, 2]  # one more than a host performs


def test_in_a_batch_of_two_kinds_only_the_async_steps_go_whole() -> None:
    types = StepTypes()
    for n in range(8):
        types.add(f"s{n}", "geo.fetch" if n % 2 else "geo.crunch")
    found = spread(
        starts(8),
        {},
        lambda _: ["w1", "w2"],
        loads(w1=(0, 128), w2=(0, 128)),
        types,
        on_loop=lambda step_type: step_type == "geo.fetch",
    )
    placed = {s.step_id: host for host, part in found.shares.items() for s in part}
    assert sorted(placed[f"s{n}"] for n in (0, 2, 4, 6)) == ["w1", "w1", "w2", "w2"]
    assert len({placed[f"s{n}"] for n in (1, 3, 5, 7)}) == 1  # the fetches: one host


@pytest.mark.parametrize(
    ("count", "runs", "capacity"),
    [(0, [1, 2], [1, 1]), (7, [0.5, 0.25, 3], [3, 1, 2]), (1000, [10, 0, 99], [16, 1, 2])],
)
def test_every_step_goes_somewhere_and_nowhere_below_zero(count, runs, capacity) -> None:
    given = shares(count, runs, capacity)
    assert sum(given) == count and min(given) >= 0


# -- a batch -------------------------------------------------------------------------------------


def test_a_sticky_step_stays_on_its_host_however_loaded_and_the_rest_spread() -> None:
    found = spread(
        starts(5),
        {"s0": "w1", "s1": "gone"},  # s1's host left: it is spread like the others
        lambda _: ["w1", "w2"],
        loads(w1=(10, 2), w2=(0, 2)),
    )
    assert [s.step_id for s in found.shares["w1"]] == ["s0"]
    assert [s.step_id for s in found.shares["w2"]] == ["s1", "s2", "s3", "s4"]


def test_successive_batches_alternate_over_idle_hosts_alike() -> None:
    """What a dispatcher sent counts as load until the hosts answer again: single steps go
    round the hosts, as before load was known."""
    known = WorkerLoads()
    chosen = [
        next(iter(spread(starts(1, f"b{n}-"), {}, lambda _: ["w1", "w2", "w3"], known).shares))
        for n in range(6)
    ]
    assert chosen == ["w1", "w2", "w3", "w1", "w2", "w3"]


def test_an_answer_replaces_what_was_sent_before_it_was_asked() -> None:
    known = WorkerLoads()
    spread(starts(4), {}, lambda _: ["w1", "w2"], known)
    asked = known.asking(0.0, ["w1", "w2"])
    spread(starts(2, "t"), {}, lambda _: ["w1", "w2"], known)  # sent after the question
    known.answered("w1", WorkerLoad(runs=0, capacity=2), asked["w1"])  # finished its two
    known.answered("w2", WorkerLoad(runs=2, capacity=2), asked["w2"])
    assert (known.runs("w1"), known.runs("w2")) == (1, 3)
    assert not known.due(0.5) and known.due(1.0)


def test_a_host_that_has_not_answered_counts_with_the_mean_capacity() -> None:
    known = loads(w1=(0, 4), w2=(0, 2))
    assert known.capacities(["w1", "w2", "w3"]) == [4.0, 2.0, 3.0]
    assert WorkerLoads().capacities(["w1"]) == [1.0]


def test_each_step_goes_to_a_host_that_runs_its_type() -> None:
    types = StepTypes()
    for n in range(6):
        types.add(f"s{n}", "geo.tile" if n % 2 else "geo.index")
    hosts = {"geo.index": ["w1", "w2"], "geo.tile": ["w2"]}
    found = spread(starts(6), {"s1": "w1"}, lambda t: hosts[t], WorkerLoads(), types)
    placed = {s.step_id: host for host, part in found.shares.items() for s in part}
    assert {placed[f"s{n}"] for n in (1, 3, 5)} == {"w2"}  # s1's old host cannot run it
    assert {placed[f"s{n}"] for n in (0, 2, 4)} == {"w1"}  # w2 is loaded with the tiles
    assert found.unplaced == [] and found.error is None


def test_steps_of_a_type_no_host_runs_are_left_with_the_reason() -> None:
    types = StepTypes()
    for n in range(4):
        types.add(f"s{n}", "a" if n < 2 else "b")

    def hosts_for(step_type: str) -> list[str]:
        if step_type == "b":
            raise NoEligibleJobWorker("no worker host runs step type 'b'")
        return ["w1"]

    found = spread(starts(4), {}, hosts_for, WorkerLoads(), types)
    assert sizes(found.shares) == {"w1": 2}
    assert [s.step_id for s in found.unplaced] == ["s2", "s3"]
    assert str(found.error) == "no worker host runs step type 'b'"


class CountingLoads(WorkerLoads):
    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def runs(self, host: str) -> float:
        self.asked += 1
        return super().runs(host)


def test_a_batch_costs_a_look_at_each_host_once_whatever_its_size() -> None:
    """O(hosts) per batch, not O(steps x hosts): a large fan-out stays as fast as before."""
    hosts = [f"w{n}" for n in range(50)]
    asked: list[str] = []

    def hosts_for(step_type: str) -> list[str]:
        asked.append(step_type)
        return hosts

    counting = CountingLoads()
    found = spread(starts(10_000), {}, hosts_for, counting, None)
    assert counting.asked == len(hosts) and asked == [""]
    assert set(sizes(found.shares).values()) == {200}


def test_step_types_are_kept_small_when_every_step_shares_one() -> None:
    types = StepTypes()
    for n in range(1000):
        types.add(f"s{n}", "only")
    assert types.single == "only" and types.others == {}
    types.add("x", "other")
    assert types.single is None and types.of("x") == "other" and types.of("s1") == "only"
    assert types.names() == ["only", "other"]
