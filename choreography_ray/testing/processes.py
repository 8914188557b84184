"""The processes of a test cluster, read from Linux's /proc: whose child each is, whether it
still runs. Enough to kill exactly a cluster's own processes and see them gone."""

from __future__ import annotations

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
