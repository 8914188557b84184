"""Bad input to the client and the command line, refused before anything reaches Ray or storage.

No Ray runs here: a client whose remote calls fail the test proves that a check happened first,
and a stored SQLite file hashed before and after proves nothing was written.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, TypeVar

import pytest
from typer.testing import CliRunner

import choreography_ray as cr
from choreography_ray.cli import app
from choreography_ray.jobs import (
    ClusterAuthenticationError,
    ConfigurationError,
    HostError,
    InvalidJobIdError,
    InvalidOptionError,
    JobNotFoundError,
    JobStatus,
    StorageUnavailableError,
)
from choreography_ray.jobs.state import JobKey, JobState
from choreography_ray.runtime import connection
from choreography_ray.runtime.client import AsyncJobs, Jobs
from choreography_ray.runtime.config import ClusterConfig
from choreography_ray.runtime.operations import Get, ListJobs, Operation, Remove, Start, Wait
from choreography_ray.storage import JobQuery, open_storage

from .control_stores import TOKEN, FakeControlStore, serving
from .ray_jobs import FanOut, FanOutJob

runner = CliRunner()
T = TypeVar("T")

DEAD_POSTGRES = "postgresql+psycopg://nobody@127.0.0.1:1/none"

BAD_IDS = [
    ("", "is empty"),
    (" padded", "whitespace at its start or end"),
    ("padded\t", "whitespace at its start or end"),
    ("line\nbreak", "non-printable"),
    ("bell\x07", "non-printable"),
    ("a/b", "path separator"),
    ("..\\up", "path separator"),
    ("x" * 201, "at most 200"),
]
GOOD_IDS = ["0f8fa1d2c3b44e5f8a9b0c1d2e3f4a5b", "JIRA-1234", "order:42@eu west", "épreuve-№7"]


class OfflineClient(AsyncJobs):
    """A client whose every request to the cluster fails the test, unless an answer is set
    for its type."""

    def __init__(self, answers: dict[type[Operation[Any]], Any]) -> None:
        super().__init__("offline")
        self.answers = answers
        self.calls: list[type[Operation[Any]]] = []

    async def _ask(self, operation: Operation[T], *, job_type: str | None = None) -> T:
        kind = type(operation)
        if kind not in self.answers:
            raise AssertionError(f"{operation.what} reached the cluster")
        self.calls.append(kind)
        answer = self.answers[kind]
        return answer(operation) if callable(answer) else answer

    async def _remember(self, module: str, key: JobKey) -> None:
        if Start not in self.answers:
            raise AssertionError("start reached the cluster")


class Offline(Jobs):
    """The blocking client over an `OfflineClient`."""

    def __init__(self, answers: dict[type[Operation[Any]], Any] | None = None) -> None:
        super().__init__("offline")
        self.aio = OfflineClient(answers or {})

    @property
    def calls(self) -> list[type[Operation[Any]]]:
        return self.aio.calls


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "\x1b[" not in text and "Traceback" not in text
    return lines[0]


def _calls(jobs: Jobs, job_id: str) -> list[Any]:
    return [
        lambda: jobs.get(job_id),
        lambda: jobs.find(job_id),
        lambda: jobs.stop(job_id),
        lambda: jobs.resume(job_id),
        lambda: jobs.remove(job_id),
        lambda: jobs.wait(job_id, timeout=1),
        lambda: list(jobs.events(job_id)),
        lambda: jobs.start(FanOutJob, FanOut(steps=1), job_id=job_id),
    ]


# -- job ids -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("job_id", "reason"), BAD_IDS, ids=[repr(b[:12]) for b, _ in BAD_IDS])
def test_a_bad_job_id_is_refused_by_every_call_before_any_remote_call(job_id, reason):
    jobs = Offline()
    for call in _calls(jobs, job_id):
        with pytest.raises(InvalidJobIdError, match=reason) as refused:
            call()
        _one_line(str(refused.value))
    assert jobs.calls == []


def test_the_async_client_refuses_a_bad_job_id_too():
    with pytest.raises(InvalidJobIdError, match="is empty"):
        asyncio.run(Offline().aio.remove(""))


@pytest.mark.parametrize("job_id", GOOD_IDS)
def test_ids_from_other_systems_are_accepted(job_id):
    jobs = Offline({Get: lambda op: op.job_id, Remove: None})
    assert jobs.get(job_id) == job_id
    jobs.remove(job_id)
    assert jobs.get("x" * 200) == "x" * 200


def test_a_bad_scope_is_one_line_before_any_remote_call():
    with pytest.raises(InvalidOptionError, match="scope: must not be empty") as refused:
        Offline().get("job", scope="")
    _one_line(str(refused.value))


def test_a_negative_limit_is_refused_not_read_as_all():
    with pytest.raises(InvalidOptionError, match="limit: must be 0 \\(all\\) or more, got -1"):
        Offline().list(JobQuery(take=-1))
    assert Offline({ListJobs: []}).list(JobQuery(take=0)) == []


# -- waiting on a job that is not there ----------------------------------------------------------


def _state(job_id: str, status: JobStatus) -> JobState:
    from datetime import UTC, datetime

    return JobState(id=job_id, type="t", created=datetime.now(UTC), status=status)


def test_waiting_on_a_job_that_never_existed_is_not_found():
    jobs = Offline({Wait: None, Get: _not_found})
    with pytest.raises(JobNotFoundError, match="no job with id 'no-such-id'"):
        jobs.wait("no-such-id")
    with pytest.raises(JobNotFoundError):
        list(jobs.events("no-such-id"))


def test_a_job_this_client_started_and_that_was_cleared_waits_to_none():
    from choreography_ray.engine.job import JobStartResult

    jobs = Offline({Start: lambda op: JobStartResult(job_id=op.job_id), Wait: None})
    job_id = jobs.start(FanOutJob, FanOut(steps=1))
    assert jobs.wait(job_id) is None  # finished and cleared, not unknown
    with pytest.raises(JobNotFoundError):
        jobs.wait(job_id, scope="elsewhere")  # the same id in another partition never was


def test_a_job_cleared_while_waited_on_waits_to_none():
    answers = iter([_state("j", JobStatus.RUNNING), None])
    jobs = Offline({Wait: lambda op: next(answers)})
    assert jobs.wait("j") is None


def _not_found(operation: Get) -> Any:
    raise JobNotFoundError(operation.job_id)


# -- connect's arguments and storage -------------------------------------------------------------


@pytest.fixture
def no_cluster(monkeypatch):
    """`connect` fails the test if it gets as far as Ray."""

    def reached(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("connect reached Ray")

    monkeypatch.setattr(connection, "init_ray", reached)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"max_parallel_steps": 0}, "max_parallel_steps: must be at least 1"),
        ({"max_parallel_steps": -1}, "max_parallel_steps: must be at least 1"),
        ({"max_parallel_steps": True}, "max_parallel_steps"),
        ({"workers_per_node": 0}, "workers_per_node: must be at least 1"),
        ({"namespace": ""}, "namespace: expected a Ray namespace name"),
        ({"modules": "tests.runtime.ray_jobs"}, "modules: expected a list of module names"),
        ({"options": {"max_step_attempts": 3}}, "options: expected JobsOptions"),
        ({"runtime_env": "x"}, "runtime_env: expected a dict"),
        ({"address": ""}, "address: expected 'auto' or 'host:port'"),
        (
            {"storage": "sqlitee:///x.db"},
            "storage URL 'sqlitee:///x.db': unknown scheme 'sqlitee'; supported: memory, ",
        ),
        ({"storage": "jobs.db"}, "storage URL 'jobs.db' is not a URL"),
        ({"storage": "memory+x://"}, "storage URL 'memory+x://': unknown scheme 'memory+x'"),
    ],
)
def test_a_bad_connect_argument_is_refused_before_ray(no_cluster, arguments, message):
    with pytest.raises(ConfigurationError, match="^" + _escaped(message)) as refused:
        cr.connect(**arguments)
    _one_line(str(refused.value))


def test_an_unreachable_storage_is_refused_before_ray(no_cluster):
    with pytest.raises(StorageUnavailableError) as refused:
        cr.connect(DEAD_POSTGRES)
    line = _one_line(str(refused.value))
    assert line.startswith("cannot reach storage postgresql+psycopg://nobody@127.0.0.1:1/none: ")
    assert "Connection refused" in line


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


class FakeKV:
    """Ray's key-value store, as `runtime/config.py` uses it."""

    def __init__(self) -> None:
        self.data: dict[tuple[bytes, str], bytes] = {}

    def _internal_kv_get(self, key: bytes, namespace: str) -> bytes | None:
        return self.data.get((key, namespace))

    def _internal_kv_put(self, key: bytes, value: bytes, overwrite: bool, namespace: str) -> None:
        self.data[(key, namespace)] = value

    def _internal_kv_del(self, key: bytes, namespace: str) -> None:
        self.data.pop((key, namespace), None)

    def _internal_kv_exists(self, key: bytes, namespace: str) -> bool:
        return (key, namespace) in self.data


