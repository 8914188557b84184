"""Killing exactly a test cluster's own processes: those that inherited its marker, and
those given its directory on their command line (Ray's agents)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from choreography_ray.testing.processes import alive, kill_marked, marked

_SLEEP = "import time; time.sleep(60)"


def test_kill_marked_ends_processes_marked_by_environment_or_by_command_line(tmp_path):
    directory = tmp_path / uuid.uuid4().hex
    marker = f"RAY_TMPDIR={directory}".encode()
    inherited = subprocess.Popen(
        [sys.executable, "-c", _SLEEP], env={**os.environ, "RAY_TMPDIR": str(directory)}
    )
    named = subprocess.Popen([sys.executable, "-c", _SLEEP, f"--session-dir={directory}/s"])
    other = subprocess.Popen([sys.executable, "-c", _SLEEP])
    try:
        assert {inherited.pid, named.pid} <= set(marked(marker))
        assert other.pid not in marked(marker)
        kill_marked(marker, timeout=10)
        for process in (inherited, named):
            process.wait(timeout=10)
        assert alive(other.pid)
    finally:
        for process in (inherited, named, other):
            process.kill()
            process.wait(timeout=10)


# A marked parent that starts children of a clean environment and a plain command line, as
# Ray's dashboard modules look once they set their process titles. Each child sleeps for
# `sys.argv[1]` seconds, a number that names the test's children; with a second argument the
# parent starts them one after another, as fast as it can, until it is killed.
_PARENT = """
import os, sys, time
while True:
    os.posix_spawn("/bin/sleep", ["sleep", sys.argv[1]], {})
    if len(sys.argv) < 3:
        time.sleep(60)
"""


def _with_token(token: bytes) -> list[int]:
    """The running processes whose command line holds `token`."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and token in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return [pid for pid in found if alive(pid)]


def _children_left(tmp_path, *, keep_starting: bool) -> list[int]:
    """The children still running after `kill_marked` ended their marked parent."""
    directory = tmp_path / uuid.uuid4().hex
    marker = f"RAY_TMPDIR={directory}".encode()
    seconds = f"60.{uuid.uuid4().int % 10**12:012d}"
    token = f"sleep\0{seconds}".encode()
    args = [sys.executable, "-c", _PARENT, seconds, *(["more"] if keep_starting else [])]
    parent = subprocess.Popen(args, env={**os.environ, "RAY_TMPDIR": str(directory)})
    try:
        deadline = time.monotonic() + 10
        while len(started := _with_token(token)) < (20 if keep_starting else 1):
            assert time.monotonic() < deadline, "the parent started no child"
            time.sleep(0.01)
        assert not set(started) & set(marked(marker))  # nothing marks them
        kill_marked(marker, timeout=10)
        parent.wait(timeout=10)
        return _with_token(token)
    finally:
        parent.kill()
        parent.wait(timeout=10)
        for pid in _with_token(token):  # those kill_marked missed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_kill_marked_ends_the_descendants_of_a_marked_process(tmp_path):
    assert _children_left(tmp_path, keep_starting=False) == []


def test_kill_marked_leaves_no_child_started_while_it_kills(tmp_path):
    """The parent starts children without pause: one started between the scan and the kill
    would outlive its parent under init, were the group not stopped first."""
    for _ in range(3):
        assert _children_left(tmp_path, keep_starting=True) == []
