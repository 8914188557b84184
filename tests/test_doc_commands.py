"""Every shell command of README.md and docs/running.md runs as written, or says why not.

The fenced `bash` blocks run in page order, one command at a time, from the repository's root,
in one session against one Ray head: the one the recipe itself starts. The session has a HOME
of its own, so `ray get-auth-token --generate` makes a token there (this machine's own is
never read nor written), and a RAY_TMPDIR of its own, so that `ray start` and every
`--address auto` find this session's Ray and no other on the machine. What the session changes
in the commands is listed in `Session.substitute`: free ports for 6380 and 8265, a SQLite path
of its own, and the ids the docs leave to the reader. `ray stop` is not run (it stops every Ray
on the machine): the session kills the processes it started instead. A block that cannot run
here is in `NOT_RUN`, with the reason, and its commands are checked with `--help`, which
refuses an option the command does not have.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from itertools import dropwhile
from pathlib import Path

import pytest

from choreography_ray.testing.processes import kill_marked

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/running.md")
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
OUTPUT = re.compile(r"^```text\n(.*?)^```", re.S | re.M)

HEAD_WITH_ROLE = 'ray start --head --port=6379 --resources={"choreography_controller": 1}'
NOT_RUN: dict[tuple[str, str], tuple[str, bool]] = {
    # (page, the block's first command, its words one space apart):
    # (why it is not run here, whether `--help` checks its commands)
    (
        "README.md",
        "python3.11 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/choreography demo",
    ): (
        "makes a .venv and installs into it, as this suite's own .venv was made; "
        "tests/runtime/test_demo.py runs the demo",
        False,
    ),
    (
        "README.md",
        "python3.11 -m venv .venv && .venv/bin/pip install -q -e .[dev] && "
        ".venv/bin/python -m pytest",
    ): ("runs the whole suite, this test included", False),
    ("docs/running.md", "choreography demo"): (
        "starts a second Ray, a local one of its own: tests/runtime/test_demo.py runs the demo",
        True,
    ),
    ("docs/running.md", HEAD_WITH_ROLE): (
        "a second Ray head, and a node of another machine (HEAD_IP); the multi-node tests "
        "(choreography_ray.testing) declare roles with the same resources",
        True,
    ),
    (
        "docs/running.md",
        f"{HEAD_WITH_ROLE} "
        '--system-config={"health_check_period_ms": 1000, "health_check_timeout_ms": 1000, '
        '"health_check_failure_threshold": 3}',
    ): ("a second Ray head; the multi-node tests set the same three keys", True),
    (
        "docs/running.md",
        "choreography up --storage postgresql+psycopg://jobs@db.internal:5432/jobs "
        "--module mypackage.jobs --config jobs.toml",
    ): ("a database and a package of yours; tests/runtime/test_cli.py runs `up`", True),
    ("docs/running.md", "kubectl apply -f deploy/kuberay.yaml"): (
        "needs a Kubernetes cluster with KubeRay; tests/test_deploy.py validates the file "
        "against KubeRay's CRD schema",
        False,
    ),
    ("docs/running.md", "kubectl apply -f deploy/kuberay-rayjob.yaml"): (
        "needs a Kubernetes cluster with KubeRay; tests/test_deploy.py validates the file",
        False,
    ),
}

COMMAND_SECONDS = 120.0
"""The longest one command may take (the first submission starts the hosts)."""


def blocks() -> list[tuple[str, list[str]]]:
    """Every fenced bash block of the pages, as (where, its commands)."""
    found = []
    for page in PAGES:
        text = (ROOT / page).read_text()
        for number, match in enumerate(BLOCK.finditer(text), start=1):
            found.append((f"{page}#{number}", commands(match.group(1))))
    return found


def commands(block: str) -> list[str]:
    """The commands of a block, as written: a line ending in `\\`, or one with a quote left
    open, goes on to the next; comments and blank lines are left out."""
    found, pending = [], ""
    for line in block.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if pending.rstrip().endswith("\\"):
            continue
        try:
            words = shlex.split(pending.replace("\\\n", " "), comments=True)
        except ValueError:  # a quotation goes on on the next line
            continue
        if words:
            found.append(pending)
        pending = ""
    assert not pending, f"a command is left open at the end of a block: {pending!r}"
    return found


def words(command: str) -> list[str]:
    return shlex.split(command.replace("\\\n", " "), comments=True)


def first_command(where: str, found: list[str]) -> tuple[str, str]:
    """A block's key in `NOT_RUN`: its page and its first command, one space between words."""
    return where.split("#")[0], " ".join(" ".join(words(found[0])).split())


