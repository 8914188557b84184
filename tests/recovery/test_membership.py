"""Membership, in-process: snapshots, what changed between two, who recovers, and the watch
that reacts, under a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from choreography_ray.engine.clock import FakeClock, settle
from choreography_ray.jobs import JobKey
from choreography_ray.recovery.keys import KeyCatalog
from choreography_ray.recovery.membership import (
    ClusterSnapshot,
    MembershipChange,
    NodeInfo,
    diff,
    elected,
    recovers,
)
from choreography_ray.recovery.retries import Partitions
from choreography_ray.recovery.watch import MembershipWatch

HEAD = NodeInfo("head", True, "10.0.0.1:1", started=100.0, controller=True)
SECOND = NodeInfo("second", True, "10.0.0.2:1", started=200.0, controller=True)
W1 = NodeInfo("w1", True, "10.0.0.3:1", started=150.0, worker=True)
W2 = NodeInfo("w2", True, "10.0.0.4:1", started=160.0, worker=True)


def dead(node: NodeInfo) -> NodeInfo:
    return NodeInfo(node.node_id, False, node.address, node.started, node.controller, node.worker)


def hosts(*nodes: NodeInfo) -> dict[str, str]:
    found = {}
    for node in nodes:
        if node.controller:
            found[f"c:{node.node_id}"] = node.node_id
        if node.worker:
            found[f"w:{node.node_id}"] = node.node_id
    return found


def snapshot(*nodes: NodeInfo, listed: tuple[NodeInfo, ...] | None = None) -> ClusterSnapshot:
    return ClusterSnapshot.of(nodes, hosts(*(nodes if listed is None else listed)))


FULL = snapshot(HEAD, SECOND, W1, W2)


# -- the difference of two snapshots ----------------------------------------------------------


def test_nothing_changed_is_an_empty_change() -> None:
    assert diff(FULL, snapshot(HEAD, SECOND, W1, W2)) == MembershipChange()
    assert diff(FULL, FULL).empty


def test_a_dead_node_and_its_hosts_are_lost_even_while_ray_still_lists_them() -> None:
    after = snapshot(HEAD, SECOND, W1, dead(W2), listed=(HEAD, SECOND, W1, W2))
    change = diff(FULL, after)
    assert change.dead_nodes == {"w2"}
    assert change.hosts_gone == {"w:w2"}
    assert change.losses and not change.joined_nodes and not change.hosts_appeared


def test_a_node_gone_from_the_table_is_dead() -> None:
    change = diff(FULL, snapshot(HEAD, SECOND, W1))
    assert change.dead_nodes == {"w2"} and change.hosts_gone == {"w:w2"}


def test_a_host_killed_while_its_node_lives_is_lost_and_no_node_died() -> None:
    after = snapshot(HEAD, SECOND, W1, W2, listed=(HEAD, SECOND, W1))
    change = diff(FULL, after)
    assert change == MembershipChange(hosts_gone=frozenset({"w:w2"}))
    assert change.losses


def test_a_joined_node_and_its_hosts_appear_in_two_readings() -> None:
    before = snapshot(HEAD, W1)
    joined = snapshot(HEAD, W1, W2, listed=(HEAD, W1))
    assert diff(before, joined) == MembershipChange(joined_nodes=frozenset({"w2"}))
    assert not diff(before, joined).losses
    started = snapshot(HEAD, W1, W2)
    assert diff(joined, started) == MembershipChange(hosts_appeared=frozenset({"w:w2"}))


def test_a_host_started_again_under_its_name_is_lost_once_and_appears() -> None:
    # Seen without it in between: the reading without it is the loss.
    without = snapshot(HEAD, W1, listed=(HEAD,))
    assert diff(snapshot(HEAD, W1), without).hosts_gone == {"w:w1"}
    assert diff(without, snapshot(HEAD, W1)).hosts_appeared == {"w:w1"}


def incarnated(snap: ClusterSnapshot, **actors: str) -> ClusterSnapshot:
    return ClusterSnapshot.of(
        snap.nodes.values(), snap.hosts, {f"w:{n}": a for n, a in actors.items()}
    )


def test_a_host_killed_and_started_again_between_two_readings_is_lost_by_its_incarnation() -> None:
    """Killed and started again within one interval, the host keeps its name: only the actor
    that bears it tells. Without this, a controller whose reading missed the gap kept its
    steps on the dead process for minutes (fault matrix, case 5)."""
    before = incarnated(snapshot(HEAD, W1, W2), w1="actor-1", w2="actor-2")
    after = incarnated(snapshot(HEAD, W1, W2), w1="actor-1b", w2="actor-2")
    change = diff(before, after)
    assert change == MembershipChange(
        hosts_gone=frozenset({"w:w1"}), hosts_appeared=frozenset({"w:w1"})
    )
    unknown = ClusterSnapshot.of(after.nodes.values(), after.hosts)  # the table unread
    assert diff(before, unknown).empty and diff(unknown, after).empty


# -- who recovers -----------------------------------------------------------------------------


def controllers(snap: ClusterSnapshot) -> list[str]:
    return [name for name in snap.hosts if name.startswith("c:")]


def test_the_oldest_live_controller_host_is_elected() -> None:
    assert elected(FULL, controllers(FULL)) == "c:head"
    after = snapshot(dead(HEAD), SECOND, W1, W2)
    assert elected(after, controllers(after)) == "c:second"


def test_a_tie_in_start_is_broken_by_address_then_every_host_agrees() -> None:
    early = NodeInfo("zz", True, "10.0.0.9:1", started=100.0, controller=True)
    late_address = NodeInfo("aa", True, "10.0.0.1:2", started=100.0, controller=True)
    snap = snapshot(early, late_address)
    assert elected(snap, controllers(snap)) == "c:aa"


def test_a_node_whose_start_is_unknown_counts_as_youngest() -> None:
    unknown = NodeInfo("old", True, "10.0.0.0:1", started=None, controller=True)
    snap = snapshot(unknown, SECOND)
    assert elected(snap, controllers(snap)) == "c:second"


def test_a_controller_host_not_listed_or_on_a_dead_node_is_not_elected() -> None:
    snap = snapshot(HEAD, SECOND, listed=(SECOND,))
    assert elected(snap, controllers(snap)) == "c:second"
    assert elected(snapshot(dead(HEAD)), ["c:head"]) is None


@pytest.mark.parametrize(
    ("me", "complete", "expected"),
    [
        ("c:head", True, True),
        ("c:second", True, False),  # the elected host covers every partition
        ("c:head", False, True),
        ("c:second", False, True),  # an incomplete catalog: every survivor recovers
    ],
)
def test_with_a_complete_catalog_only_the_elected_host_recovers(me, complete, expected) -> None:
    assert recovers(me, FULL, controllers(FULL), complete) is expected


def test_a_host_that_sees_no_live_controller_recovers() -> None:
    assert recovers("c:second", snapshot(W1), [], complete=True)


# -- the watch --------------------------------------------------------------------------------


class Host:
    """A controller host as the watch sees it: records what it was asked."""

    def __init__(self, name: str = "c:head", complete: bool = True) -> None:
        self.name = name
        self.complete = complete
        self.lost: list[set[str]] = []
        self.told: list[dict[str, str | None]] = []
        """Each loss with the incarnations that died."""
        self.passes: list[tuple[JobKey, ...]] = []
        self.started: list[str] = []
        self.changed = 0
        self.start_fails = 0
        self.pass_gate: asyncio.Event | None = None
        self.down = False
        self.retired_nodes: set[str] = set()
        self.drains: list[dict[str, float]] = []
        """`choreography down` marked the cluster as being taken down."""

    def is_controller(self, host: str) -> bool:
        return host.startswith("c:")

    async def hosts_lost(self, names: Mapping[str, str | None]) -> None:
        self.lost.append(set(names))
        self.told.append(dict(names))

    async def catalog(self) -> KeyCatalog:
        return KeyCatalog((JobKey(),), () if self.complete else ("a provider",))

    async def rehydrate(self, catalog: KeyCatalog) -> None:
        self.passes.append(catalog.keys)
        if self.pass_gate is not None:
            await self.pass_gate.wait()

    async def start_node(self, node: NodeInfo) -> None:
        if self.start_fails:
            self.start_fails -= 1
            raise ConnectionError("storage down")
        self.started.append(node.node_id)

    async def hosts_changed(self) -> None:
        self.changed += 1

    async def taking_down(self) -> bool:
        return self.down

    async def retired(self, node_id: str) -> bool:
        return node_id in self.retired_nodes

    async def nodes_draining(self, drains: Mapping[str, float]) -> None:
        self.drains.append(dict(drains))


class Readings:
    """The snapshots the watch reads, in turn; the last one repeats."""

    def __init__(self, *snaps: ClusterSnapshot) -> None:
        self.snaps = list(snaps)
        self.count = 0

    def __call__(self) -> ClusterSnapshot:
        self.count += 1
        return self.snaps.pop(0) if len(self.snaps) > 1 else self.snaps[0]

    def then(self, snap: ClusterSnapshot) -> None:
        self.snaps = [snap]


async def _watching(host: Host, readings: Readings, clock: FakeClock) -> MembershipWatch:
    watch = MembershipWatch(host, readings, clock, interval=1.0)
    await watch.start()
    await settle()  # the loop is asleep on the clock
    return watch


async def _tick(clock: FakeClock, readings: Readings, seconds: float = 1.0) -> None:
    """One interval passes and its reading (in a thread) is taken and reacted to."""
    count = readings.count
    await clock.advance(seconds)
    for _ in range(200):
        if readings.count > count:
            break
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.02)  # the thread's answer comes back to the loop
    await settle()


def test_the_first_reading_is_the_baseline_and_nothing_is_done(run: Any) -> None:
    async def scenario() -> None:
        clock, host, readings = FakeClock(), Host(), Readings(FULL)
        watch = await _watching(host, readings, clock)
        await _tick(clock, readings)
        assert (host.lost, host.passes, host.started, host.changed) == ([], [], [], 0)
        assert readings.count == 2
        watch.close()

    run(scenario())


def test_the_watch_reads_once_per_interval_never_more(run: Any) -> None:
    async def scenario() -> None:
        clock, host, readings = FakeClock(), Host(), Readings(FULL)
        watch = await _watching(host, readings, clock)
        await clock.advance(0.5)
        await settle()
        assert readings.count == 1
        for turn in range(3):
            await _tick(clock, readings)
            assert readings.count == 2 + turn
        watch.close()

    run(scenario())


def test_every_reading_goes_through_the_threads_the_watch_was_given(run: Any) -> None:
    """The runtime gives the watch the control store's own threads: a reading of Ray's tables
    hangs while its control store restarts, and must not take the steps' threads."""
    through: list[str] = []

    async def off_loop(read: Any) -> ClusterSnapshot:
        through.append("reading")
        return await asyncio.to_thread(read)

    async def scenario() -> None:
        clock, host, readings = FakeClock(), Host(), Readings(FULL)
        watch = MembershipWatch(host, readings, clock, interval=1.0, off_loop=off_loop)
        await watch.start()
        await settle()
        await _tick(clock, readings)
        watch.close()
        assert through == ["reading"] * readings.count and readings.count == 2

    run(scenario())


