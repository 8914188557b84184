"""A job's adaptive window (`jobs.adaptive.AdaptiveConcurrency`), kept by its activation.

The window is the job's `max_active_steps` while its steps' class adapts it: the job starts at
the policy's limit; an outcome that says the service throttles (a throttled failure, or one
slower than the policy's latency, from dispatch to outcome) halves it, at most once for the
steps dispatched before the last halving (they were sent under the larger window); each
window's worth of successes grows it by one; it stays between the floor and the limit. It is
stored with the job's progress (`JobState.adaptive_window`), so `jobs show` reads it live and
a new activation goes on from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from ..jobs.adaptive import AdaptiveConcurrency
from ..jobs.errors import ChoreographyError
from ..jobs.registry import TypeKind
from ..jobs.state import WindowState
from ..jobs.status import JobStepStatus
from .activation import ActivationCore
from .messages import StepReport


class AdaptiveWindow:
    """The AIMD window of one job's activation."""

    def __init__(self, policy: AdaptiveConcurrency, stored: WindowState | None) -> None:
        self.policy = policy
        self.window = policy.limit if stored is None else min(stored.window, policy.limit)
        self.throttled = 0 if stored is None else stored.throttled
        self._successes = 0
        self._halved: datetime | None = None

    def observe(self, report: StepReport, since: datetime | None, now: datetime) -> None:
        """Learn from one outcome of a step dispatched at `since`."""
        policy = self.policy
        status = report.status
        slow = (
            policy.latency is not None
            and since is not None
            and (now - since).total_seconds() > policy.latency
        )
        failed = status in (JobStepStatus.COMPLETED_WITH_FAILURE, JobStepStatus.FAILED)
        if slow or (failed and policy.throttles(report.error)):
            self.throttled += 1
            if self._halved is None or (since is not None and since >= self._halved):
                self.window = max(policy.floor, self.window // 2)
                self._halved = now
                self._successes = 0
        elif status == JobStepStatus.COMPLETED_SUCCESSFULLY:
            self._successes += 1
            if self._successes >= self.window:
                self._successes = 0
                self.window = min(policy.limit, self.window + 1)

    def state(self) -> WindowState:
        return WindowState(window=self.window, limit=self.policy.limit, throttled=self.throttled)


def adaptive_window(core: ActivationCore) -> AdaptiveWindow | None:
    """The job's adaptive window when its steps' class adapts it (its first step's type), else
    None; a type this host cannot resolve adapts nothing."""
    step_type = core.ledger.types.default
    if not step_type:
        return None
    try:
        step_class = core.ctx.registry.resolve(step_type, TypeKind.STEP)
    except ChoreographyError:
        return None
    policy = getattr(step_class, "adaptive", None)
    if not isinstance(policy, AdaptiveConcurrency):
        return None
    return AdaptiveWindow(policy, core.record.state.adaptive_window)


def observe(core: ActivationCore, window: AdaptiveWindow, reports: Sequence[StepReport]) -> None:
    """Learn from a batch of outcomes (before they are counted: the ledger still knows when
    each was dispatched), then apply the window to the job."""
    now = core.ctx.clock.now()
    ledger = core.ledger
    for report in reports:
        tracked = ledger.entry(report.step_id)
        if tracked is not None:  # a live run's outcome, not one told again
            window.observe(report, tracked.since, now)
    core.window = window.window
    core.record.state.adaptive_window = window.state()
