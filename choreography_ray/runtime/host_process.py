"""What a host process sets up for itself: logging, the cycle collector, its configuration."""

from __future__ import annotations

import gc
import logging
import os

from ..jobs.errors import ConfigurationError, ShuttingDownError
from .config import ClusterConfig, require_config


class JobIds(logging.Filter):
    """Gives every record the job and step ids the format names ("-" when it has none)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.job_id = getattr(record, "job_id", "-")
        record.step_id = getattr(record, "step_id", "-")
        return True


def configure_logging() -> None:
    """Our own messages at INFO, with job and step ids as fields; other libraries at WARNING."""
    handler = logging.StreamHandler()
    handler.addFilter(JobIds())
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s job=%(job_id)s step=%(step_id)s %(message)s"
        )
    )
    ours = logging.getLogger("choreography_ray")
    if not any(isinstance(f, JobIds) for h in ours.handlers for f in h.filters):
        ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False


_GC_THRESHOLDS = (200_000, 20, 20)
"""Young-generation collections after 200,000 allocations net of frees, not Python's 700.

Above a host's usual live set: objects that die within a step (by reference counting) then
rarely meet a collection. At 50,000 a young collection came every few thousand steps and
scanned the records of the steps in flight, 8-10 % of a host's CPU in the fan-out benchmark;
at 200,000 it is 0.3-3.5 %, for about 25 MB more at a worker host's peak (RESULTS.md)."""


def tune_gc() -> None:
    """Collect cycles less often than Python's defaults, and never scan start-up objects.

    A host allocates several objects per step while holding thousands of live records; with
    the default thresholds the collector ran so often that it took about a third of the
    worker host's CPU in the fan-out benchmark (2.2 s against 1.4 s for 10,000 steps, same
    run). The engine makes no reference cycle per step (`tests/engine/test_garbage.py` holds it
    to that), so garbage still goes at once, by reference counting; a cycle per step would
    stay in memory until the next collection (a worker host at 100,000 steps peaked at 428 MB
    with one, 183 MB without).
    """
    gc.set_threshold(*_GC_THRESHOLDS)
    gc.freeze()


def cluster_config(namespace: str) -> ClusterConfig:
    """The configuration a host runs with; none means the job system is being taken down."""
    try:
        return require_config(namespace)
    except ConfigurationError as error:
        raise ShuttingDownError(str(error)) from None


def rss_kb() -> int:
    """Resident memory now (not the peak), from /proc where there is one."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return 0
