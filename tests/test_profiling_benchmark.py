"""The fan-out profile's CPU by thread names the thread that spent it."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time

from .benchmark_modules import load_benchmark


def _burn(seconds: float, name: bytes) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(15, name, 0, 0, 0)  # PR_SET_NAME: the name /proc shows for this thread
    ends = time.thread_time() + seconds
    while time.thread_time() < ends:
        pass


def test_thread_cpu_gives_each_thread_its_own_cpu_by_name() -> None:
    profiling = load_benchmark("profiling")
    before = profiling.thread_cpu(os.getpid())
    burner = threading.Thread(target=_burn, args=(0.3, b"cr-burner"))
    burner.start()
    while burner.is_alive():
        during = profiling.thread_cpu(os.getpid())  # read while the thread lives
        burner.join(0.05)
    during.subtract(before)
    assert during["cr-burner"] >= 0.2
    main = next(name for name in during if name.endswith("(main)"))
    assert during[main] < during["cr-burner"]
