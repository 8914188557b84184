"""Steps spread over the eligible worker hosts by load, a running step's host kept.

Each worker host holds runs (performing and queued) and performs up to its share of its node's
`max_parallel_steps` at once. A batch of starts is split by what each host has free: the steps
go where (runs + new) / capacity stays lowest, so an idle host takes the most, a loaded one the
fewest, and hosts of a bigger node proportionally more; hosts that are alike split evenly, the
extra ones to the first in order (stable). A small batch (`SMALL_BATCH`) of async steps goes
whole to the least loaded host when that host performs that many at once: one call and one
group commit instead of one per host. A step that ran on a host that still lives and may
run it goes back there (a recount found its run there). One call per chosen host per batch, as
before; the split costs O(hosts) per step type and one pass over the batch.

What a dispatcher knows of the loads (`WorkerLoads`) is each host's last answer to a cheap
question asked at most every `cadence` seconds, off the path of the batch, plus what the
dispatcher itself sent it since it asked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..engine.messages import StepStart
from ..engine.step_types import StepTypes
from ..jobs.errors import NoEligibleJobWorker

LOAD_CADENCE = 1.0
"""Seconds between two questions of a dispatcher to its worker hosts about their load."""

SMALL_BATCH = 16
"""Up to this many async steps go whole to the least loaded host when it performs that many at
once. Split over two idle hosts, a 10-step job's `start()` answered in 11.1-11.5 ms (p50) and
the job completed in 15.1-15.3 ms; whole, 9.3-10.1 and 12.6-13.7 ms: a second call and a second
group commit cost more than five more no-op steps on one host's event loop (benchmarks/
RESULTS.md, fifteenth sitting). The test is the host's parallelism, not its free slots: between
two load answers a dispatcher counts what it sent but not what finished, so the free slots it
would see are guessed low. Synchronous steps are always shared: a host performs one per CPU
of its part of the node, while the parallelism it answers is its async steps'."""


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """What a worker host answers about its load."""

    runs: int
    """Runs it holds: performing, and queued for a free slot."""
    capacity: int
    """How many it performs at once (its share of its node's `max_parallel_steps`)."""


def shares(
    count: int, runs: Sequence[float], capacity: Sequence[float], *, on_loop: bool = False
) -> list[int]:
    """How many of `count` new steps each host takes: the least loaded relative to its
    capacity first, until the hosts it reaches are equally loaded (water filling); what does
    not divide evenly goes to the host closest to its next step, then the first in order.
    `on_loop` (the steps perform on the hosts' event loops, async): up to `SMALL_BATCH` go whole
    to the least loaded host, the larger among equals, when it performs that many at once."""
    hosts = len(runs)
    if hosts == 0:
        raise ValueError("no host to share the steps among")
    if hosts == 1 or count <= 0:
        return [max(0, count)] + [0] * (hosts - 1)
    ratio = [runs[i] / capacity[i] for i in range(hosts)]
    if on_loop and count <= SMALL_BATCH:
        least = min(range(hosts), key=lambda i: (ratio[i], -capacity[i], i))
        if count <= capacity[least]:
            given = [0] * hosts
            given[least] = count
            return given
    order = sorted(range(hosts), key=lambda i: (ratio[i], i))
    held = took = 0.0
    reached = 0
    level = 0.0
    while reached < hosts:
        index = order[reached]
        held += runs[index]
        took += capacity[index]
        reached += 1
        level = (count + held) / took
        if reached == hosts or level <= ratio[order[reached]]:
            break
    given = [0] * hosts
    rests: list[tuple[float, int, int]] = []
    total = 0
    for place in range(reached):
        index = order[place]
        exact = max(0.0, level * capacity[index] - runs[index])
        whole = min(int(exact), count - total)
        given[index] = whole
        total += whole
        rests.append((whole - exact, place, index))
    rests.sort()
    for place in range(count - total):
        given[rests[place % len(rests)][2]] += 1
    return given


