"""Where the CPU of a fan-out goes: sampled stacks of every host process, CPU per process and
per host thread.

`benchmarks/fanout.py --profile DIR` records, while each choreography_ray configuration runs
its largest N, py-spy's sampled stacks of the driver and of every host actor (`pip install
py-spy`; it reads the processes' memory, so it needs ptrace rights: root, or
`kernel.yama.ptrace_scope=0`). The raw stacks land in DIR, one file per process, and the
summary printed beside them says where the samples were: the functions holding the most
samples on their own (self) and the libraries the time went to (innermost frame's package).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


def all_processes() -> dict[int, tuple[str, float, int]]:
    """Every process of the machine: its title (its command line's first word), its user +
    system CPU seconds (its waited-for children's too) and its parent, from /proc (Linux)."""
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[str, float, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            _, fields = _stat(f"/proc/{entry}/stat")
            title = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0].decode()
        except (OSError, UnicodeDecodeError):
            continue  # it ended meanwhile
        found[int(entry)] = (title, sum(int(v) for v in fields[11:15]) / ticks, int(fields[1]))
    return found


def process_cpu() -> dict[int, tuple[str, float]]:
    """This process's and every descendant's (title, user + system CPU seconds), from /proc
    (Linux). Descendants include every process Ray started for this driver; py-spy's own are
    left out, so that a profiled run's CPU is the system's."""
    found = all_processes()
    children: dict[int, list[int]] = {}
    for pid, (_, _, parent) in found.items():
        children.setdefault(parent, []).append(pid)
    tree: dict[int, tuple[str, float]] = {}
    pending = [os.getpid()]
    while pending:
        pid = pending.pop()
        if pid in found and not Path(found[pid][0]).name.startswith("py-spy"):
            tree[pid] = found[pid][:2]
        pending.extend(children.get(pid, ()))
    return tree


def cpu_seconds() -> float:
    """CPU time (user + system, and of waited-for children) of this driver and every process
    it started, Ray's included."""
    return sum(cpu for _, cpu in process_cpu().values())


def _role(title: str, pid: int) -> str:
    if pid == os.getpid():
        return "driver"
    if title.startswith("ray::"):
        return title.split()[0]  # ray::ControllerHost, ray::WorkerHost, ray::IDLE, ...
    return Path(title).name or "?"


def thread_cpu(pid: int) -> Counter[str]:
    """CPU seconds of each live thread of process `pid` so far, by thread name, from /proc.
    In a host actor the busy one is the thread that runs its event loop, which Ray names after
    the process's first title (`ray::IDLE`); the process's first thread is marked "(main)"."""
    ticks = os.sysconf("SC_CLK_TCK")
    spent: Counter[str] = Counter()
    for entry in os.listdir(f"/proc/{pid}/task"):
        try:
            name, fields = _stat(f"/proc/{pid}/task/{entry}/stat")
        except OSError:
            continue  # the thread ended
        name = f"{name} (main)" if int(entry) == pid else name
        spent[name] += (int(fields[11]) + int(fields[12])) / ticks
    return spent


def _stat(path: str) -> tuple[str, list[str]]:
    """A /proc stat file's name (between its parentheses, which may hold spaces) and the
    fields after it, the state first."""
    stat = Path(path).read_text()
    return stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 1 :].split()


def cpu_by_role(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]):
    """CPU seconds spent between two readings of `process_cpu`, summed by process role."""
    spent: Counter[str] = Counter()
    for pid, (title, cpu) in after.items():
        used = cpu - before.get(pid, (title, 0.0))[1]
        if used > 0:
            spent[_role(title, pid)] += used
    return spent


@dataclass
class Recording:
    """py-spy recording a set of processes, one raw (collapsed stacks) file each."""

    directory: Path
    label: str
    rate: int = 500
    processes: list[subprocess.Popen] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)

    def start(self, pids: dict[str, int]) -> None:
        spy = shutil.which("py-spy") or shutil.which(
            "py-spy", path=str(Path(sys.executable).parent)
        )
        if spy is None:
            raise SystemExit("--profile needs py-spy: pip install py-spy")
        self.directory.mkdir(parents=True, exist_ok=True)
        for role, pid in pids.items():
            path = self.directory / f"{self.label}-{role}.txt"
            self.files[role] = path
            self.processes.append(
                subprocess.Popen(
                    [
                        spy,
                        "record",
                        "--pid",
                        str(pid),
                        "--rate",
                        str(self.rate),
                        "--format",
                        "raw",
                        "--output",
                        str(path),
                        "--nonblocking",
                        "--gil",  # what holds the interpreter: the process's Python CPU
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    def stop(self) -> None:
        import signal

        for process in self.processes:
            process.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for process in self.processes:
            process.wait(timeout=60)
        self.processes.clear()

    def summary(self, top: int = 15) -> str:
        lines = []
        for role, path in self.files.items():
            if not path.exists():
                lines.append(f"{role}: no profile written")
                continue
            own, areas, inclusive, total = _read(path)
            if not total:
                continue
            lines.append(f"\n{self.label}, {role}: {total:,} samples")
            lines.append(
                "  by library (innermost frame): "
                + ", ".join(f"{area} {count / total:.0%}" for area, count in areas.most_common(8))
            )
            lines.append("  | self % | function |")
            lines.append("  |---:|---|")
            for name, count in own.most_common(top):
                lines.append(f"  | {count / total:.1%} | {name} |")
            lines.append("  | inclusive % | choreography_ray function |")
            lines.append("  |---:|---|")
            for name, count in inclusive.most_common(top):
                lines.append(f"  | {count / total:.1%} | {name} |")
        return "\n".join(lines)


def _read(path: Path) -> tuple[Counter[str], Counter[str], Counter[str], int]:
    own: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        innermost = frames[-1]
        total += count
        own[_short(innermost)] += count
        areas[_area(innermost)] += count
        for name in {_short(f) for f in frames if "choreography_ray" in f}:
            inclusive[name] += count
    return own, areas, inclusive, total


def _short(frame: str) -> str:
    # py-spy raw frames: "function (path/to/module.py:line)"
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    file = where.rsplit(":", 1)[0]
    parts = Path(file).parts
    if "site-packages" in parts:
        parts = parts[parts.index("site-packages") + 1 :]
    elif "lib" in parts:
        parts = parts[len(parts) - 1 :]
    return f"{name} ({'/'.join(parts[-3:])})"


def _area(frame: str) -> str:
    file = frame.partition(" (")[2].rsplit(":", 1)[0]
    parts = Path(file).parts
    if "site-packages" in parts:
        package = parts[parts.index("site-packages") + 1]
        if package == "choreography_ray" and len(parts) > parts.index("site-packages") + 2:
            return "choreography_ray." + parts[parts.index("site-packages") + 2].removesuffix(".py")
        return package.removesuffix(".py")
    if "choreography_ray" in parts:
        index = parts.index("choreography_ray")
        return "choreography_ray." + parts[index + 1].removesuffix(".py")
    if file.endswith(".py"):
        return "stdlib." + Path(file).stem
    return file or "native"
