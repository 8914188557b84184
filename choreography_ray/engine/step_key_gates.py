"""A worker host's runs of step types with a concurrency key: each takes a place of its key
(`step_keys`, in storage, cluster-wide) just before it would perform, and gives it back once
its work is over.

A run whose key is full is set aside (`park`): it leaves the worker's queue and holds no slot,
so the slot goes to the next run, of another key or of no key, and nothing deadlocks behind
a full key. Its record says it waits (`JobStepState.waiting_for_key`, written once). Set-aside
runs ask again at once when a run of their key here gives its place back, and every
`concurrency_poll_interval` for places freed on other hosts or by leases that ran out. Each
asking pass goes round the waiting keys in turn, a key that got places moving to the back: a
key with many waiting runs never holds up another. A run that gets its place goes back to the
front of its job's queue, and waits there only for its job's turn to a slot. On one host the
runs of a key get places in the order they came to wait.

The host renews its places every third of `step_key_lease`; a host that dies gives them back
when they expire (`step_keys`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..jobs.options import JobsOptions
from ..jobs.registry import TypeKind, TypeRegistry
from ..jobs.state import JobKey, KeyWait
from ..storage.protocols import JobsStorage
from .clock import Clock
from .step_keys import StepPlace, give_back, record_id, renew, take

if TYPE_CHECKING:
    from .run import StepRun

log = logging.getLogger("choreography_ray.engine")

JobRef = tuple[JobKey, str]
Requeue = Callable[[JobRef, list["StepRun"]], None]
_RETRY_SECONDS = 1.0
"""How long a gate waits after storage failed it before it asks again."""
UNREADABLE_KEY = "(unreadable)"
"""The key of a run whose state's key cannot be read (checked when its job prepared it, so
only a checkpoint that changed the field can do it): it is still limited, under this key."""


class StepKeyGates:
    """A worker host's keyed runs: the places they hold and the runs that wait for one."""

    def __init__(
        self,
        storage: Callable[[], JobsStorage],
        registry: TypeRegistry,
        clock: Clock,
        options: JobsOptions,
        host: str,
        activation: str,
    ) -> None:
        self._storage = storage
        self._registry = registry
        self._clock = clock
        self.host = f"{host}#{activation}"
        """This host's name and activation: a new incarnation never renews the old one's."""
        self._poll = options.concurrency_poll_interval.total_seconds()
        self._lease = options.step_key_lease.total_seconds()
        self.requeue: Requeue = lambda job, runs: None
        """Queues runs that got their places ahead of their job's other runs (the queue's)."""
        self.ready: Callable[[], None] = lambda: None
        """Called once runs were queued again: the worker fills its slots."""
        self.room: Callable[[], int] = lambda: 1
        """Slots not performing now: a pass takes at most so many places of one key."""
        self._waiting: dict[str, deque[StepRun]] = {}
        """Runs set aside, by key record, the keys in turn order."""
        self._held: dict[str, dict[str, StepRun]] = {}
        """Runs holding places, by key record and run name: what the host renews."""
        self._returned: dict[str, set[str]] = {}
        self._wake = asyncio.Event()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.closed = False

    def place_of(self, run: StepRun) -> StepPlace:
        place = run.place
        if place is None:
            rule = run.step_class.concurrency
            assert rule is not None
            try:
                stored = run.record.state.state
                user_state = self._registry.load(stored, TypeKind.STATE) if stored else None
                key = rule.of(user_state) if user_state is not None else UNREADABLE_KEY
            except Exception as error:
                log.warning("step %s of job %s: %s", run.step_id, run.job_id, error)
                key = UNREADABLE_KEY
            job_key = run.key.job_key
            holder = f"{job_key.scope}/{job_key.namespace}/{run.job_id}/{run.step_id}"
            place = run.place = StepPlace(
                record_id(run.step_class.name, key), key, rule.max_running, holder
            )
        return place

    @property
    def waiting(self) -> int:
        return sum(len(runs) for runs in self._waiting.values())

    async def admit(self, run: StepRun) -> bool:
        """Whether `run` may perform now: it holds its place, or takes one. Otherwise it is
        set aside, visibly, and queued again once it has one."""
        place = self.place_of(run)
        if place.held:
            return True
        if not self._waiting.get(place.record):  # none waits before it here
            try:
                granted = await self._take(place.record, place.limit, [place.holder])
            except Exception as error:  # storage failed: it waits, and asks again
                log.warning("key %s: could not take a place: %s", place.key, error)
                granted = []
            if granted:  # a run stopped meanwhile performs not: it settles stopped
                self._hold(run, place)
                return True
        if run.cancelled:
            return True  # stopped meanwhile: it settles stopped at once, performing nothing
        self._set_aside(run, place)
        return False

    def give_back(self, run: StepRun) -> None:
        """The run's work is over (or it never began): its place goes back, soon, in one
        write with the other places of its key given back meanwhile."""
        place = run.place
        if place is None or not place.held or self.closed:
            return
        place.held = False
        held = self._held.get(place.record)
        if held is not None:
            held.pop(place.holder, None)
            if not held:
                del self._held[place.record]
        self._give_back(place.record, place.holder)

    def remove(self, job: JobRef, wanted: set[int]) -> list[StepRun]:
        """Take the waiting runs of `job` whose `id()` is in `wanted` (a stop)."""
        removed: list[StepRun] = []
        for runs in self._waiting.values():
            taken = [r for r in runs if r.key.job_key == job[0] and r.job_id == job[1]]
            for run in taken:
                if id(run) in wanted:
                    runs.remove(run)
                    run.wait_for_key(None, write=False)  # its stop's write says it ran not
                    removed.append(run)
        return removed

    def giving_back(self) -> list[asyncio.Task[None]]:
        """The writes giving places back, while under way (a host that shuts down waits)."""
        task = self._tasks.get("return")
        return [task] if task is not None and not task.done() else []

    def close(self) -> None:
        """The host goes: it gives nothing back (its places expire) and waits no more."""
        self.closed = True
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
        self._waiting.clear()
        self._held.clear()
        self._returned.clear()

    # -- inside -----------------------------------------------------------------------------

    async def _take(self, record: str, limit: int, runs: list[str]) -> list[str]:
        return await take(
            self._storage(),
            self._registry,
            record,
            limit=limit,
            host=self.host,
            runs=runs,
            now=self._clock.now().timestamp(),
            lease=self._lease,
        )

    def _hold(self, run: StepRun, place: StepPlace) -> None:
        place.held = True
        self._held.setdefault(place.record, {})[place.holder] = run
        if run.record.state.waiting_for_key is not None:
            run.wait_for_key(None, write=False)  # written with its Running
        self._start("renew", self._renew)

    def _set_aside(self, run: StepRun, place: StepPlace) -> None:
        self._waiting.setdefault(place.record, deque()).append(run)
        if run.record.state.waiting_for_key is None:
            wait = KeyWait(key=place.key, limit=place.limit, since=self._clock.now())
            run.wait_for_key(wait, write=True)
        self._start("admit", self._admit)

    def _give_back(self, record: str, holder: str) -> None:
        self._returned.setdefault(record, set()).add(holder)
        self._start("return", self._return)

    def _start(self, name: str, loop: Callable[[], object]) -> None:
        task = self._tasks.get(name)
        if task is None or task.done():
            self._tasks[name] = asyncio.get_running_loop().create_task(loop())  # type: ignore[arg-type]

    async def _return(self) -> None:
        """Give back the places returned meanwhile, one write per key; then the runs waiting
        here ask at once."""
        await asyncio.sleep(0)  # the runs that end in this turn of the loop, together
        while self._returned:
            record, holders = self._returned.popitem()
            try:
                await give_back(
                    self._storage(), self._registry, record, host=self.host, runs=holders
                )
            except Exception as error:  # left to the next renewal, which drops them
                log.warning("step key %s: could not give places back: %s", record, error)
                self._held.setdefault(record, {})
                self._start("renew", self._renew)
            if record in self._waiting:
                self._wake.set()

    async def _admit(self) -> None:
        """Ask for places for the waiting runs, pass after pass, until none waits."""
        while self._waiting:
            self._wake.clear()
            try:
                admitted = await self._pass()
            except Exception as error:
                log.warning("step keys: could not take places: %s", error)
                admitted = False
                await self._clock.sleep(_RETRY_SECONDS)
            if admitted or not self._waiting:
                continue
            woken = asyncio.ensure_future(self._wake.wait())
            timer = asyncio.ensure_future(self._clock.sleep(self._poll))
            try:
                await asyncio.wait((woken, timer), return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
                timer.cancel()

    async def _pass(self) -> bool:
        """One turn of every waiting key, in turn order; the runs that got places go back
        to their jobs' queues, the keys' runs interleaved."""
        room = max(1, self.room())
        stopped: list[StepRun] = []
        admitted: list[list[StepRun]] = [stopped]
        for record in list(self._waiting):
            runs = self._waiting.get(record, deque())
            for run in [run for run in runs if run.closed or run.cancelled]:
                runs.remove(run)
                if not run.closed:  # stopped while it waited: queued to settle stopped
                    stopped.append(run)
            if not runs:
                self._waiting.pop(record, None)
                continue
            wanted = list(runs)[:room]
            limit = self.place_of(wanted[0]).limit
            holders = [self.place_of(run).holder for run in wanted]
            granted = set(await self._take(record, limit, holders))
            if not granted:
                continue
            live = []
            for run in wanted:
                place = self.place_of(run)
                if place.holder not in granted:
                    continue
                if run in runs:
                    runs.remove(run)
                    self._hold(run, place)
                    live.append(run)
                else:  # stopped meanwhile, and settled without it
                    self._give_back(record, place.holder)
            if runs:
                self._waiting[record] = self._waiting.pop(record)  # its turn is over
            else:
                self._waiting.pop(record, None)
            admitted.append(live)
        if not any(admitted):
            return False
        by_job: dict[JobRef, list[StepRun]] = {}
        for index in range(max(len(got) for got in admitted)):
            for got in admitted:
                if index < len(got):
                    run = got[index]
                    by_job.setdefault((run.key.job_key, run.job_id), []).append(run)
        for job, queued in by_job.items():
            self.requeue(job, queued)
        self.ready()
        return True

    async def _renew(self) -> None:
        """Renew this host's places every third of the lease while it holds any; a place
        whose run is no longer held here is given back in the same write."""
        while self._held:
            await self._clock.sleep(self._lease / 3)
            for record in list(self._held):
                holding = set(self._held.get(record, {}))
                try:
                    await renew(
                        self._storage(),
                        self._registry,
                        record,
                        host=self.host,
                        holding=holding,
                        now=self._clock.now().timestamp(),
                        lease=self._lease,
                    )
                except Exception as error:  # the next renewal tries again, within the lease
                    log.warning("step key %s: could not renew places: %s", record, error)
                    continue
                if not self._held.get(record):
                    self._held.pop(record, None)


__all__ = ["UNREADABLE_KEY", "StepKeyGates"]
