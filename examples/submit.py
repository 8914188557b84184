"""Start a job from a Ray job submission, wait for it, and print the outcome.

Submit it with the examples directory as the working directory: Ray uploads that directory to
the cluster and runs this script in it, so `cpu_jobs` is importable there.

    RAY_ADDRESS=http://127.0.0.1:8265 ray job submit --working-dir examples -- \\
        python submit.py --storage sqlite:////tmp/choreography-example/jobs.db

The storage must be a place every host of the cluster reaches: an absolute SQLite path for a
one-machine cluster, PostgreSQL or MongoDB for more. A relative path would land in Ray's
temporary copy of the working directory, which Ray cleans up. The first connection fixes
the cluster's storage; later submissions must name the same one.
`--storage` may also come from CHOREOGRAPHY_STORAGE.
"""

from __future__ import annotations

import argparse
import os
import sys

import choreography_ray as cr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--storage",
        default=os.environ.get("CHOREOGRAPHY_STORAGE"),
        help="storage URL every node reaches (default: $CHOREOGRAPHY_STORAGE)",
    )
    parser.add_argument("--job", choices=["primes", "map"], default="primes")
    parser.add_argument("--limit", type=int, default=1_000_000, help="primes: count below this")
    parser.add_argument("--ranges", type=int, default=8, help="primes: steps")
    parser.add_argument("--items", type=int, default=1000, help="map: numbers to test")
    args = parser.parse_args()
    if not args.storage:
        parser.error("give --storage (or set CHOREOGRAPHY_STORAGE): a URL every node reaches")
    if args.storage.startswith("sqlite:///") and not args.storage.startswith("sqlite:////"):
        parser.error("a SQLite path must be absolute here: sqlite:////abs/path/jobs.db")

    # "auto": inside a submitted job, RAY_ADDRESS names the cluster that runs it.
    jobs = cr.connect(args.storage, address="auto", modules=["cpu_jobs"])
    if args.job == "map":
        # A step function of the submitted working directory, found by every host through it.
        from cpu_jobs import prime

        job_id = jobs.map(prime, range(args.items)).job_id
    else:
        from cpu_jobs import CountPrimes, CountPrimesRequest

        job_id = jobs.start(CountPrimes, CountPrimesRequest(limit=args.limit, ranges=args.ranges))
    print(f"started job {job_id}", flush=True)

    state = jobs.wait(job_id)
    if state is None:
        print(f"job {job_id} finished and was cleared")
        return 1
    p = state.progress
    print(f"{state.status.name}: {p.successful_steps} of {p.total_steps} steps succeeded")
    if args.job == "primes":
        from cpu_jobs import prime_counts

        print(f"primes below {args.limit:,}: {sum(prime_counts(args.storage, job_id).values())}")
    else:
        print(f"primes below {args.items:,}: {sum(jobs.gather(job_id))}")
    # Leaving disconnects this driver only: the hosts are detached and keep serving the
    # cluster (`choreography down` stops them).
    return 0 if state.status == cr.JobStatus.COMPLETED_SUCCESSFULLY else 1


if __name__ == "__main__":
    sys.exit(main())
