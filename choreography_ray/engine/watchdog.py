"""The job's watchdog: every `job_watchdog_interval`, the steps this activation started long
ago are read back from storage, so that no step is left waiting on a run or a report that
will never come.

- An outcome stored but never heard (its report was lost) is counted from storage.
- A step whose worker host answers that it holds no run of it, and whose record holds no
  outcome, lost its run without storing anything (its outcome's write was refused, say): it
  is sent again, back to that host. Leases on or off, nothing then waits for a run that
  ended.
- With leases on (`step_lease_timeout`), a running step is started again only when the host
  in its lease is not part of the cluster (`Job.get_active_hosts`) **and** its lease expired;
  a step without a lease (not running yet, or written by a release without leases) is started
  again one lease period after its last change — back on the same host while it lives, where
  a run in progress answers that it has already started.

Only starts older than the quiet time are read (one lease period, or two watchdog intervals
with leases off), in batches, outside the job's turn: a healthy job costs nothing but a scan
of its tracked steps.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol

from ..jobs.state import JobStepState
from ..jobs.status import JobStatus, JobStepStatus
from .activation import PREPARE_BATCH, ActivationCore
from .context import maybe_await
from .messages import StepReport
from .outcomes import Outcomes
from .record import Released
from .stored_steps import stored_outcome


class Moves(Protocol):
    """What the watchdog asks of the job's stages (`stages.Stages`), which own it."""

    def send_again(self, steps: list[tuple[str, int]]) -> None: ...

    def retry(self, step_id: str, attempt: int, at: datetime | None) -> None: ...

    async def advance(self, *, dispatch_failures_fail: bool = True) -> int: ...


class Watchdog:
    """Reads back a running job's old starts: counts lost reports, restarts lost runs."""

    def __init__(self, core: ActivationCore, stages: Moves, outcomes: Outcomes) -> None:
        self.core = core
        self.stages = stages
        self.outcomes = outcomes
        self.started = False
        self.restarted = 0
        self.recovered_reports = 0

    def start(self) -> None:
        """Begin watching (once per activation); it ends with the activation or the job."""
        self.started = True
        self.core.spawn(self._watch())

    async def _watch(self) -> None:
        core = self.core
        record = core.record
        interval = core.ctx.options.job_watchdog_interval.total_seconds()
        while True:
            await core.ctx.clock.sleep(interval)
            if record.released or record.state.status.is_terminal:
                return
            try:
                await self.check()
            except Released:
                return
            except Exception:
                core.log.exception("job %s: the watchdog's check failed", core.id)

    def _quiet(self) -> timedelta:
        options = self.core.ctx.options
        lease = options.step_lease_timeout
        return lease if lease > timedelta(0) else options.job_watchdog_interval * 2

    async def check(self) -> int:
        """One look at the old starts; returns how many steps were counted or sent again."""
        core = self.core
        record = core.record
        ledger = core.ledger
        now = core.ctx.clock.now()
        quiet = self._quiet()
        async with core.turn:
            if record.released or record.state.status != JobStatus.RUNNING:
                return 0
            generation = record.state.execution_generation
            asked = ledger.started_before(now - quiet)
        if not asked:
            return 0
        old = list(asked)
        # Asked before storage is read: a run that stores its outcome meanwhile is then read
        # as stored, never taken for lost.
        unheld = await self._unheld(asked)
        steps: list[JobStepState] = []
        for offset in range(0, len(old), PREPARE_BATCH):
            steps.extend(
                await core.ctx.storage.steps.get_many(core.id, old[offset : offset + PREPARE_BATCH])
            )
        leases = core.ctx.options.step_lease_timeout > timedelta(0)
        hosts = await self._active_hosts() if leases else None
        async with core.turn:
            if record.released or record.state.status != JobStatus.RUNNING:
                return 0
            heard: list[StepReport] = []
            restart: list[tuple[str, int]] = []
            for step in steps:
                tracked = ledger.entry(step.id)
                if tracked is None or tracked.generation != generation:
                    continue  # counted or sent again meanwhile
                outcome = stored_outcome(step)
                if outcome is not None:
                    heard.append(outcome)
                elif step.id in unheld and asked[step.id] == (tracked.host, tracked.attempt):
                    restart.append((step.id, tracked.attempt))  # back to the host that answered
                    ledger.forget(step.id)
                    ledger.pin({step.id: tracked.host})
                elif leases and self._lost(step, tracked.since or now, hosts, now):
                    restart.append((step.id, tracked.attempt))
                    ledger.forget(step.id)
                    if hosts is None or tracked.host in hosts:
                        ledger.pin({step.id: tracked.host})
            if not heard and not restart:
                return 0
            if heard:
                core.log.warning(
                    "job %s: %d outcome(s) stored but never reported; counted from storage",
                    core.id,
                    len(heard),
                )
            if restart:
                core.log.warning(
                    "job %s: %d step(s) whose runs are lost are sent again", core.id, len(restart)
                )
            for report in heard:
                retry = await self.outcomes.handle(report)
                if retry is not None:
                    self.stages.retry(report.step_id, report.attempt + 1, retry.at)
            self.stages.send_again(restart)
            self.recovered_reports += len(heard)
            self.restarted += len(restart)
            await self.stages.advance(dispatch_failures_fail=False)
            await record.save_progress()
            return len(heard) + len(restart)

    async def _unheld(self, asked: dict[str, tuple[str, int]]) -> set[str]:
        """Which of the old starts their worker host holds no run of (it answered so)."""
        by_host: dict[str, list[str]] = {}
        for step_id, (host, _) in asked.items():
            if host:
                by_host.setdefault(host, []).append(step_id)
        if not by_host:
            return set()
        core = self.core
        try:
            return set(await core.ctx.dispatcher.unheld(core.ctx.key, core.id, by_host))
        except Exception as error:  # no answer proves nothing: nothing is sent again
            core.log.warning(
                "job %s: the watchdog could not ask the worker hosts: %s", core.id, error
            )
            return set()

    def _lost(
        self, step: JobStepState, since: datetime, hosts: frozenset[str] | None, now: datetime
    ) -> bool:
        """Whether a step's run is lost: its lease's host left the cluster and the lease
        expired, or, without a lease, one lease period passed since its last change. Without
        a membership reader (`hosts` None) every host counts as alive."""
        timeout = self.core.ctx.options.step_lease_timeout
        lease = step.lease
        if step.status == JobStepStatus.RUNNING and lease is not None:
            gone = hosts is not None and lease.host not in hosts
            return gone and lease.heartbeat + timeout <= now
        changed = step.status_changes[-1].occurred if step.status_changes else since
        return changed + timeout <= now

    async def _active_hosts(self) -> frozenset[str] | None:
        reader = self.core.ctx.active_hosts
        if reader is None:
            return None
        return frozenset(await maybe_await(self.core.job.get_active_hosts(await reader())))
