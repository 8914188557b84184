"""The client's typed requests, without Ray: each verb is one request performed by its type, a
controller host refuses anything else, a job owned elsewhere is asked of its owner with the same
request, and the previous release's calls map onto the same requests both ways."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from choreography_ray.engine.job import JobStartResult
from choreography_ray.jobs import InvalidOperationError, OwnedElsewhereError
from choreography_ray.jobs.errors import DrainJobResult, DrainOutcome, ResumeJobSuccess
from choreography_ray.jobs.mapping import MapItems
from choreography_ray.jobs.registry import Payload
from choreography_ray.jobs.state import JobKey
from choreography_ray.runtime.controller_host import ControllerHost
from choreography_ray.runtime.operations import (
    CountSteps,
    Deliver,
    Drain,
    Get,
    ListJobs,
    Operation,
    ReadResults,
    Rehydrate,
    Remove,
    Resume,
    Start,
    Stop,
    Wait,
)
from choreography_ray.runtime.previous_release import PreviousReleaseCalls, send_previous
from choreography_ray.runtime.wire import send
from choreography_ray.storage import JobQuery, StepQuery

from ..typecheck import mypy_errors

KEY = JobKey(scope="s", namespace="n")
REPORT = ("step-1", 3, 0, 1, 0, "a step", None, None, False)

PREVIOUS_RELEASE_OPERATIONS: list[Operation[Any]] = [
    Start(KEY, "a-job", {"type": "a-request", "value": {}}, "j"),
    Get(KEY, "j"),
    CountSteps(KEY, "j"),
    ListJobs(KEY, JobQuery(take=3)),
    Wait(KEY, "j", 2.5),
    Stop(KEY, "j"),
    Drain(KEY, "j", 4.0),
    Resume(KEY, "j"),
    Remove(KEY, "j"),
    Rehydrate(KEY, 9.0),
    Deliver(KEY, "j", [REPORT]),
]
"""Every request the previous release has a call for."""
NEW_OPERATIONS: list[Operation[Any]] = [ReadResults(KEY, "j", StepQuery(stage=1, take=5))]
"""Requests new in this release: a host of the previous release is never sent them."""
EVERY_OPERATION = [*PREVIOUS_RELEASE_OPERATIONS, *NEW_OPERATIONS]


def test_every_verb_is_listed_here():
    assert {type(op) for op in EVERY_OPERATION} == set(Operation.__subclasses__())


# -- a controller host performs requests, and nothing else ---------------------------------------


class FakeManager:
    """The jobs manager's operations, recorded; a job in `elsewhere` is owned by another host."""

    def __init__(self, elsewhere: str | None = None) -> None:
        self.elsewhere = elsewhere
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def _owned(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        if self.elsewhere is not None:
            raise OwnedElsewhereError(args[0], self.elsewhere, 1)

    async def stop(self, job_id: str) -> None:
        self._owned("stop", job_id)

    async def drain(self, job_id: str, within: float) -> DrainOutcome:
        self._owned("drain", job_id, within)
        return DrainOutcome(DrainJobResult.DRAINED)

    async def resume(self, job_id: str) -> ResumeJobSuccess:
        self._owned("resume", job_id)
        return ResumeJobSuccess.SUCCESS


class FakeHost:
    """What `ControllerHost.perform` uses of its host: a manager per partition, the host to
    ask when the job lives elsewhere."""

    def __init__(self, manager: FakeManager) -> None:
        self._manager = manager
        self.asked: list[tuple[str, Operation[Any]]] = []
        self.metrics: Any = None

    async def ready(self) -> int:
        return 1

    def manager(self, key: JobKey) -> FakeManager:
        assert key == KEY
        return self._manager

    def successor(self) -> str | None:
        return None

    async def ask(self, host: str, operation: Operation[Any]) -> Any:
        self.asked.append((host, operation))
        return "the owner's answer"


@pytest.mark.parametrize(
    "wrong",
    ["stop", ("stop", KEY, "j"), {"operation": "stop"}, None],
    ids=["a method name", "a call of the previous release", "a dict", "nothing"],
)
def test_a_controller_host_refuses_what_is_not_a_request_with_a_clear_error(wrong):
    host = FakeHost(FakeManager())
    with pytest.raises(InvalidOperationError, match=r"performs the client's operations") as no:
        asyncio.run(ControllerHost.perform(host, wrong))  # type: ignore[arg-type]
    assert type(wrong).__qualname__ in str(no.value)
    assert "\n" not in str(no.value)
    assert host._manager.calls == []


def test_a_request_runs_the_managers_operation_it_names():
    manager = FakeManager()
    host = FakeHost(manager)
    assert asyncio.run(ControllerHost.perform(host, Stop(KEY, "j"))) is None  # type: ignore[arg-type]
    drained = asyncio.run(ControllerHost.perform(host, Drain(KEY, "j", 4.0)))  # type: ignore[arg-type]
    resumed = asyncio.run(ControllerHost.perform(host, Resume(KEY, "j")))  # type: ignore[arg-type]
    assert manager.calls == [("stop", ("j",)), ("drain", ("j", 4.0)), ("resume", ("j",))]
    assert drained.result == DrainJobResult.DRAINED
    assert resumed == ResumeJobSuccess.SUCCESS
    assert host.asked == []


def test_a_job_owned_elsewhere_is_asked_of_its_owner_with_the_same_request():
    host = FakeHost(FakeManager(elsewhere="choreography:controller:other"))
    request = Drain(KEY, "j", 4.0)
    answer = asyncio.run(ControllerHost.perform(host, request))  # type: ignore[arg-type]
    assert answer == "the owner's answer"
    assert host.asked == [("choreography:controller:other", request)]
    assert host.asked[0][1] is request


def test_a_request_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Stop(KEY, "j").job_id = "other"  # type: ignore[misc]


# -- the wire: this release's hosts get the request, the previous release's their own calls ------


class Recorder:
    """An actor handle's methods, as `.remote` calls recorded by name."""

    def __init__(self, methods: set[str]) -> None:
        self.methods = methods
        self.sent: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        if name not in self.__dict__.get("methods", set()):
            raise AttributeError(name)  # as a Ray handle does for a method its actor lacks
        recorder = self

        class Method:
            def remote(self, *args: Any) -> str:
                recorder.sent.append((name, args))
                return f"ref of {name}"

        return Method()


PREVIOUS_METHODS = {
    "start",
    "get",
    "step_counts",
    "list",
    "wait",
    "stop",
    "drain",
    "resume",
    "remove",
    "rehydrate",
    "deliver",
}


@pytest.mark.parametrize("operation", EVERY_OPERATION, ids=lambda op: type(op).__name__)
def test_a_host_of_this_release_is_sent_the_request_itself(operation):
    handle = Recorder({"perform", *PREVIOUS_METHODS})
    assert send(handle, operation) == "ref of perform"
    assert handle.sent == [("perform", (operation,))]


class PreviousHost(PreviousReleaseCalls):
    """A host of this release, answering the previous release's calls: the request each call
    stands for is what it performs."""

    def __init__(self) -> None:
        self.performed: list[Operation[Any]] = []

    async def perform(self, operation: Operation[Any]) -> Any:
        self.performed.append(operation)

    async def deliver(self, key: JobKey, job_id: str, packed: list[Any]) -> None:
        await ControllerHost.deliver(self, key, job_id, packed)  # type: ignore[arg-type]


@pytest.mark.parametrize("operation", PREVIOUS_RELEASE_OPERATIONS, ids=lambda op: type(op).__name__)
def test_the_previous_releases_call_round_trips_to_the_same_request(operation):
    """A caller of this release speaks the previous release's call to an older host; a host of
    this release turns that call back into the very request: both sides agree on every
    argument's place."""
    older = Recorder(PREVIOUS_METHODS)
    assert send(older, operation).startswith("ref of ")
    [(method, args)] = older.sent
    host = PreviousHost()
    asyncio.run(getattr(host, method)(*args))
    assert host.performed == [operation]


def test_a_request_the_previous_release_lacks_is_refused_by_name():
    @dataclasses.dataclass(frozen=True)
    class Newer(Operation[None]):
        what = "jobs.newer"

        async def run(self, host: Any) -> None:
            return None

    with pytest.raises(InvalidOperationError, match="Newer is new in this release"):
        send_previous(Newer(KEY), Recorder(PREVIOUS_METHODS))


@pytest.mark.parametrize("operation", NEW_OPERATIONS, ids=lambda op: type(op).__name__)
def test_a_request_new_in_this_release_is_not_sent_to_a_host_of_the_previous_one(operation):
    with pytest.raises(InvalidOperationError, match="is new in this release"):
        send_previous(operation, Recorder(PREVIOUS_METHODS))


def test_a_map_start_is_not_sent_to_a_host_of_the_previous_release():
    """That release would start the map job without its items (and has no map jobs)."""
    mapped = Start(KEY, "choreography.map", Payload(type="t", data={}), "j", MapItems(step="s"))
    with pytest.raises(InvalidOperationError, match=r"jobs\.map is new in this release"):
        send_previous(mapped, Recorder(PREVIOUS_METHODS))


def test_a_start_answers_the_managers_result_typed():
    """Start resolves the type names through the manager's registry (a unit check of the one
    request that does more than call the manager)."""

    class Registry:
        def resolve(self, name: str, kind: Any) -> str:
            return f"class {name}"

        def load(self, payload: Any, kind: Any) -> str:
            return "typed request"

    class Metrics:
        def __init__(self) -> None:
            self.started: list[tuple[str, bool]] = []

        def job_started(self, job_type: str, succeeded: bool) -> None:
            self.started.append((job_type, succeeded))

    class Manager:
        ctx = type("Ctx", (), {"registry": Registry()})()

        async def start(
            self, job_class: Any, request: Any, *, job_id: str, steps: Any, max_active_steps: Any
        ) -> JobStartResult:
            assert (job_class, request) == ("class a-job", "typed request")
            assert (steps, max_active_steps) == (None, None)  # a job that plans its own steps
            return JobStartResult(job_id=job_id)

    class Host:
        metrics = Metrics()

        def manager(self, key: JobKey) -> Manager:
            return Manager()

        def successor(self) -> str | None:
            return None

    start = Start(KEY, "a-job", {"type": "a-request", "value": {}}, "j")
    result = asyncio.run(start.run(Host()))  # type: ignore[arg-type]
    assert result == JobStartResult(job_id="j")
    assert Host.metrics.started == [("a-job", True)]


# -- mypy checks the chain -----------------------------------------------------------------------

CHECKED = """
from choreography_ray.jobs.state import JobKey, JobState
from choreography_ray.runtime.async_client import AsyncJobs
from choreography_ray.runtime.controller_host import ControllerHost
from choreography_ray.runtime.operations import Drain, Get


async def calls(jobs: AsyncJobs, host: ControllerHost) -> None:
    state: JobState = await jobs._ask(Get(JobKey(), "j"))
    hosted: JobState = await host.perform(Get(JobKey(), "j"))
    Drain(JobKey(), "j", "soon")
    count: int = await jobs._ask(Get(JobKey(), "j"))
    counted: int = await host.perform(Get(JobKey(), "j"))
    Get(JobKey())
"""


def test_mypy_refuses_a_wrong_argument_and_an_answer_read_as_the_wrong_type(tmp_path):
    """The project's mypy configuration over a few calls: the right ones pass, a request
    built with a wrong argument and an answer read as another type are errors."""
    errors = mypy_errors(CHECKED, tmp_path)
    assert set(errors) == {11, 12, 13, 14}, errors
    assert 'Argument 3 to "Drain" has incompatible type "str"; expected "float"' in errors[11]
    assert 'expected "Operation[int]"' in errors[12]
    assert 'expected "Operation[int]"' in errors[13]
    assert 'Missing positional argument "job_id"' in errors[14]