def test_a_killed_host_is_reported_lost_and_the_elected_host_recovers(run: Any) -> None:
    async def scenario() -> None:
        clock, host, readings = FakeClock(), Host(), Readings(FULL)
        watch = await _watching(host, readings, clock)
        readings.then(snapshot(HEAD, SECOND, W1, W2, listed=(HEAD, SECOND, W1)))
        await _tick(clock, readings)
        assert host.lost == [{"w:w2"}]
        assert host.passes == [(JobKey(),)]
        assert host.changed == 1
        assert watch.lost == ["w:w2"] and watch.passes == 1
        await _tick(clock, readings)  # the same loss read again is no new change
        assert len(host.lost) == 1 and len(host.passes) == 1
        watch.close()

    run(scenario())


async def _two_hosts(clock: FakeClock) -> tuple[Host, Host, dict[str, Readings], list[Any]]:
    """Two controller hosts, each with its watch over the full cluster."""
    head, second = Host("c:head"), Host("c:second")
    readings = {head.name: Readings(FULL), second.name: Readings(FULL)}
    watches = [await _watching(h, readings[h.name], clock) for h in (head, second)]
    return head, second, readings, watches


async def _both_read(clock: FakeClock, readings: dict[str, Readings]) -> None:
    """One interval on, and both hosts' watches have taken their reading (in threads)."""
    await clock.advance(1.0)
    for _ in range(200):
        if all(r.count >= 2 for r in readings.values()):
            break
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.02)


