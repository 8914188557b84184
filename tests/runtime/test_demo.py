"""The demo, as a user runs it: its own local Ray and SQLite under ./.choreography/."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from .conftest import ROOT


def _as_from_a_shell() -> None:
    """The demo starts as a shell starts it, with Ctrl-C's signal neither blocked nor ignored:
    a child inherits both from the thread that starts it, and this test process runs Ray
    and other tests' threads first."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _demo(cwd: Path, steps: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "choreography_ray.cli", "demo", "--steps", str(steps)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=_as_from_a_shell,
    )


def _signals(pid: int) -> str:
    """The process's blocked, ignored and caught signal masks, as the kernel shows them."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "(gone)"
    return " ".join(
        line for line in status.splitlines() if line.startswith(("SigBlk", "SigIgn", "SigCgt"))
    )


def _counts(db: Path) -> list[tuple[str, int, int]]:
    with sqlite3.connect(db) as connection:
        return list(
            connection.execute(
                "SELECT job_id, status, count(*) FROM choreography_job_steps "
                "GROUP BY job_id, status ORDER BY job_id, status"
            )
        )


def test_the_demo_runs_a_small_job_to_completion(tmp_path):
    demo = _demo(tmp_path, 40)
    output, _ = demo.communicate(timeout=180)
    assert demo.returncode == 0, output
    assert "COMPLETED_SUCCESSFULLY: 40 steps" in output
    [(_, status, count)] = _counts(tmp_path / ".choreography" / "jobs.db")
    assert (status, count) == (3, 40)


STEPS = 20_000  # large enough that the interrupt lands mid-way


def test_an_interrupted_demo_resumes_the_same_job_when_run_again(tmp_path):
    db = tmp_path / ".choreography" / "jobs.db"
    demo = _demo(tmp_path, STEPS)
    deadline = time.monotonic() + 120
    # Interrupt it once some steps are done (bounded wait on a real event, not a timeout).
    while time.monotonic() < deadline:
        if db.exists():
            try:
                done = sum(n for _, status, n in _counts(db) if status == 3)
            except sqlite3.Error:
                done = 0
            if done >= 50:
                break
        time.sleep(0.05)
    masks = _signals(demo.pid)
    demo.send_signal(signal.SIGINT)
    first, _ = demo.communicate(timeout=60)
    assert "interrupted" in first, f"{first}\nthe demo's signal masks when interrupted: {masks}"
    before = _counts(db)
    [job_id] = {job for job, _, _ in before}
    assert sum(n for _, status, n in before if status == 3) < STEPS

    again = _demo(tmp_path, STEPS)
    second, _ = again.communicate(timeout=180)
    assert again.returncode == 0, second
    assert f"resuming demo job {job_id}" in second
    assert _counts(db) == [(job_id, 3, STEPS)]  # one job, every step once
