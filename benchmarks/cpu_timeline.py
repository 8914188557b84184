"""Which Ray processes use the CPU, moment by moment, while a benchmark runs beside this script.

Run it in a second shell (or in the background) while `fanout.py`, `scale.py` or any driver of
this machine runs, for as many seconds as the run takes:

    python benchmarks/fanout.py --sizes 100000 --runs 1 --configs default &
    python benchmarks/cpu_timeline.py 150

Every `--every` seconds it prints each busy host process's share of one core (100 % is one
core; `--match` picks the processes, by default choreography_ray's controller and worker hosts,
not plain Ray's task workers) and their total, then a summary: how long the hosts used under
one core's worth, and how long the whole machine. That is what showed, in the
sixteenth sitting, that a 100,000-step fan-out spent a third of its time planning and preparing
on the controller's one core (benchmarks/RESULTS.md). Linux only: it reads /proc.
"""

from __future__ import annotations

import argparse
import os
import time

from profiling import all_processes


def ray_processes(match: str) -> dict[int, tuple[str, float]]:
    """Each `ray::` process whose title holds `match`: its title's first word and its CPU
    seconds so far."""
    return {
        pid: (title.split()[0], cpu)
        for pid, (title, cpu, _) in all_processes().items()
        if title.startswith("ray::") and match in title
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seconds", type=float, help="how long to watch")
    parser.add_argument("--every", type=float, default=0.2, help="seconds between readings")
    parser.add_argument("--match", default="Host", help="in the titles of the processes watched")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    before = ray_processes(args.match)
    ends = time.monotonic() + args.seconds
    one_core = whole = 0.0
    while time.monotonic() < ends:
        time.sleep(args.every)
        now = ray_processes(args.match)
        shares = {
            pid: (name, 100 * (cpu - before.get(pid, (name, cpu))[1]) / args.every)
            for pid, (name, cpu) in now.items()
        }
        before = now
        busy = {pid: share for pid, share in shares.items() if share[1] >= 5}
        if not busy:
            continue
        total = sum(share for _, share in busy.values())
        if total < 50:
            continue  # the hosts wait (between runs, or while plain Ray's tasks run)
        if total < 125:  # one core, give or take what Ray's own threads add
            one_core += args.every
        if total >= 100 * cores - 25:
            whole += args.every
        print(
            f"{time.monotonic():10.1f}  total {total:4.0f}%  "
            + "  ".join(f"{name[5:]}:{pid}:{share:.0f}%" for pid, (name, share) in busy.items()),
            flush=True,
        )
    print(f"\nthe hosts on one core: {one_core:.1f} s; on all {cores}: {whole:.1f} s")


if __name__ == "__main__":
    main()