def test_a_dead_node_is_reported_by_every_host_but_recovered_by_the_elected_one(
    run: Any,
) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        head, second, readings, watches = await _two_hosts(clock)
        for r in readings.values():
            r.then(snapshot(HEAD, SECOND, W1, dead(W2)))
        await _both_read(clock, readings)
        await settle()
        assert head.lost == second.lost == [{"w:w2"}]  # each tells its own activations
        assert len(head.passes) == 1 and second.passes == []
        for watch in watches:
            watch.close()

    run(scenario())


def test_with_an_incomplete_catalog_every_survivor_recovers(run: Any) -> None:
    async def scenario() -> None:
        clock, host, readings = FakeClock(), Host("c:second", complete=False), Readings(FULL)
        watch = await _watching(host, readings, clock)
        readings.then(snapshot(dead(HEAD), SECOND, W1, W2))
        await _tick(clock, readings)
        assert host.lost == [{"c:head"}]
        assert len(host.passes) == 1
        watch.close()

    run(scenario())


def test_passes_never_overlap_and_a_death_during_one_asks_for_one_more(run: Any) -> None:
    async def scenario() -> None:
        clock, host, readings = FakeClock(), Host(), Readings(FULL)
        host.pass_gate = asyncio.Event()
        watch = await _watching(host, readings, clock)
        readings.then(snapshot(HEAD, SECOND, W1, dead(W2)))
        await _tick(clock, readings)
        assert len(host.passes) == 1  # under way, held
        readings.then(snapshot(HEAD, SECOND, dead(W1), dead(W2)))
        await _tick(clock, readings)
        assert len(host.passes) == 1  # not a second one at the same time
        host.pass_gate.set()
        await settle()
        assert len(host.passes) == 2  # one more, after it
        watch.close()

    run(scenario())