@pytest.fixture
def failing_hosts(monkeypatch, tmp_path):
    """A cluster whose hosts fail to start: Ray's KV store faked, the storage a real SQLite."""
    import ray

    from choreography_ray.runtime import config

    kv = FakeKV()
    stopped: list[str] = []
    monkeypatch.setattr(config, "_kv", lambda: kv)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)

    def start_hosts(*args: Any) -> None:
        raise ray.exceptions.ActorDiedError()

    monkeypatch.setattr(connection, "start_hosts", start_hosts)
    monkeypatch.setattr(connection, "stop_hosts", stopped.append)
    return kv, stopped, f"sqlite:///{tmp_path / 'jobs.db'}"


def test_a_failed_first_connect_leaves_no_configuration_behind(failing_hosts):
    from choreography_ray.runtime.config import read_config

    kv, stopped, url = failing_hosts
    with pytest.raises(HostError, match=r"^starting the hosts: the host actor died") as failed:
        cr.connect(url, namespace="fresh")
    _one_line(str(failed.value))
    assert read_config("fresh") is None and kv.data == {}
    assert stopped == ["fresh"]  # no host keeps the configuration taken back


def test_a_failed_connect_puts_the_previous_configuration_back(failing_hosts):
    from choreography_ray.runtime.config import read_config, write_config

    _, stopped, url = failing_hosts
    before = ClusterConfig(storage=url, modules=["tests.runtime.ray_jobs"], keys=[JobKey()])
    write_config(before, "used")
    with pytest.raises(HostError):
        cr.connect(url, namespace="used", modules=["another_module"])
    assert read_config("used") == before
    assert stopped == []  # the hosts that ran before go on running


