"""Count primes with a CPU-bound job on a local Ray, and print the result.

    cd examples && python cpu_bound.py --limit 2000000 --ranges 8

The job lives in `cpu_jobs.py`, next to this script, and the host actors import it by name.
They can because Ray puts the driver's working directory and the script's directory on the
Python path of every worker of this driver's Ray job, and the hosts are started by this driver
when it starts the local Ray. On a cluster whose hosts someone else started (`choreography up`),
the module must be installed on every node instead (see docs/running.md).
"""

from __future__ import annotations

import argparse
import sys
import time

import ray
from cpu_jobs import CountPrimes, CountPrimesRequest, prime_counts

import choreography_ray as cr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=2_000_000, help="count primes below this")
    parser.add_argument("--ranges", type=int, default=8, help="steps: one range of numbers each")
    parser.add_argument("--chunk", type=int, default=25_000, help="numbers between checkpoints")
    parser.add_argument(
        "--storage",
        default="sqlite:///.choreography/jobs.db",
        help="storage URL (default: SQLite under ./.choreography/)",
    )
    parser.add_argument(
        "--address",
        default=None,
        help="Ray address: none starts a local Ray (or joins one `ray start` runs here); "
        "'local' always starts a new one; 'auto' joins the cluster on this machine",
    )
    args = parser.parse_args()

    began = time.monotonic()
    jobs = cr.connect(args.storage, address=args.address, modules=["cpu_jobs"])
    try:
        request = CountPrimesRequest(limit=args.limit, ranges=args.ranges, chunk=args.chunk)
        job_id = jobs.start(CountPrimes, request)
        print(f"started job {job_id}: count the primes below {args.limit:,} in {args.ranges} steps")
        state = jobs.wait(job_id, progress=sys.stdout.isatty())
        if state is None:
            print("the job finished and was cleared")
            return 1
        counts = prime_counts(args.storage, job_id)
        p = state.progress
        print(
            f"{state.status.name}: {p.successful_steps} of {p.total_steps} steps succeeded, "
            f"{p.failed_steps} failed"
        )
        print(f"primes below {args.limit:,}: {sum(counts.values())}")
        print(f"took {time.monotonic() - began:.1f} s, including Ray start-up")
        return 0 if state.status == cr.JobStatus.COMPLETED_SUCCESSFULLY else 1
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