def test_a_joined_node_with_a_role_gets_its_hosts_from_the_elected_host_only(run: Any) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        head, second = Host("c:head"), Host("c:second")
        base = snapshot(HEAD, SECOND, W1)
        readings = {head.name: Readings(base), second.name: Readings(base)}
        watches = [await _watching(h, readings[h.name], clock) for h in (head, second)]
        bare = NodeInfo("bare", True, "10.0.0.8:1", started=300.0)  # no role: nothing to start
        joined = snapshot(HEAD, SECOND, W1, W2, bare, listed=(HEAD, SECOND, W1))
        for r in readings.values():
            r.then(joined)
        await _both_read(clock, readings)
        await settle()
        assert head.started == ["w2"] and second.started == []
        assert head.passes == [] and head.lost == []  # a join is no loss
        for watch in watches:
            watch.close()

    run(scenario())


def test_a_retired_node_whose_hosts_left_it_gets_none_started_again(run: Any) -> None:
    """Its hosts left it, idle, for Ray's autoscaler to remove it: the watch sees them gone
    from a live node (as after a kill) but starts nothing there."""

    async def scenario() -> None:
        clock, host = FakeClock(), Host()
        readings = Readings(snapshot(HEAD, W1, W2))
        watch = await _watching(host, readings, clock)
        host.retired_nodes.add("w2")
        readings.then(snapshot(HEAD, W1, W2, listed=(HEAD, W1)))  # w2's host left
        await _tick(clock, readings)
        await settle()
        assert host.started == []
        watch.close()

    run(scenario())


def test_a_failed_start_of_a_joined_node_is_retried_alone(run: Any) -> None:
    async def scenario() -> None:
        clock, host, readings = FakeClock(), Host(), Readings(snapshot(HEAD, W1))
        host.start_fails = 2
        watch = await _watching(host, readings, clock)
        readings.then(snapshot(HEAD, W1, W2, listed=(HEAD, W1)))
        await _tick(clock, readings)
        assert host.started == []
        await clock.advance(1.0)  # first retry after 1 s: fails again
        assert host.started == []
        await clock.advance(2.0)  # then after 2 s
        assert host.started == ["w2"]
        assert watch.started == ["w2"]
        watch.close()

    run(scenario())