def test_the_step_limit_reaches_the_hosts_as_the_check_read_it(failing_hosts, monkeypatch):
    """`"3"` passes `JobsOptions`' rule as 3: the hosts get 3, not the text, which they cannot
    divide among a node's worker hosts."""
    from choreography_ray.runtime.config import read_config

    _, _, url = failing_hosts
    given: list[Any] = []
    monkeypatch.setattr(connection, "start_hosts", lambda *args: given.append(args))
    cr.connect(url, namespace="limited", max_parallel_steps="3")
    assert given == [("limited", 3, None)]  # worker hosts per node: each node's own
    assert read_config("limited").max_parallel_steps == 3
    assert read_config("limited").workers_per_node is None


PREVIOUS_RELEASE_CONFIG = (
    '{"storage": "%s", "options": {}, "modules": [], "packages": {}, '
    '"keys": [{"scope": "default", "namespace": "default"}], "max_parallel_steps": null, '
    '"workers_per_node": 1}'
)
"""A configuration as the previous release wrote it: `workers_per_node` always a number."""


def test_a_configuration_of_the_previous_release_loads_and_keeps_its_hosts(
    failing_hosts, monkeypatch
):
    """Its 1 reads as given: the cluster it configured keeps one worker host per node, also
    once a `connect` that leaves the number out writes the configuration again."""
    from choreography_ray.runtime.config import CONFIG_KEY, read_config

    kv, _, url = failing_hosts
    kv.data[(CONFIG_KEY, "old")] = (PREVIOUS_RELEASE_CONFIG % url).encode()
    assert read_config("old").workers_per_node == 1
    monkeypatch.setattr(connection, "start_hosts", lambda *args: None)
    cr.connect(url, namespace="old", modules=["tests.runtime.ray_jobs"])  # written again
    assert read_config("old").workers_per_node == 1


