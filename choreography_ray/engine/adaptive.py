"""A job's adaptive windows (`jobs.adaptive.AdaptiveConcurrency`), kept by its activation.

Each adaptive step class of a job has its own window, which limits that class's active steps
only: a throttled partner API does not shrink the job's other steps, which keep the job's
fixed window (`max_active_steps`). A job whose steps are all of one adaptive class has no
fixed window beside it. A window starts at the policy's limit; an outcome that says the
service throttles (a throttled failure, or one slower than the policy's latency, from
dispatch to outcome) halves it, at most once for the steps dispatched before the last
halving (they were sent under the larger window); each window's worth of successes grows it
by one; it stays between the floor and the limit. It is stored with the job's progress
(`JobState.adaptive_windows`, by step type), so `jobs show` reads it live and a new
activation goes on from it; a record of an earlier version, with its one window
(`adaptive_window`), goes on as its first adaptive step type's window, and that window is
still written there for hosts of earlier versions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from ..jobs.adaptive import AdaptiveConcurrency
from ..jobs.errors import ChoreographyError
from ..jobs.registry import TypeKind
from ..jobs.state import WindowState
from ..jobs.status import JobStepStatus
from .activation import ActivationCore
from .messages import StepReport
from .step_types import StepTypes


class AdaptiveWindow:
    """The AIMD window of one step class in one job's activation."""

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


class ClassWindows:
    """A job's adaptive windows by step type, and the room each class has left in a dispatch.

    With steps of one type only, the window is the job's (`gated` is False: the activation
    sets its window). With several types, `room` reckons what each class may still start and
    `admits` takes a step's place in its class's share; a class with no window of its own
    shares the job's `fixed` window (None: unlimited)."""

    def __init__(self, windows: dict[str, AdaptiveWindow], fixed: int | None, gated: bool) -> None:
        self.windows = windows
        self.fixed = fixed
        self.gated = gated
        self._free: dict[str, int | None] = {}
        """Per adaptive type, and "" for the others: the starts a dispatch may still make."""

    def room(self, types: StepTypes, active: Iterable[str]) -> int | None:
        """Reckon each class's room from the job's active steps (started or waiting out a
        retry); returns the room of all classes together (None: unlimited)."""
        used = dict.fromkeys(self.windows, 0)
        others = 0
        for step_id in active:
            step_type = types.of(step_id)
            if step_type in used:
                used[step_type] += 1
            else:
                others += 1
        free: dict[str, int | None] = {
            name: max(0, window.window - used[name]) for name, window in self.windows.items()
        }
        free[""] = None if self.fixed is None else max(0, self.fixed - others)
        self._free = free
        if free[""] is None:
            return None
        return sum(n or 0 for n in free.values())

    def admits(self, step_type: str) -> bool:
        """Whether a step of `step_type` may start in this dispatch; takes its place."""
        name = step_type if step_type in self.windows else ""
        left = self._free.get(name, 0)
        if left is None:
            return True
        if left <= 0:
            return False
        self._free[name] = left - 1
        return True

    def state(self) -> dict[str, WindowState]:
        return {name: window.state() for name, window in self.windows.items()}


def adaptive_windows(core: ActivationCore) -> ClassWindows | None:
    """The job's adaptive windows, one per step type whose class adapts it; None when none
    does (a type this host cannot resolve adapts nothing)."""
    types = core.ledger.types
    state = core.record.state
    windows: dict[str, AdaptiveWindow] = {}
    for step_type in types.names():
        try:
            step_class = core.ctx.registry.resolve(step_type, TypeKind.STEP)
        except ChoreographyError:
            continue
        policy = getattr(step_class, "adaptive", None)
        if not isinstance(policy, AdaptiveConcurrency):
            continue
        stored = state.adaptive_windows.get(step_type)
        if stored is None and not state.adaptive_windows and not windows:
            # A record of an earlier version: its one window was its first adaptive type's
            # (the first type, when it adapted; steps read back may come in another order).
            stored = state.adaptive_window
        windows[step_type] = AdaptiveWindow(policy, stored)
    if not windows:
        return None
    return ClassWindows(windows, core.window, gated=types.single is None)


def observe(core: ActivationCore, windows: ClassWindows, reports: Sequence[StepReport]) -> None:
    """Learn from a batch of outcomes (before they are counted: the ledger still knows when
    each was dispatched), then apply the windows to the job."""
    now = core.ctx.clock.now()
    ledger = core.ledger
    types = ledger.types
    by_type = windows.windows
    for report in reports:
        window = by_type.get(types.of(report.step_id))
        tracked = ledger.entry(report.step_id)
        if window is not None and tracked is not None:  # a live run's, not one told again
            window.observe(report, tracked.since, now)
    apply(core, windows)


def apply(core: ActivationCore, windows: ClassWindows) -> None:
    """Set the job's window (one class only) and store the windows with its progress."""
    state = core.record.state
    if not windows.gated:
        core.window = next(iter(windows.windows.values())).window
    state.adaptive_windows = windows.state()
    state.adaptive_window = next(iter(state.adaptive_windows.values()))  # for earlier versions
