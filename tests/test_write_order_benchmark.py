"""The write-order benchmark still runs and counts what docs/decisions.md reads from it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCHMARK = Path(__file__).parent.parent / "benchmarks" / "write_order.py"


def load():
    spec = importlib.util.spec_from_file_location("write_order_benchmark", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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