def test_an_unset_number_of_worker_hosts_is_left_out_of_the_stored_configuration():
    """The previous release's hosts read the field as a number (a rolling upgrade): they
    refuse null, and read a missing field as their old default."""
    from pydantic import BaseModel, ValidationError

    from choreography_ray.runtime.config import config_json

    class PreviousRelease(BaseModel):
        storage: str
        workers_per_node: int = 1

    stored = config_json(ClusterConfig(storage="sqlite:///x.db"))
    assert "workers_per_node" not in stored
    assert ClusterConfig.model_validate_json(stored).workers_per_node is None
    assert PreviousRelease.model_validate_json(stored).workers_per_node == 1
    with pytest.raises(ValidationError):
        PreviousRelease.model_validate_json('{"storage": "x", "workers_per_node": null}')
    given = config_json(ClusterConfig(storage="x", workers_per_node=3))
    assert ClusterConfig.model_validate_json(given).workers_per_node == 3


@pytest.mark.parametrize(("running", "asked"), [(None, 2), (1, 2), (2, 1)])
def test_a_later_connect_may_not_change_the_worker_hosts_per_node(
    failing_hosts, monkeypatch, running, asked
):
    from choreography_ray.runtime.config import read_config, write_config

    _, _, url = failing_hosts
    before = ClusterConfig(storage=url, keys=[JobKey()], workers_per_node=running)
    write_config(before, "placed")
    monkeypatch.setattr(connection, "start_hosts", lambda *args: None)
    with pytest.raises(ConfigurationError, match=f"workers_per_node.*cannot switch to {asked}"):
        cr.connect(url, namespace="placed", workers_per_node=asked)
    assert read_config("placed") == before
    cr.connect(url, namespace="placed", workers_per_node=running)  # the same: fine
    cr.connect(url, namespace="placed")  # left out: the cluster's
    assert read_config("placed") == before


def test_after_down_a_connect_may_change_the_worker_hosts_per_node(failing_hosts, monkeypatch):
    """`down` keeps the configuration; no host runs, so the next `up` may place them anew."""
    from choreography_ray.runtime.config import mark_taking_down, read_config, write_config

    _, _, url = failing_hosts
    write_config(ClusterConfig(storage=url, keys=[JobKey()], workers_per_node=1), "down")
    monkeypatch.setattr(connection, "start_hosts", lambda *args: None)
    mark_taking_down("down")
    cr.connect(url, namespace="down", workers_per_node=2)
    assert read_config("down").workers_per_node == 2


# -- Ray's errors as one line --------------------------------------------------------------------


def test_an_error_raised_on_a_host_is_one_line_without_colour_codes():
    import ray

    from choreography_ray.runtime.remote import project_error

    trace = "\x1b[36mray::Controller.remove()\x1b[39m\nTraceback (most recent call last):\n  x\n"
    raised = ray.exceptions.RayTaskError("remove", trace + "ValueError: bad", ValueError("bad"))
    error = project_error(raised, "jobs.remove")
    assert isinstance(error, HostError)
    assert _one_line(str(error)) == "jobs.remove failed on the host: ValueError: bad"
    ours = ray.exceptions.RayTaskError("get", trace, JobNotFoundError("j"))
    assert isinstance(project_error(ours, "jobs.get"), JobNotFoundError)