def test_a_host_replaced_between_two_readings_is_lost_and_needs_no_start(run: Any) -> None:
    async def scenario() -> None:
        first = incarnated(snapshot(HEAD, W1, W2), w1="actor-1", w2="actor-2")
        clock, host, readings = FakeClock(), Host(), Readings(first)
        watch = await _watching(host, readings, clock)
        readings.then(incarnated(snapshot(HEAD, W1, W2), w1="actor-1b", w2="actor-2"))
        await _tick(clock, readings)
        assert host.lost == [{"w:w1"}] and host.passes == [(JobKey(),)]
        assert host.told == [{"w:w1": "actor-1"}]  # the incarnation that died, not its successor
        assert host.started == []  # already started again, by another controller's watch
        await _tick(clock, readings)  # the new incarnation read again: no new change
        assert len(host.lost) == 1
        watch.close()

    run(scenario())


def test_a_host_killed_while_its_node_lives_is_started_again_by_the_elected_host(
    run: Any,
) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        head, second, readings, watches = await _two_hosts(clock)
        for r in readings.values():
            r.then(snapshot(HEAD, SECOND, W1, W2, listed=(HEAD, SECOND, W1)))
        await _both_read(clock, readings)
        await settle()
        assert head.started == ["w2"] and second.started == []
        assert head.lost == [{"w:w2"}]  # its steps are sent again meanwhile
        for watch in watches:
            watch.close()

    run(scenario())


def test_a_killed_elected_controller_host_is_started_again_by_the_next_one(run: Any) -> None:
    async def scenario() -> None:
        clock, host, readings = FakeClock(), Host("c:second"), Readings(FULL)
        watch = await _watching(host, readings, clock)
        readings.then(snapshot(HEAD, SECOND, W1, W2, listed=(SECOND, W1, W2)))
        await _tick(clock, readings)
        assert host.started == ["head"]
        watch.close()

    run(scenario())


def test_the_hosts_of_a_dead_node_are_not_started_again(run: Any) -> None:
    async def scenario() -> None:
        clock, host, readings = FakeClock(), Host(), Readings(FULL)
        watch = await _watching(host, readings, clock)
        readings.then(snapshot(HEAD, SECOND, W1, dead(W2), listed=(HEAD, SECOND, W1)))
        await _tick(clock, readings)
        assert host.lost == [{"w:w2"}] and host.started == []
        watch.close()

    run(scenario())


def test_while_the_cluster_is_taken_down_no_host_is_started(run: Any) -> None:
    """`down` stops the hosts one after the other: the ones it stopped are not started again
    behind it, nor are a joined node's."""

    async def scenario() -> None:
        clock, host, readings = FakeClock(), Host(), Readings(snapshot(HEAD, SECOND, W1))
        host.down = True
        watch = await _watching(host, readings, clock)
        readings.then(snapshot(HEAD, SECOND, W1, W2, listed=(HEAD, SECOND)))
        await _tick(clock, readings)
        assert host.lost == [{"w:w1"}]
        assert host.started == [] and watch.started == []
        watch.close()

    run(scenario())


def test_a_retried_start_gives_way_to_down_begun_meanwhile(run: Any) -> None:
    async def scenario() -> None:
        clock, host, readings = FakeClock(), Host(), Readings(FULL)
        host.start_fails = 1
        watch = await _watching(host, readings, clock)
        readings.then(snapshot(HEAD, SECOND, W1, W2, listed=(HEAD, SECOND, W1)))
        await _tick(clock, readings)
        assert host.started == []  # failed: retried after 1 s
        host.down = True
        await clock.advance(1.0)
        await settle()
        await clock.advance(60.0)
        await settle()
        assert host.started == [] and watch.started == []
        watch.close()

    run(scenario())


