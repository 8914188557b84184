"""The CPU timeline names the host processes that worked, and what share of a core each used."""

from __future__ import annotations

import subprocess
import sys

from .benchmark_modules import BENCHMARKS, load_benchmark

BURN = "import time\nends = time.process_time() + 3\nwhile time.process_time() < ends: pass\n"


def test_the_timeline_shows_a_busy_host_and_not_other_ray_processes(monkeypatch, capsys) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # it imports its neighbour `profiling`
    timeline = load_benchmark("cpu_timeline")
    # Processes titled as Ray titles its actors: a host that works, and a task worker that works.
    host = subprocess.Popen(
        ["bash", "-c", f'exec -a "ray::FakeWorkerHost" {sys.executable} -c "$0"', BURN]
    )
    task = subprocess.Popen(["bash", "-c", f'exec -a "ray::IDLE" {sys.executable} -c "$0"', BURN])
    try:
        found = timeline.ray_processes("Host")
        assert [name for name, _ in found.values()] == ["ray::FakeWorkerHost"]
        monkeypatch.setattr(sys, "argv", ["cpu_timeline.py", "1.0", "--every", "0.25"])
        timeline.main()
    finally:
        host.kill()
        task.kill()
        host.wait()
        task.wait()
    lines = capsys.readouterr().out.splitlines()
    readings = [line for line in lines if "total" in line]
    assert readings and all(f"FakeWorkerHost:{host.pid}:" in line for line in readings)
    assert not any("IDLE" in line for line in readings)
    shares = [int(line.split(f":{host.pid}:")[1].split("%")[0]) for line in readings]
    assert max(shares) >= 50  # a core's worth, give or take this machine's other work
    assert lines[-1].startswith("the hosts on one core: ")
