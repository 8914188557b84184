"""What one host asks of another, typed per role (`runtime/host_calls.py`), without Ray: each
typed call is the actor method of the same name with the same parameters and answer (an older
host receives the calls it always did), mypy refuses a call that gets a message wrong, and no
actor method is chosen at run time from a string."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path
from typing import Any

import pytest

from choreography_ray.runtime import host_calls
from choreography_ray.runtime.controller_host import ControllerHost
from choreography_ray.runtime.host_calls import ControllerHostCalls, HostCalls, WorkerHostCalls
from choreography_ray.runtime.worker_host import WorkerHost

from ..typecheck import mypy_errors
from .host_stubs import TableStub

RUNTIME = Path(host_calls.__file__).parent

NOT_AN_ACTOR_METHOD = {"ask"}
"""`ControllerHostCalls.ask` sends a client's request (`wire.send`: `perform`, or the previous
release's call), tested in `test_operations.py`."""

ROLES = [(WorkerHostCalls, WorkerHost), (ControllerHostCalls, ControllerHost)]
MESSAGES = [
    (calls, actor, name)
    for calls, actor in ROLES
    for name, _ in inspect.getmembers(calls, inspect.iscoroutinefunction)
    if not name.startswith("_") and name not in NOT_AN_ACTOR_METHOD
]


def test_every_message_of_each_role_is_listed():
    names = {(calls.__name__, name) for calls, _, name in MESSAGES}
    assert ("WorkerHostCalls", "stop_steps") in names and ("HostCalls", "ping") not in names
    assert ("WorkerHostCalls", "ping") in names and ("ControllerHostCalls", "ping") in names
    assert len(names) == 15  # 10 messages to worker hosts, 3 to controller hosts, ping to both


@pytest.mark.parametrize(("calls", "actor", "name"), MESSAGES)
def test_a_typed_call_is_the_actor_method_of_its_name_with_its_parameters_and_answer(
    calls: type[HostCalls], actor: type, name: str
):
    """The actor method keeps its name and parameters (the wire of a rolling upgrade), and the
    typed call declares exactly what the host takes and answers."""
    assert hasattr(actor, name), f"{actor.__name__} has no actor method {name}"
    called, answering = getattr(calls, name), getattr(actor, name)
    assert _parameters(called) == _parameters(answering)
    assert _hints(called) == _hints(answering)


class Recorded(TableStub):
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, tuple[Any, ...]]] = []

    async def answer(self, name: str, method: str, args: tuple[Any, ...]) -> Any:
        self.sent.append((name, method, args))
        return None


@pytest.mark.parametrize(("calls", "actor", "name"), MESSAGES)
def test_a_typed_call_sends_its_actor_method_its_arguments_in_order(
    run, calls: type[HostCalls], actor: type, name: str
):
    table = Recorded()
    arguments = tuple(object() for _ in _parameters(getattr(calls, name)))
    run(getattr(calls(table, "host-1"), name)(*arguments))
    assert table.sent == [("host-1", name, arguments)]


def _hints(method: Any) -> dict[str, str]:
    """The method's resolved type hints, each by its qualified name: compared by identity,
    a class imported again by an earlier test (a module reloaded) would differ from itself."""
    hints = typing.get_type_hints(method).items()
    return {name: repr(hint) for name, hint in hints if name != "_ray_trace_ctx"}


def _parameters(method: Any) -> list[tuple[str, Any]]:
    """The method's parameters as a caller passes them. Ray adds a keyword-only
    `_ray_trace_ctx` to an actor class's methods, in place, once the class is made an actor in
    the process (an earlier test's): it is Ray's, not the message's."""
    return [
        (p.name, p.kind)
        for p in inspect.signature(method).parameters.values()
        if p.name not in ("self", "_ray_trace_ctx")
    ]


CHECKED = """
from choreography_ray.engine.messages import StopRequest
from choreography_ray.jobs.state import JobKey
from choreography_ray.runtime.routes import Routes


async def calls(routes: Routes) -> None:
    held: list[str] = await routes.worker("w").held_steps(JobKey(), "j")
    epoch: int = await routes.controller("c").ping()
    await routes.worker("w").stop_steps(StopRequest(JobKey(), "j", 1))
    await routes.worker("w").stop_steps("j")
    count: int = await routes.worker("w").held_steps(JobKey(), "j")
    await routes.controller("c").stop_steps(StopRequest(JobKey(), "j", 1))
    await routes.call("w", "stop_steps")
"""


def test_mypy_refuses_a_wrong_message_argument_answer_or_role_and_a_call_by_name(tmp_path):
    """The right calls pass; a wrong argument, an answer read as another type, a worker's
    message sent to a controller host, and a call by method name (`Routes.call` is gone)
    are errors."""
    errors = mypy_errors(CHECKED, tmp_path)
    assert set(errors) == {11, 12, 13, 14}, errors
    assert 'Argument 1 to "stop_steps" of "WorkerHostCalls" has incompatible type' in errors[11]
    assert 'expression has type "list[str]", variable has type "int"' in errors[12]
    assert '"ControllerHostCalls" has no attribute "stop_steps"' in errors[13]
    assert '"Routes" has no attribute "call"' in errors[14]


def test_no_actor_method_is_chosen_by_a_string_in_the_runtime():
    """`getattr(handle, method).remote(...)` — a message dispatched by a name held in a
    string, which nothing type-checks — appears nowhere in the runtime."""
    found = []
    for path in sorted(RUNTIME.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if _remote_by_name(node):
                found.append(f"{path.name}:{node.lineno}")  # type: ignore[attr-defined]
    assert found == []


def _remote_by_name(node: ast.AST) -> bool:
    """`getattr(x, <not a literal>).remote(...)`."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    receiver = node.func.value
    return (
        node.func.attr == "remote"
        and isinstance(receiver, ast.Call)
        and isinstance(receiver.func, ast.Name)
        and receiver.func.id == "getattr"
        and len(receiver.args) >= 2
        and not isinstance(receiver.args[1], ast.Constant)
    )