# Ray 2.60's text when a process without the cluster's token joins it by address: `ray.init`
# raises ConnectionError("Failed to connect to Ray cluster at …") from this RuntimeError.
RAY_AUTH_FAILURE = (
    "Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
    '  File "python/ray/includes/common.pxi", line 119, in ray._raylet.check_status\n'
    "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication token is "
    "missing or incorrect. Note: RAY_AUTH_MODE is currently 'disabled' (not 'token')."
)


def test_a_refused_token_is_told_apart_from_an_unreachable_cluster(monkeypatch):
    import ray

    def refused(**kwargs: Any) -> None:
        try:
            raise RuntimeError(RAY_AUTH_FAILURE)
        except RuntimeError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from cause

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refused)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(ClusterAuthenticationError) as failed:
        connection.init_ray(None, "choreography")
    assert "RAY_AUTH_MODE=token" in _one_line(str(failed.value))
    assert not connection.is_authentication_failure(ConnectionError("Failed to connect"))


@pytest.fixture
def token_cluster(monkeypatch):
    """A cluster whose GCS refuses this process's (missing) token, as Ray 2.60 refuses it: to
    Ray's client (joining) and over gRPC (the reading commands); `ray.init` fails the test, as
    the refusal must be told before it."""
    import ray
    import ray._raylet

    def refusing(address: str) -> None:
        raise ray.exceptions.AuthenticationError("InvalidAuthToken: the token is missing")

    def init(**kwargs: Any) -> None:
        raise AssertionError("ray.init was called: Ray retries a refused token for 20 s")

    fake = FakeControlStore()
    fake.token = TOKEN
    monkeypatch.setattr(ray._raylet, "GcsClient", refusing)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with serving(fake) as address:  # what the reading commands ask
        monkeypatch.setattr(connection, "check_reachable", lambda _: address)
        yield address


def test_a_token_cluster_is_told_before_ray_init_by_the_api_and_the_command(token_cluster):
    with pytest.raises(ClusterAuthenticationError) as failed:
        cr.connect(address=token_cluster)
    line = _one_line(str(failed.value))
    assert "uses token authentication" in line and "RAY_AUTH_MODE=token" in line
    result = runner.invoke(app, ["jobs", "list", "--address", token_cluster])
    assert result.exit_code == 4
    assert "RAY_AUTH_MODE=token" in _one_line(result.output)


# -- the command line ----------------------------------------------------------------------------


@pytest.fixture
def stored(tmp_path) -> tuple[str, Path]:
    """A SQLite store holding one job, and its file."""
    path = tmp_path / "jobs.db"
    url = f"sqlite:///{path}"

    async def fill() -> None:
        async with open_storage(url) as provider:
            await provider.for_key(JobKey()).jobs.save(_state("kept", JobStatus.STOPPED))

    asyncio.run(fill())
    return url, path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["jobs", "show", ""], 2, "job id '' is empty"),
        (["jobs", "remove", ""], 2, "job id '' is empty"),
        (["jobs", "stop", " kept"], 2, "job id ' kept' has whitespace at its start or end"),
        (["jobs", "resume", "a/b"], 2, "job id 'a/b' contains a path separator"),
        (["jobs", "watch", "bell\x07"], 2, "job id 'bell\\x07' contains a control"),
        (["jobs", "list", "--limit", "-1"], 2, "limit: must be 0 (all) or more, got -1"),
        (["jobs", "show", "kept", "--scope", ""], 2, "scope: must not be empty"),
        (["up", "--storage", "sqlitee:///x.db"], 2, "storage URL 'sqlitee:///x.db': unknown"),
        (["up", "--storage", DEAD_POSTGRES], 4, "cannot reach storage postgresql+psycopg://"),
        (["up", "--workers-per-node", "0"], 2, "workers_per_node: must be at least 1, got 0"),
        (["up", "--config", "bad.toml"], 2, "max_parallel_steps: must be at least 1, or unset"),
    ],
)
def test_bad_input_on_the_command_line_is_one_line_and_writes_nothing(
    no_cluster, stored, monkeypatch, args, code, message
):
    url, path = stored
    (path.parent / "bad.toml").write_text("[jobs]\nmax_parallel_steps = -1\n")
    monkeypatch.chdir(path.parent)
    before = _digest(path)
    storage = [] if "--storage" in args else ["--storage", url]
    result = runner.invoke(app, [*args, *storage])
    assert result.exit_code == code
    assert _one_line(result.output).startswith(f"error: {message}")
    assert _digest(path) == before


