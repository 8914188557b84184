"""A chaos soak: a multi-node Ray on this machine, a dozen jobs over several partitions started
from two drivers, and for several minutes a fault every `--every` seconds, in rotation:

- a worker node removed (SIGKILL of its processes) and another added;
- a worker host SIGKILLed while its node lives;
- the controller node owning the most jobs removed and another added;
- a worker node drained (`ray drain-node`, a 15 s deadline), removed at its deadline, replaced;
- the head's control store (GCS) killed and started again 10 s later (GCS fault tolerance on
  the machine's Redis, under a key namespace of its own, deleted afterwards);
- storage made unavailable for 10 s (a PostgreSQL server of the soak's own, stopped with
  `pg_ctl stop -m immediate` and started again).

Then every job must complete; the soak checks exact counts, every step's side effect present
(each step records every run in a table outside storage), no stored success run again, and
reports the steps run again per fault kind and the longest stretch in which a job made no
progress.

    python benchmarks/chaos.py                      # 7 minutes of faults, one every 30 s
    python benchmarks/chaos.py --minutes 2 --every 20

`tests/runtime/test_chaos_short.py` runs a short soak in CI.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from choreography_ray.jobs import JobKey, JobsOptions, JobStatus
from choreography_ray.jobs.status import JobStepStatus
from choreography_ray.runtime.constants import host_node, worker_name
from choreography_ray.testing import MultiNodeCluster
from choreography_ray.testing.cluster_nodes import ControlStoreOnRedis, drain_node
from choreography_ray.testing.postgres_server import PostgresServer
from choreography_ray.testing.side_effects import MODULE, Effects, RecordRuns, SideEffects
from choreography_ray.testing.waiting import eventually, read_job

FAULTS = (
    "worker node removed",
    "worker host killed",
    "owning controller node removed",
    "worker node drained",
    "control store restarted",
    "storage unavailable",
)
OUTAGE_SECONDS = 10.0
DRAIN_DEADLINE = 15
PARALLEL = 8
WORKER_NODES = 2

OPTIONS = JobsOptions(
    max_parallel_steps=PARALLEL,
    membership_interval="500ms",
    job_watchdog_interval="5s",
    reconciliation_interval="5s",
    job_ownership_lease="10s",
    step_stop_timeout="5s",
)

_SECOND_DRIVER = """
import json, sys
import choreography_ray as cr
from choreography_ray.testing.side_effects import MODULE, Effects, RecordRuns

address, url, table, plan = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
jobs = cr.connect(url, address=address, modules=[MODULE])
for namespace, steps, seconds in plan:
    job_id = jobs.start(
        RecordRuns,
        Effects(table=table, steps=steps, step_seconds=seconds),
        scope="chaos",
        namespace=namespace,
    )
    print(namespace, job_id, flush=True)
"""


@dataclass
class Fault:
    kind: str
    at: float
    """Seconds since the soak began."""
    wall: float
    """When, as `time.time()` (what the side-effect table stamps runs with)."""
    took: float = 0.0


@dataclass
class Report:
    """What a soak saw."""

    jobs: dict[str, str]
    """job id -> its partition's namespace."""
    steps: int
    faults: list[Fault] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    """Jobs that did not complete successfully with exact counts."""
    missing_effects: int = 0
    """Steps with a stored success but no recorded run."""
    stored_rerun: int = 0
    """Runs that began after their step's success was stored."""
    stored_rerun_details: list[str] = field(default_factory=list)
    """One line per such run: the fault before it, the runs' nodes and times, the record's
    status changes and its lease (what stored the success)."""
    rerun_by_fault: Counter[str] = field(default_factory=Counter)
    """Steps run more than once, by the fault before the extra run began."""
    longest_stall: dict[str, float] = field(default_factory=dict)
    """job id -> the longest stretch in which it began no run, while unfinished."""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.incomplete and not self.missing_effects and not self.stored_rerun

    def lines(self) -> list[str]:
        worst = max(self.longest_stall.values(), default=0.0)
        kinds = ", ".join(f"{kind}: {count}" for kind, count in sorted(self.rerun_by_fault.items()))
        return [
            f"{len(self.jobs)} jobs of {self.steps} steps, {len(self.faults)} faults in "
            f"{self.seconds:.0f} s",
            "faults: "
            + ", ".join(f"{f.kind} at {f.at:.0f} s ({f.took:.1f} s)" for f in self.faults),
            f"jobs not completed with exact counts: {len(self.incomplete)}",
            f"steps with a stored success and no recorded run: {self.missing_effects}",
            f"runs begun after their step's success was stored: {self.stored_rerun}",
            *(f"  {line}" for line in self.stored_rerun_details),
            f"steps run again, by the fault before: {kinds or 'none'}",
            f"longest stretch without a new run, per job: worst {worst:.1f} s, median "
            f"{_median(list(self.longest_stall.values())):.1f} s",
        ]


