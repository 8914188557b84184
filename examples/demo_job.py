"""Run the project's demo job through the Python API, with a progress bar.

    python examples/demo_job.py --steps 2000

It does what `choreography demo` does, in a few lines: connect (a local Ray, SQLite under
./.choreography/), start the job, wait for it with a live progress bar, print the outcome and
shut Ray down. The demo's job types live in `choreography_ray.demo`, a module every host can
import, so nothing needs to be on the path.
"""

from __future__ import annotations

import argparse
import sys

import ray

import choreography_ray as cr
from choreography_ray.demo import DemoJob, DemoRequest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps, in two stages")
    parser.add_argument("--storage", default="sqlite:///.choreography/jobs.db", help="storage URL")
    parser.add_argument("--address", default=None, help="Ray address; none starts a local Ray")
    args = parser.parse_args()

    jobs = cr.connect(args.storage, address=args.address, modules=["choreography_ray.demo"])
    try:
        job_id = jobs.start(DemoJob, DemoRequest(steps=args.steps))
        print(f"started demo job {job_id}: {args.steps} steps in two stages")
        state = jobs.wait(job_id, progress=True)
        if state is None:  # DemoJob keeps its record, so this happens only if someone removed it
            print("the job finished and was cleared")
            return 1
        p = state.progress
        print(
            f"{state.status.name}: {p.successful_steps} succeeded, {p.failed_steps} failed, "
            f"{p.unreachable_steps} unreachable, of {p.total_steps}"
        )
        for stage in p.stages:
            print(f"  stage {stage.stage}: {stage.successful_steps}/{stage.total_steps} succeeded")
        return 0 if state.status == cr.JobStatus.COMPLETED_SUCCESSFULLY else 1
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