@dataclass
class WorkerLoads:
    """A dispatcher's estimate of each worker host's load: the host's last answer, plus the
    starts this dispatcher sent it since asking (steps it finished since count until the next
    answer)."""

    cadence: float = LOAD_CADENCE
    answers: dict[str, WorkerLoad] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)
    """Starts sent to each host, ever."""
    sent_when_asked: dict[str, int] = field(default_factory=dict)
    """`sent` as it was when the answer in `answers` was asked for."""
    asked_at: float | None = None

    def due(self, now: float) -> bool:
        return self.asked_at is None or now - self.asked_at >= self.cadence

    def asking(self, now: float, hosts: Sequence[str]) -> dict[str, int]:
        """Mark a question to `hosts` as asked now; what was sent to each so far, to be
        handed back with its answer."""
        self.asked_at = now
        return {name: self.sent.get(name, 0) for name in hosts}

    def answered(self, host: str, load: WorkerLoad, sent_when_asked: int) -> None:
        self.answers[host] = load
        self.sent_when_asked[host] = sent_when_asked

    def took(self, host: str, starts: int) -> None:
        self.sent[host] = self.sent.get(host, 0) + starts

    def forget(self, host: str) -> None:
        """A host that left the table: what was known of it was its old process's. Under the
        same name a restarted host starts empty; an estimate kept from before its death (its
        last answer plus every start sent to it since) would keep it looking loaded, and the
        batches would pass it over until it answered again."""
        self.answers.pop(host, None)
        self.sent.pop(host, None)
        self.sent_when_asked.pop(host, None)

    def runs(self, host: str) -> float:
        since = self.sent.get(host, 0) - self.sent_when_asked.get(host, 0)
        answer = self.answers.get(host)
        return since + (answer.runs if answer is not None else 0)

    def capacities(self, hosts: Sequence[str]) -> list[float]:
        """Each host's capacity; one that has not answered counts as the known ones' mean."""
        known = [a.capacity for name in hosts if (a := self.answers.get(name)) and a.capacity > 0]
        default = sum(known) / len(known) if known else 1.0
        found = []
        for name in hosts:
            answer = self.answers.get(name)
            found.append(float(answer.capacity) if answer and answer.capacity > 0 else default)
        return found


@dataclass
class Spread:
    """Which starts go to which worker host, and those no host may take."""

    shares: dict[str, list[StepStart]] = field(default_factory=dict)
    unplaced: list[StepStart] = field(default_factory=list)
    error: NoEligibleJobWorker | None = None
    """Why the unplaced starts have no host."""


def spread(
    starts: Sequence[StepStart],
    sticky: Mapping[str, str],
    hosts_for: Callable[[str], Sequence[str]],
    loads: WorkerLoads,
    step_types: StepTypes | None = None,
    on_loop: Callable[[str], bool] | None = None,
) -> Spread:
    """Split `starts` over worker hosts by load. `hosts_for(step_type)` answers the hosts that
    may run a step type ("" when the types are not known), in a stable order, or raises
    `NoEligibleJobWorker`; a step named in `sticky` goes to that host while it is among them.
    `on_loop(step_type)`: whether the type's steps perform on the hosts' event loops (async),
    so that a small batch of them may go to one host whole (`shares`). What each host takes is
    added to `loads`."""
    groups: dict[str, Sequence[StepStart]]
    if step_types is None:
        groups = {"": starts}
    elif step_types.single is not None:
        groups = {step_types.single: starts}
    else:
        of = step_types.of
        by_type: dict[str, list[StepStart]] = {}
        for start in starts:
            by_type.setdefault(of(start.step_id), []).append(start)
        groups = dict(by_type)
    found = Spread()
    placeable: list[tuple[str, Sequence[str], Sequence[StepStart]]] = []
    for step_type, group in groups.items():
        try:
            placeable.append((step_type, hosts_for(step_type), group))
        except NoEligibleJobWorker as error:
            found.unplaced.extend(group)
            found.error = error
    # The types fewer hosts run go first: the others then fill around them.
    placeable.sort(key=lambda entry: len(entry[1]))
    taken: dict[str, int] = {}
    """What this batch gave each host so far (a later step type sees it as load)."""
    for step_type, hosts, group in placeable:
        free: Sequence[StepStart] = group
        if sticky:
            able = set(hosts)
            unbound: list[StepStart] = []
            for start in group:
                host = sticky.get(start.step_id)
                if host is not None and host in able:
                    found.shares.setdefault(host, []).append(start)
                    taken[host] = taken.get(host, 0) + 1
                else:
                    unbound.append(start)
            free = unbound
        if not free:
            continue
        if len(hosts) == 1:
            counts = [len(free)]
        else:
            runs = [loads.runs(name) + taken.get(name, 0) for name in hosts]
            async_steps = on_loop is not None and on_loop(step_type)
            counts = shares(len(free), runs, loads.capacities(hosts), on_loop=async_steps)
        offset = 0
        for name, count in zip(hosts, counts, strict=True):
            if count:
                found.shares.setdefault(name, []).extend(free[offset : offset + count])
                taken[name] = taken.get(name, 0) + count
                offset += count
    for name, count in taken.items():
        loads.took(name, count)
    return found
