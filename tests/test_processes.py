"""Killing exactly a test cluster's own processes: those that inherited its marker, and
those given its directory on their command line (Ray's agents)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

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
