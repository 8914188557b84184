"""The write-order benchmark still runs and counts what docs/decisions.md reads from it."""

from __future__ import annotations

from .benchmark_modules import load_benchmark


def load():
    return load_benchmark("write_order")


def test_the_write_order_benchmark_counts_both_scenarios(run) -> None:
    bench = load()
    _, failures = run(bench._scenario("failures", 20, None, 4))
    _, stop = run(bench._scenario("stop", 20, None, None))
    assert failures.rows_in_window == 20 and failures.reports == 20
    assert stop.rows_in_window == 20 and stop.reports == 20
    assert failures.report_messages >= 1 and stop.report_messages >= 1
    derived = bench.derive("failures", 20, failures)
    assert derived.rows == 40 and derived.messages == 2 * failures.report_messages
    assert bench.derive("stop", 20, stop).rows == 20
