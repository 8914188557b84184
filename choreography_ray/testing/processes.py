"""The processes of a test cluster, read from Linux's /proc: whose child each is, whether it
still runs. Enough to kill exactly a cluster's own processes and see them gone."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

POLL_SECONDS = 0.05


def parent(pid: int) -> int | None:
    """The parent process id of `pid` (Linux /proc), or None when it is gone or unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces: the fields after it are fixed.
    return int(stat.rsplit(")", 1)[1].split()[1])


def children(*parents: int) -> set[int]:
    """The processes whose parent is one of `parents` (Linux /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and parent(int(entry.name)) in parents:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie, killed but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def still_running(pids: set[int], timeout: float) -> set[int]:
    """The processes of `pids` still running after up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    running = {pid for pid in pids if alive(pid)}
    while running and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        running = {pid for pid in running if alive(pid)}
    return running


def marked(marker: bytes) -> list[int]:
    """The processes whose environment holds `marker` (an assignment such as
    `RAY_TMPDIR=...`, which every process a cluster starts inherits), or whose command line
    names its value: Ray's agents are given their session's directories as arguments, and one
    started with an environment of its own would otherwise outlive its cluster."""
    value = marker.partition(b"=")[2]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "environ").read_bytes().split(b"\0") or (
                value and value in (entry / "cmdline").read_bytes()
            ):
                found.append(int(entry.name))
    return found


def kill_marked(marker: bytes, timeout: float) -> None:
    """SIGKILL every process whose environment holds `marker`, and every process descended
    from one, again until none is left; `TimeoutError` when some still run after `timeout`
    seconds.

    Descendants count because a process may overwrite its own environment and command line:
    Ray's dashboard starts its modules through a fork server, and each sets its process title
    over both. They outlive the dashboard by a few hundred milliseconds, and one wrote into
    the session's directory while a test was deleting it. The group is stopped (SIGSTOP)
    before it is killed, so that no process of it can start another unseen: a child started
    after the scan would be handed to init when its parent died, and be nobody's descendant."""
    deadline = time.monotonic() + timeout
    while group := _stopped_group(marker):
        for pid in group:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if still_running(group, max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"processes outlived their SIGKILL: {sorted(group)}")


def _stopped_group(marker: bytes) -> set[int]:
    """The running processes marked with `marker` and all their descendants, each stopped:
    scanned again after each stop until no new one appears (a stopped process starts none)."""
    stopped: set[int] = set()
    while True:
        found = _with_descendants({pid for pid in marked(marker) if alive(pid)} | stopped)
        found.discard(os.getpid())
        new = found - stopped
        if not new:
            return stopped
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new


def _with_descendants(roots: set[int]) -> set[int]:
    """`roots` and every running process below them."""
    found, level = set(roots), set(roots)
    while level:
        level = {pid for pid in children(*level) if alive(pid)} - found
        found |= level
    return found
