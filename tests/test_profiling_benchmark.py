"""The fan-out profile's CPU by thread names the thread that spent it."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time

from .benchmark_modules import load_benchmark


def _burn(seconds: float, name: bytes, burnt: threading.Event, release: threading.Event) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(15, name, 0, 0, 0)  # PR_SET_NAME: the name /proc shows for this thread
    ends = time.thread_time() + seconds
    while time.thread_time() < ends:
        pass
    burnt.set()
    release.wait(60)  # alive, so that its /proc entry is there to read


def test_thread_cpu_gives_each_thread_its_own_cpu_by_name() -> None:
    profiling = load_benchmark("profiling")
    before = profiling.thread_cpu(os.getpid())
    burnt, release = threading.Event(), threading.Event()
    burner = threading.Thread(target=_burn, args=(0.3, b"cr-burner", burnt, release))
    burner.start()
    try:
        assert burnt.wait(60), "the burning thread did not finish its 0.3 s of CPU"
        during = profiling.thread_cpu(os.getpid())
    finally:
        release.set()
        burner.join(60)
    during.subtract(before)
    assert during["cr-burner"] >= 0.25
    main = next(name for name in during if name.endswith("(main)"))
    assert during[main] < during["cr-burner"]
