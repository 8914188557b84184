"""Jobs and steps the engine scenarios drive, and a script that tells each step what to do.

A step's behaviour comes from `Script`, keyed by the step's `key`: succeed at once (the default),
fail, raise, block until released, or hang until cancelled. Tests hold the script, so they decide
when each step ends.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from choreography_ray.jobs.concurrency import ConcurrencyKey
from choreography_ray.jobs.job import Job, JobStageFailureBehavior, JobStepDispatchContext
from choreography_ray.jobs.step import JobStep, StepContext, StepFailed
from choreography_ray.storage.protocols import JobsStorage


class ScenarioRequest(BaseModel):
    """One step per key, in the given stage; `stages` maps key -> stage."""

    keys: list[str] = Field(default_factory=list)
    stages: dict[str, int] = Field(default_factory=dict)
    names: dict[str, str] = Field(default_factory=dict)


class KeyRequest(BaseModel):
    key: str


class KeyState(BaseModel):
    key: str
    progress: int = 0


class KeyResult(BaseModel):
    key: str
    value: int = 0


@dataclass
class Behaviour:
    fail: bool = False
    fail_times: int = 0
    """Fail this many attempts, then succeed."""
    raise_error: bool = False
    non_retryable: bool = False
    block: bool = False
    """Wait for `Script.release(key)`; stopping cancels the wait."""
    checkpoints: int = 0
    prepare_error: bool = False


class Script:
    """What each step does, and what happened: runs per key, hook calls in order."""

    def __init__(self) -> None:
        self.behaviour: dict[str, Behaviour] = defaultdict(Behaviour)
        self.gates: dict[str, asyncio.Event] = {}
        self.runs: list[tuple[str, int]] = []
        self.hooks: list[str] = []
        self.outcomes: list[Any] = []
        self.dispatch_contexts: list[JobStepDispatchContext] = []
        self.fail_hooks: set[str] = set()
        self.continue_stages: set[int] = set()
        self.retry: bool = True
        self.plan_override: Any = None

    def gate(self, key: str) -> asyncio.Event:
        if key not in self.gates:
            self.gates[key] = asyncio.Event()
        return self.gates[key]

    def release(self, *keys: str) -> None:
        for key in keys:
            self.gate(key).set()

    def ran(self, key: str) -> int:
        return sum(1 for k, _ in self.runs if k == key)


SCRIPT = Script()
"""Replaced per test by the `script` fixture."""


class KeyStep(JobStep[KeyRequest, KeyState, KeyResult], name="scenario.key-step"):
    async def perform(self, state: KeyState, ctx: StepContext) -> KeyResult:
        script = SCRIPT
        behaviour = script.behaviour[state.key]
        script.runs.append((state.key, ctx.attempt))
        for n in range(behaviour.checkpoints):
            state.progress = n + 1
            ctx.checkpoint(state)
        if behaviour.block:
            await script.gate(state.key).wait()
        if behaviour.raise_error:
            raise RuntimeError(f"step {state.key} broke")
        if behaviour.fail or ctx.attempt <= behaviour.fail_times:
            raise StepFailed(f"step {state.key} failed", non_retryable=behaviour.non_retryable)
        return KeyResult(key=state.key, value=len(state.key))

    def initialize_state(self, request: KeyRequest) -> KeyState:
        if SCRIPT.behaviour[request.key].prepare_error:
            raise ValueError(f"cannot prepare {request.key}")
        return KeyState(key=request.key)

    def create_cancelled_result_from_current_state(self, state: KeyState) -> KeyResult:
        return KeyResult(key=state.key, value=-state.progress)


class SyncKeyStep(JobStep[KeyRequest, KeyState, int], name="scenario.sync-key-step"):
    def initialize_state(self, request: KeyRequest) -> KeyState:
        return KeyState(key=request.key)

    def perform(self, state: KeyState, ctx: StepContext) -> int:
        SCRIPT.runs.append((state.key, ctx.attempt))
        if SCRIPT.behaviour[state.key].fail:
            raise StepFailed("sync failure")
        return len(state.key)


class _Recording:
    """Hook recording shared by the scenario jobs."""

    script_hooks: ClassVar[bool] = True

    def _record(self, name: str) -> None:
        SCRIPT.hooks.append(name)
        if name in SCRIPT.fail_hooks:
            raise RuntimeError(f"{name} failed on purpose")

    def on_before_starting_job_steps(self) -> None:
        self._record("on_before_starting_job_steps")

    def on_before_resuming_job_steps(self) -> None:
        self._record("on_before_resuming_job_steps")

    async def on_before_dispatching_job_steps(self, context: JobStepDispatchContext) -> None:
        SCRIPT.dispatch_contexts.append(context)
        self._record("on_before_dispatching_job_steps")

    def on_step_completed_or_stopped(self, outcome: Any) -> None:
        SCRIPT.outcomes.append(outcome)
        self._record("on_step_completed_or_stopped")

    async def on_all_steps_completed(self) -> None:
        self._record("on_all_steps_completed")

    def on_failed_to_prepare(self) -> None:
        self._record("on_failed_to_prepare")

    def on_stopped(self) -> None:
        self._record("on_stopped")

    def failure_behavior_for(self, stage: int) -> JobStageFailureBehavior:
        if stage in SCRIPT.continue_stages:
            return JobStageFailureBehavior.CONTINUE_WITH_NEXT_STAGE
        return JobStageFailureBehavior.STOP_JOB

    def should_retry_step(self, step: Any, error: Any) -> bool:
        return SCRIPT.retry


class ScenarioJob(_Recording, Job[ScenarioRequest], name="scenario.job"):
    """Keeps its state after completing, so tests can read the outcome."""

    keep_after_completed = True

    def prepare_steps(self, request: ScenarioRequest) -> list[Any]:
        if SCRIPT.plan_override is not None:
            return SCRIPT.plan_override(self, request)
        return [
            self.create_step(
                KeyStep,
                KeyRequest(key=key),
                stage=request.stages.get(key, 0),
                name=request.names.get(key, key),
            )
            for key in request.keys
        ]


class ClearingJob(ScenarioJob, name="scenario.clearing-job"):
    keep_after_completed = False
    keep_after_completed_with_failures = False


class BackgroundJob(ScenarioJob, name="scenario.background-job"):
    start_steps_in_background = True


class RetryingJob(ScenarioJob, name="scenario.retrying-job"):
    max_step_attempts = 3


class WindowJob(ScenarioJob, name="scenario.window-job"):
    max_active_steps = 2


class TenantRequest(BaseModel):
    tenant: str
    keys: list[str] = Field(default_factory=list)


class TenantJob(_Recording, Job[TenantRequest], name="scenario.tenant-job"):
    keep_after_completed = True
    concurrency = ConcurrencyKey("tenant", max_running=2)

    def prepare_steps(self, request: TenantRequest) -> list[Any]:
        return [self.create_step(KeyStep, KeyRequest(key=key), name=key) for key in request.keys]


def tenant(name: str, *keys: str) -> TenantRequest:
    return TenantRequest(tenant=name, keys=list(keys))


def request(*keys: str, stages: dict[str, int] | None = None) -> ScenarioRequest:
    return ScenarioRequest(keys=list(keys), stages=stages or {})


def wrap_steps(make: Callable[[Any], Any]) -> Callable[[JobsStorage], JobsStorage]:
    """An `InProcessCluster(wrap_storage=...)` that wraps the step storage only, in `make`."""

    def wrap(storage: JobsStorage) -> JobsStorage:
        return JobsStorage(
            key=storage.key, jobs=storage.jobs, steps=make(storage.steps), plans=storage.plans
        )

    return wrap


class HeldSteps:
    """Step storage whose batch writes wait for `go` while `holds(batch)` says so (`waiting`
    once one does): a test lands another write, or a close, in between."""

    def __init__(self, inner: Any, holds: Callable[[list[Any]], bool]) -> None:
        self._inner = inner
        self.holds = holds
        self.go = asyncio.Event()
        self.waiting = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def save_many(self, states: list[Any]) -> Any:
        if self.holds(states):
            self.waiting = True
            await self.go.wait()
        return await self._inner.save_many(states)


def held_steps(
    holds: Callable[[list[Any]], bool],
) -> tuple[list[HeldSteps], Callable[[JobsStorage], JobsStorage]]:
    """An `InProcessCluster(wrap_storage=...)` whose step storages are `HeldSteps`, and the
    list they are added to as the cluster opens them."""
    made: list[HeldSteps] = []

    def make(steps: Any) -> HeldSteps:
        made.append(HeldSteps(steps, holds))
        return made[-1]

    return made, wrap_steps(make)
