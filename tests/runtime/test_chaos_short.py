"""A short chaos soak in CI (`benchmarks/chaos.py`): every fault of the rotation once, about
10 s apart over work sized to about 60 s, six jobs in three partitions from two drivers, on a
multi-node Ray with GCS fault tolerance on the machine's Redis and a PostgreSQL server of the
soak's own. Every job completes with exact counts, every stored success has its side effect,
and no stored success runs again."""

from __future__ import annotations

from ..benchmark_modules import load_benchmark


def test_a_short_chaos_soak_loses_nothing_and_runs_no_success_twice() -> None:
    chaos = load_benchmark("chaos")
    soak = chaos.Soak(minutes=1.0, every=10.0, jobs=6, steps=100, faults=len(chaos.FAULTS))
    report = soak.run()
    print("\n" + "\n".join(report.lines()))
    assert {fault.kind for fault in report.faults} == set(chaos.FAULTS)  # each kind once
    assert report.incomplete == []
    assert report.missing_effects == 0
    assert report.stored_rerun == 0
    assert max(report.longest_stall.values()) < 45.0
