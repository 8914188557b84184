"""The examples run as a user runs them: `cd examples && python cpu_bound.py`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a script in a session of its own; whatever it leaves behind (a local Ray that did
    not shut down) is killed with its process group."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    process = subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, output, None)


def test_the_cpu_bound_example_counts_primes_on_its_own_local_ray(tmp_path):
    storage = f"sqlite:///{tmp_path / 'jobs.db'}"
    small = ["--limit", "100000", "--ranges", "4", "--storage", storage]
    # "local": a Ray of its own, even when a cluster started with `ray start` runs here.
    result = _run(["cpu_bound.py", *small, "--address", "local"], cwd=EXAMPLES, timeout=120)
    assert result.returncode == 0, result.stdout
    assert "COMPLETED_SUCCESSFULLY: 4 of 4 steps succeeded, 0 failed" in result.stdout
    assert "primes below 100,000: 9592" in result.stdout  # pi(10^5)