@pytest.mark.parametrize(
    "arguments",
    [{"max_parallel_steps": -1}, {"workers_per_node": 0}, {"modules": "m"}, {"namespace": " "}],
)
def test_a_bad_connect_argument_leaves_the_store_untouched(no_cluster, stored, arguments):
    url, path = stored
    before = _digest(path)
    with pytest.raises(ConfigurationError):
        cr.connect(url, **arguments)
    assert _digest(path) == before


def test_storage_check_of_a_dead_postgres_says_one_line_and_logs_one_line_per_retry(
    monkeypatch, caplog
):
    """psycopg's message spans three lines: the command's error is one line, with no retry
    warning before it (docs/running.md); a host's log still says each retry in one line."""
    import choreography_ray.storage

    no_wait = functools.partial(open_storage, sleep=lambda seconds: None)
    monkeypatch.setattr(choreography_ray.storage, "open_storage", no_wait)
    with caplog.at_level(logging.WARNING, logger="choreography_ray.storage"):
        result = runner.invoke(app, ["storage", "check", "--storage", DEAD_POSTGRES])
    assert result.exit_code == 4
    line = _one_line(result.output)
    assert line.startswith(f"error: storage {DEAD_POSTGRES} failed 5 times with a transient")
    assert not [r for r in caplog.records if r.name == "choreography_ray.storage"]

    async def opened() -> None:
        async with no_wait(DEAD_POSTGRES):
            pass

    caplog.clear()
    with (
        caplog.at_level(logging.WARNING, logger="choreography_ray.storage"),
        pytest.raises(cr.ChoreographyError),
    ):
        asyncio.run(opened())
    retries = [r.getMessage() for r in caplog.records if r.name == "choreography_ray.storage"]
    assert len(retries) == 4  # the default 5 attempts: one line for each retry
    assert all("\n" not in retry and "retrying" in retry for retry in retries)


@pytest.mark.parametrize("how", ["--debug", "CHOREOGRAPHY_DEBUG=1"])
def test_debug_shows_the_traceback_instead_of_the_one_line(how):
    env = {k: v for k, v in os.environ.items() if k != "CHOREOGRAPHY_DEBUG"}
    flags = [how] if how.startswith("--") else []
    if not flags:
        env["CHOREOGRAPHY_DEBUG"] = "1"
    # A process of its own: the flag is kept for the rest of the process that reads it.
    result = subprocess.run(
        [sys.executable, "-m", "choreography_ray.cli", *flags, "jobs", "remove", ""],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode != 0
    assert "Traceback" in result.stderr
    assert "InvalidJobIdError: job id '' is empty" in result.stderr


@pytest.mark.parametrize(("job_id", "reason"), BAD_IDS, ids=[repr(b[:12]) for b, _ in BAD_IDS])
def test_the_in_process_cluster_refuses_the_ids_the_client_refuses(job_id, reason):
    from choreography_ray.testing import InProcessCluster

    async def start() -> None:
        cluster = InProcessCluster("memory://")
        try:
            with pytest.raises(InvalidJobIdError, match=reason):
                await cluster.start(FanOutJob, FanOut(steps=1), job_id=job_id)
            assert await cluster.storage().jobs.count(JobQuery()) == 0
        finally:
            await cluster.close()

    asyncio.run(start())