def test_every_shell_block_is_run_or_says_why_not() -> None:
    """A block is run by `test_the_documented_commands_run_as_written` unless `NOT_RUN` names
    it; a block `NOT_RUN` names that is no longer in the docs is a stale entry."""
    listed = {first_command(where, found) for where, found in blocks()}
    stale = set(NOT_RUN) - listed
    assert not stale, f"NOT_RUN names blocks the docs no longer have: {sorted(stale)}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Session:
    """A shell session of the docs' reader, against one Ray head of its own."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.gcs, self.dashboard = free_port(), free_port()
        home = tmp / "home"
        home.mkdir()
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "CHOREOGRAPHY_"))}
        self.env = {
            **keep,
            "HOME": str(home),
            "RAY_TMPDIR": str(tmp),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self.head: str | None = None
        """The `ray start --head` command run, as the docs write it."""
        self.unused = {"6380", "8265", "/tmp/choreography-example/", "ACTOR_ID"}
        """The substitutions no command has needed yet: every one must be used."""
        self.actor_id: str | None = None
        self.job: str | None = None
        self.outputs: list[tuple[list[str], str]] = []
        """Each command run, as the docs write it (its words), with its output."""

    def substitute(self, command: str) -> str:
        """The command with the session's own ports, paths and ids."""
        changes = {
            "6380": str(self.gcs),
            "8265": str(self.dashboard),
            "/tmp/choreography-example/": f"{self.tmp}/example/",
            "ACTOR_ID": self.actor_id or "ACTOR_ID",
        }
        for old, new in changes.items():
            if old in command:
                command = command.replace(old, new)
                self.unused.discard(old)
        if words(command)[:3] == ["ray", "start", "--head"]:
            # Ports other engineers' clusters may hold: the dashboard agent's and Ray Client's.
            ports = f"--dashboard-agent-listen-port={free_port()}"
            ports += f" --ray-client-server-port={free_port()}"
            command += f" --dashboard-port={self.dashboard} {ports}"
        return command

    def run(self, where: str, command: str) -> str:
        """Run one command as the docs write it; its output. An `export` sets the session's
        environment; `ray stop` is left to `stop`."""
        said = words(command)
        if said[0] == "export":
            for assignment in said[1:]:
                name, _, value = assignment.partition("=")
                self.env[name] = value
            return ""
        if said[:2] == ["ray", "stop"]:
            return ""
        if said[:3] == ["ray", "start", "--head"] and self.head is not None:
            assert command == self.head, (
                f"{where} starts Ray unlike the recipe before it ({self.head!r}): the session "
                "runs one head; write the same command"
            )
            return ""  # the same command, run already
        if said[:3] == ["ray", "start", "--head"]:
            self.head = command
        result = subprocess.run(
            ["bash", "-o", "pipefail", "-c", self.substitute(command)],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_SECONDS,
            start_new_session=True,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{where}: `{command}` exited {result.returncode}:\n{output}"
        started = re.search(r"^started job ([0-9a-f]{32})$", result.stdout, re.M)
        if started and self.job is None:
            self.job = self.env["JOB"] = started.group(1)  # the docs' `$JOB`
        if said[:3] == ["ray", "list", "actors"]:
            listed = re.search(r"\b([0-9a-f]{32})\s+ControllerHost\b", output)
            assert listed, f"{where}: `{command}` listed no ControllerHost:\n{output}"
            self.actor_id = listed.group(1)
        self.outputs.append((said, output))
        return output

    def output_of(self, *start: str) -> list[str]:
        """The outputs of the commands run that begin with the words `start`, after the
        variables they set (`RAY_ADDRESS=… ray job submit`)."""
        found = []
        for said, out in self.outputs:
            program = list(dropwhile(lambda word: re.match(r"[A-Za-z_]\w*=", word), said))
            if program[: len(start)] == list(start):
                found.append(out)
        return found

    def check_options(self, where: str, command: str) -> None:
        """`command --help`: the command and every option it names exist."""
        result = subprocess.run(
            [*words(command), "--help"],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_SECONDS,
        )
        assert result.returncode == 0, f"{where}: `{command}`: {result.stdout}{result.stderr}"
        for option in words(command):
            name, _, value = option.partition("=")
            if name in ("--resources", "--system-config"):
                json.loads(value)  # what Ray will read

    def stop(self) -> None:
        """Kill every process the session started, the Ray head's included, and wait until
        they are gone (a bare `ray stop` would stop every Ray of the machine)."""
        kill_marked(f"RAY_TMPDIR={self.tmp}".encode(), timeout=30)


@pytest.fixture
def session() -> Iterator[Session]:
    # Short: Ray's socket paths under RAY_TMPDIR must stay below the 107 characters allowed.
    with tempfile.TemporaryDirectory(prefix="crdoc-") as tmp:
        started = Session(Path(tmp))
        try:
            yield started
        finally:
            started.stop()


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds processes in /proc")
def test_the_documented_commands_run_as_written(session: Session) -> None:
    for where, found in blocks():
        reason = NOT_RUN.get(first_command(where, found))
        for command in found:
            if reason is None:
                session.run(where, command)
            elif reason[1]:
                session.check_options(where, command)
    assert session.head is not None, "no block starts Ray"
    assert not session.unused, f"substitutions no command needed: {sorted(session.unused)}"

    # What the docs say the commands print.
    primes, *_, mapped = session.output_of("ray", "job", "submit")
    after = (ROOT / "docs/running.md").read_text().split("The first submission ends with")
    shown = OUTPUT.search(after[1])
    assert shown is not None, "docs/running.md shows no output of the first submission"
    for line in shown.group(1).splitlines():
        if not re.search(r"raysubmit_|[0-9a-f]{32}|^-+$", line):
            assert line in primes, f"the first submission did not print {line!r}"
    # A step function of the submitted working directory, mapped: found on every host.
    assert "COMPLETED_SUCCESSFULLY: 200 of 200 steps succeeded" in mapped
    assert "primes below 200: 46" in mapped
    assert all(
        "examples.count-primes" in out
        for out in session.output_of("choreography", "jobs", "list", "--address")
    )
    [logs] = session.output_of("ray", "logs", "actor")
    assert ":actor_name:ControllerHost" in logs