def _read(url: str, namespace: str, job_id: str) -> tuple[Any, list[Any]]:
    return read_job(url, job_id, JobKey(scope="chaos", namespace=namespace))


def _median(values: list[float]) -> float:
    values = sorted(values)
    if not values:
        return 0.0
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


class Soak:
    """One soak: the cluster, the jobs, the faults, and the checks afterwards."""

    def __init__(
        self,
        *,
        minutes: float,
        every: float,
        jobs: int,
        steps: int,
        partitions: int = 3,
        faults: int | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        """`faults`: inject this many (in rotation), `every` seconds apart; by default as
        many as fit in `minutes`."""
        self.minutes = minutes
        self.count = faults if faults is not None else max(1, int(minutes * 60 // every))
        self.every = every
        self.jobs = jobs
        self.steps = steps
        self.partitions = partitions
        self.log = log
        # The work lasts about as long as the faults: every job's steps over both workers.
        work = minutes * 60 * WORKER_NODES * PARALLEL
        self.step_seconds = max(0.02, work / (jobs * steps))

    @contextmanager
    def _cluster(self, url: str) -> Iterator[MultiNodeCluster]:
        with MultiNodeCluster(
            url,
            nodes=("none", "controller", "controller", "worker", "worker"),
            modules=[MODULE],
            options=OPTIONS,
            control_store=ControlStoreOnRedis(),
        ) as cluster:
            yield cluster

    def run(self) -> Report:
        began = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="chaos-") as tmp, PostgresServer() as postgres:
            table = SideEffects(Path(tmp) / "effects.db")
            with self._cluster(postgres.url) as cluster:
                jobs = self._start(cluster, postgres.url, table)
                report = Report(jobs=jobs, steps=self.steps)
                self._faults(cluster, postgres, jobs, report, began)
                self._finish(postgres.url, jobs, report)
                self._check(postgres.url, table, report)
        report.seconds = time.monotonic() - began
        return report

    def _start(self, cluster: MultiNodeCluster, url: str, table: SideEffects) -> dict[str, str]:
        namespaces = [f"p{n}" for n in range(self.partitions)]
        plan = [
            (namespaces[n % len(namespaces)], self.steps, self.step_seconds)
            for n in range(self.jobs)
        ]
        mine, theirs = plan[::2], plan[1::2]
        other = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _SECOND_DRIVER,
                cluster.address,
                url,
                str(table.path),
                json.dumps(theirs),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        jobs: dict[str, str] = {}
        for namespace, steps, seconds in mine:
            job_id = cluster.jobs.start(
                RecordRuns,
                Effects(table=str(table.path), steps=steps, step_seconds=seconds),
                scope="chaos",
                namespace=namespace,
            )
            jobs[job_id] = namespace
        out, _ = other.communicate(timeout=300)
        if other.returncode != 0:
            raise RuntimeError("the second driver failed")
        for line in out.split("\n"):
            if line.strip():
                namespace, job_id = line.split()
                jobs[job_id] = namespace
        self.log(f"{len(jobs)} jobs started from two drivers, steps of {self.step_seconds:.2f} s")
        return jobs

    def _faults(
        self,
        cluster: MultiNodeCluster,
        postgres: PostgresServer,
        jobs: dict[str, str],
        report: Report,
        began: float,
    ) -> None:
        kinds = itertools.cycle(FAULTS)
        for _ in range(self.count):
            time.sleep(self.every)  # the soak's pace, not a wait for a timeout
            kind = next(kinds)
            fault = Fault(kind, time.monotonic() - began, time.time())
            start = time.monotonic()
            self._inject(kind, cluster, postgres, jobs)
            fault.took = time.monotonic() - start
            report.faults.append(fault)
            self.log(f"{fault.at:6.0f} s  {kind} ({fault.took:.1f} s)")

    def _inject(
        self,
        kind: str,
        cluster: MultiNodeCluster,
        postgres: PostgresServer,
        jobs: dict[str, str],
    ) -> None:
        if kind == "worker node removed":
            cluster.remove_node("worker")
            cluster.add_node("worker")
        elif kind == "worker host killed":
            cluster.kill_host(worker_name(cluster.nodes("worker")[0].node_id))
        elif kind == "owning controller node removed":
            owners = Counter(
                host_node(job.owner.host)
                for job_id, namespace in jobs.items()
                if (job := _read(postgres.url, namespace, job_id)[0]) is not None
                and job.owner is not None
                and not job.status.is_terminal
            )
            controllers = {node.node_id for node in cluster.nodes("controller")}
            busiest = [node for node, _ in owners.most_common() if node in controllers]
            cluster.remove_node(busiest[0] if busiest else "controller")
            cluster.add_node("controller")
        elif kind == "worker node drained":
            node = cluster.nodes("worker")[-1].node_id
            drain_node(cluster.address, node, deadline=DRAIN_DEADLINE, message="chaos soak")
            time.sleep(DRAIN_DEADLINE)  # the node goes at its deadline, as a preempted one
            cluster.remove_node(node)
            cluster.add_node("worker")
        elif kind == "control store restarted":
            cluster.kill_control_store()
            time.sleep(OUTAGE_SECONDS)  # the outage itself
            cluster.start_control_store()
        elif kind == "storage unavailable":
            postgres.stop()
            time.sleep(OUTAGE_SECONDS)  # the outage itself
            postgres.start()

    def _finish(self, url: str, jobs: dict[str, str], report: Report) -> None:
        def finished() -> bool:
            return all(
                (job := _read(url, namespace, job_id)[0]) is not None and job.status.is_terminal
                for job_id, namespace in jobs.items()
            )

        eventually(finished, "every job of the soak finished", 600, every=1.0)
        for job_id, namespace in jobs.items():
            job, _ = _read(url, namespace, job_id)
            if (
                job.status != JobStatus.COMPLETED_SUCCESSFULLY
                or job.progress.successful_steps != self.steps
            ):
                report.incomplete.append(job_id)

    def _check(self, url: str, table: SideEffects, report: Report) -> None:
        runs = table.by_step()
        for job_id, namespace in report.jobs.items():
            job, steps = _read(url, namespace, job_id)
            begun: list[float] = []
            for step in steps:
                found = sorted(runs.get(step.id, []), key=lambda r: r.at)
                if step.status == JobStepStatus.COMPLETED_SUCCESSFULLY and not found:
                    report.missing_effects += 1
                stored_at = [
                    change.occurred.timestamp()
                    for change in step.status_changes
                    if change.status == int(JobStepStatus.COMPLETED_SUCCESSFULLY)
                ]
                late = [run for run in found if stored_at and run.at > min(stored_at)]
                if late:
                    report.stored_rerun += len(late)
                    report.stored_rerun_details.append(_rerun_detail(report, step, found, late))
                for run in found[1:]:
                    report.rerun_by_fault[_fault_before(report.faults, run.at)] += 1
                begun.extend(run.at for run in found)
            end = job.status_changes[-1].occurred.timestamp() if job.status_changes else 0.0
            start = job.created.timestamp()
            stamps = sorted([start, *begun, end])
            report.longest_stall[job_id] = max(
                (b - a for a, b in itertools.pairwise(stamps)), default=0.0
            )


def _rerun_detail(report: Report, step: Any, found: list[Any], late: list[Any]) -> str:
    """What a run begun after its step's stored success needs to be understood."""
    changes = ", ".join(
        f"{JobStepStatus(change.status).name}@{change.occurred.timestamp():.3f}"
        for change in step.status_changes
    )
    runs = ", ".join(f"{run.node[:8]}@{run.at:.3f}" for run in found)
    return (
        f"step {step.id[:8]} after {_fault_before(report.faults, late[0].at)}: runs {runs}; "
        f"changes {changes}; lease {step.lease}"
    )


def _fault_before(faults: list[Fault], at: float) -> str:
    """The kind of the last fault injected before `at` (`time.time()`)."""
    kind = "before any fault"
    for fault in faults:
        if fault.wall <= at:
            kind = fault.kind
    return kind


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=7.0, help="how long faults go on")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between faults")
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--steps", type=int, default=400, help="steps per job")
    args = parser.parse_args(argv)
    soak = Soak(minutes=args.minutes, every=args.every, jobs=args.jobs, steps=args.steps)
    report = soak.run()
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