def test_a_failing_reading_is_logged_and_the_watch_goes_on(run: Any, caplog) -> None:
    async def scenario() -> None:
        clock, host = FakeClock(), Host()
        calls = {"n": 0}

        def read() -> ClusterSnapshot:
            calls["n"] += 1
            if calls["n"] == 2:
                raise ConnectionError("control store unreachable")
            return FULL if calls["n"] < 3 else snapshot(HEAD, SECOND, W1, dead(W2))

        watch = MembershipWatch(host, read, clock, interval=1.0)
        await watch.start()
        await settle()
        for _ in range(2):
            seen = calls["n"]
            await clock.advance(1.0)
            for _ in range(200):
                if calls["n"] > seen:
                    break
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.02)
            await settle()
        assert host.lost == [{"w:w2"}]
        watch.close()

    run(scenario())
    assert "reading the cluster's membership failed" in caplog.text


# -- a membership pass rehydrates known partitions again --------------------------------------


def test_a_pass_with_again_rehydrates_known_partitions_and_skips_the_retry_wait(run: Any) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        attempts: list[JobKey] = []
        failing = {JobKey(scope="b")}

        async def rehydrate(key: JobKey) -> None:
            attempts.append(key)
            if key in failing:
                raise ConnectionError("storage down")

        partitions = Partitions(rehydrate, clock, what="test")
        a, b = JobKey(scope="a"), JobKey(scope="b")
        await partitions.recover([a, b])
        assert attempts == [a, b] and partitions.known == {a} and partitions.failing == {b}
        await partitions.recover([a, b])
        assert attempts == [a, b, b]  # a known one is skipped by an ordinary pass
        failing.clear()
        await partitions.recover([a, b], again=True)  # b at once, not after its chain's wait
        assert attempts == [a, b, b, a, b]
        assert partitions.known == {a, b} and partitions.failing == frozenset()
        partitions.close()

    run(scenario())


def test_the_watch_says_whether_its_host_is_elected_for_single_duties(run: Any) -> None:
    """The reconciliation sweep runs on the elected host only (a duty nobody takes before the
    first reading is worse than one taken twice)."""

    async def scenario() -> None:
        clock = FakeClock()
        second = MembershipWatch(Host("c:second"), Readings(FULL), clock, interval=1.0)
        assert second.elected  # nothing read yet
        await second.start()
        assert not second.elected  # c:head is older
        head_readings = Readings(FULL)
        head = await _watching(Host("c:head"), head_readings, clock)
        assert head.elected
        head_readings.then(snapshot(dead(HEAD), SECOND, W1, W2))
        second.read.then(snapshot(dead(HEAD), SECOND, W1, W2))  # type: ignore[attr-defined]
        await _tick(clock, second.read)  # type: ignore[arg-type]
        assert second.elected
        head.close()
        second.close()

    run(scenario())


def _draining(base: ClusterSnapshot, **drains: float) -> ClusterSnapshot:
    return ClusterSnapshot(base.nodes, base.hosts, base.incarnations, drains)


def test_a_node_that_begins_to_drain_is_a_change_once() -> None:
    drained = _draining(FULL, w1=1_000.0)
    change = diff(FULL, drained)
    assert change.draining_nodes == {"w1"} and not change.empty and not change.losses
    assert diff(drained, _draining(FULL, w1=1_000.0)).empty  # still draining: nothing new


def test_a_controller_whose_node_drains_is_not_elected_while_another_stays() -> None:
    controllers = [name for name in FULL.hosts if name.startswith("c:")]
    assert elected(FULL, controllers) == "c:head"  # the oldest
    assert elected(_draining(FULL, head=1_000.0), controllers) == "c:second"
    both = _draining(FULL, head=1_000.0, second=1_000.0)
    assert elected(both, controllers) == "c:head"  # all drain: the oldest still


def test_the_watch_tells_its_host_of_a_node_that_begins_to_drain_once(run: Any) -> None:
    async def scenario() -> None:
        clock, host = FakeClock(), Host()
        readings = Readings(FULL)
        watch = await _watching(host, readings, clock)
        readings.then(_draining(FULL, w2=1_000.0))
        await _tick(clock, readings)
        await _tick(clock, readings)  # the same drain read again: told once
        await settle()
        assert host.drains == [{"w2": 1_000.0}]
        watch.close()

    run(scenario())
