"""The worker nodes unfinished steps ask Ray's autoscaler for, and the elected controller's
request that keeps it so: asked when the number changes, withdrawn when nothing is
outstanding, replaced by a newly elected host, never shrunk by a host that did not answer."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from choreography_ray.engine.clock import FakeClock
from choreography_ray.jobs import JobsOptions
from choreography_ray.placement.autoscale import (
    Demand,
    Idleness,
    bundles,
    to_restore,
    to_retire,
    wanted_nodes,
)
from choreography_ray.runtime.autoscaling import AutoscaleRequests

from ..runtime.host_stubs import TableStub


@pytest.mark.parametrize(
    ("outstanding", "per_node", "cap", "nodes"),
    [(0, 16, 10, 0), (1, 16, 10, 1), (16, 16, 10, 1), (17, 16, 10, 2), (10_000, 16, 10, 10)],
)
def test_wanted_nodes_round_up_and_stop_at_the_cap(outstanding, per_node, cap, nodes) -> None:
    assert wanted_nodes(outstanding, per_node, cap) == nodes


def test_a_cap_of_zero_asks_for_nothing() -> None:
    assert wanted_nodes(1_000, 16, 0) == 0


def test_one_role_bundle_per_node() -> None:
    assert bundles(2) == [{"choreography_worker": 1.0}, {"choreography_worker": 1.0}]
    assert bundles(0) == []


def test_a_controller_that_does_not_answer_keeps_its_last_demand() -> None:
    demand = Demand.of(per_node=10, cap=10)
    assert demand.heard({"a": 30, "b": 20}, {"a", "b"}) == 5
    assert demand.heard({"a": 30, "b": None}, {"a", "b"}) == 5  # b's 20 stands
    assert demand.heard({"a": 30}, {"a"}) == 3  # b is gone: its steps are a's now or none's


class _Routes(TableStub):
    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers

    @property
    def controllers(self) -> list[str]:
        return sorted(self.answers)

    async def answer(self, name: str, method: str, args: tuple[Any, ...]) -> Any:
        assert method == "outstanding_steps" and args == ()
        answer = self.answers[name]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _requests(run, answers, outstanding, elected=lambda: True):
    asked: list[int] = []
    host = SimpleNamespace(
        name="me",
        options=JobsOptions(autoscale_max_worker_nodes=4),
        clock=FakeClock(),
        routes=_Routes(answers),
    )
    requests = AutoscaleRequests(
        host, elected, outstanding, per_node=8, request=asked.append, autoscaler=lambda: False
    )
    return requests, asked


def test_the_request_follows_the_outstanding_steps_and_is_withdrawn_at_zero(run) -> None:
    mine = [0]
    requests, asked = _requests(run, {"other": 0}, lambda: mine[0])
    assert run(requests.check()) == 0
    assert asked == [0]  # the first check replaces whatever an earlier host asked
    mine[0] = 20
    assert run(requests.check()) == 3
    assert run(requests.check()) == 3
    assert asked == [0, 3]  # asked again only when the number changes
    mine[0] = 1_000
    run(requests.check())
    mine[0] = 0
    run(requests.check())
    assert asked == [0, 3, 4, 0]  # capped, then withdrawn: nothing pins the cluster up


def test_other_controllers_count_and_one_that_fails_is_not_taken_for_zero(run) -> None:
    answers: dict[str, Any] = {"other": 30}
    requests, asked = _requests(run, answers, lambda: 2)
    assert run(requests.check()) == 4  # 32 steps at 8 per node
    answers["other"] = ConnectionError("busy")
    assert run(requests.check()) == 4
    assert asked == [4]


def test_only_the_elected_controller_asks_and_asks_again_once_elected(run) -> None:
    elected = [False]
    requests, asked = _requests(run, {}, lambda: 9, elected=lambda: elected[0])
    assert run(requests.check()) is None
    assert asked == []
    elected[0] = True
    assert run(requests.check()) == 2
    elected[0] = False
    run(requests.check())
    elected[0] = True
    run(requests.check())  # elected again: another host may have asked meanwhile
    assert asked == [2, 2]


def test_idle_nodes_beyond_the_wanted_ones_are_given_back_the_longest_idle_first() -> None:
    idle = {"a": 100.0, "b": 30.0, "c": 5.0}
    assert to_retire(idle, wanted=0, timeout=20) == ["a", "b"]  # c is not idle long enough
    assert to_retire(idle, wanted=2, timeout=20) == ["a"]
    assert to_retire(idle, wanted=3, timeout=20) == []


def test_a_node_seen_busy_or_new_is_not_idle() -> None:
    idleness = Idleness.of()
    assert idleness.seen({"a": False}, now=0.0) == {"a": 0.0}  # first seen: just busy
    assert idleness.seen({"a": False, "b": True}, now=10.0) == {"a": 10.0, "b": 0.0}
    assert idleness.seen({"a": True, "b": False}, now=15.0) == {"a": 0.0, "b": 0.0}
    assert idleness.seen({"b": False}, now=20.0) == {"b": 5.0}  # a is gone
    assert idleness.seen({"a": False, "b": False}, now=21.0) == {"a": 0.0, "b": 6.0}


def test_a_node_is_idle_only_as_long_as_it_was_seen_idle() -> None:
    """The readings stopped for 70 s (the check waited for the control store); the node was
    busy at the last one before and idle at the first after. Counted from the last busy
    reading it was idle 70 s and given back at once, though its job had just finished."""
    idleness = Idleness.of()
    idleness.seen({"a": True, "b": True}, now=0.0)
    idle = idleness.seen({"a": False, "b": False}, now=70.0)
    assert idle == {"a": 0.0, "b": 0.0}
    assert to_retire(idle, wanted=0, timeout=60) == []
    assert to_retire(idleness.seen({"a": False, "b": True}, now=131.0), 0, 60) == ["a"]


def test_readings_too_far_apart_start_every_count_again() -> None:
    """Idle at the readings before a gap and after it, it may have run a job in between."""
    idleness = Idleness.of(gap=3.0)
    idleness.seen({"a": False}, now=0.0)
    assert idleness.seen({"a": False}, now=2.0) == {"a": 2.0}
    assert idleness.seen({"a": False}, now=61.0) == {"a": 0.0}  # 59 s without a reading
    assert idleness.seen({"a": False}, now=63.0) == {"a": 2.0}


class _Cluster(TableStub):
    """One controller and one worker-only node whose host is idle and answers `retire` with
    `leaves` (False: work arrived meanwhile)."""

    controllers = ["choreography:controller:c1"]
    workers = ["choreography:worker:w1"]

    def __init__(self) -> None:
        self.leaves = True
        self.retire_calls: list[float] = []
        self.clock = FakeClock()

    async def answer(self, name: str, method: str, args: tuple[Any, ...]) -> Any:
        if method == "load":
            return (0, 0)
        if method == "retire":
            self.retire_calls.append(self.clock.now().timestamp())
            return self.leaves
        raise AssertionError(f"{name} asked {method}")


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> _Cluster:
    import choreography_ray.runtime.autoscaling as autoscaling

    monkeypatch.setattr(autoscaling, "mark_retired", lambda *args: None)
    monkeypatch.setattr(autoscaling, "retired_nodes", lambda namespace: set())
    return _Cluster()


def _giving_back(cluster: _Cluster) -> AutoscaleRequests:
    host = SimpleNamespace(
        name="choreography:controller:c1",
        namespace="ns",
        options=JobsOptions(membership_interval="1s", worker_idle_timeout="60s"),
        clock=cluster.clock,
        routes=cluster,
    )
    return AutoscaleRequests(host, lambda: True, lambda: 0, per_node=8, request=lambda n: None)


def _checks(run, requests: AutoscaleRequests, clock: FakeClock, seconds: int) -> None:
    for _ in range(seconds):
        run(clock.advance(1))
        run(requests.check())


def test_a_node_is_not_given_back_for_a_gap_in_the_checks(run, cluster) -> None:
    """The checks stopped for 70 s (they wait for the control store while it restarts); the
    node, idle before and after, may have run a job meanwhile: its count starts again."""
    requests = _giving_back(cluster)
    requests.autoscaler = lambda: True
    _checks(run, requests, cluster.clock, 30)
    run(cluster.clock.advance(70))  # no check meanwhile
    _checks(run, requests, cluster.clock, 30)
    assert cluster.retire_calls == []
    _checks(run, requests, cluster.clock, 31)
    assert len(cluster.retire_calls) == 1  # 60 s of checks that found it idle


def test_a_node_whose_hosts_refused_to_leave_is_idle_again_from_scratch(run, cluster) -> None:
    requests = _giving_back(cluster)
    requests.autoscaler = lambda: True
    cluster.leaves = False  # work arrived as it was given back
    _checks(run, requests, cluster.clock, 62)
    assert len(cluster.retire_calls) == 1
    _checks(run, requests, cluster.clock, 30)
    assert len(cluster.retire_calls) == 1, "asked again at once, as if idle all along"


def test_retired_nodes_come_back_before_new_ones_are_needed() -> None:
    assert to_restore(["r2", "r1"], hosted=1, wanted=2) == ["r1"]
    assert to_restore(["r1"], hosted=2, wanted=2) == []
