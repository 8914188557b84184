"""The `choreography` command against a running single-node Ray (one instance for the module)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from choreography_ray.cli import app
from choreography_ray.jobs import (
    CannotResumeJobError,
    ConfigurationError,
    JobStatus,
    JobStepStatus,
    ResumeJobFailed,
)

from .ray_jobs import FanOut, FanOutJob, gate

runner = CliRunner()
DATABASE: Path
REPORTS_RAY = (
    "import sys\n"
    "from choreography_ray.cli import main\n"
    "try:\n"
    "    main()\n"
    "finally:\n"
    "    print('ray imported' if 'ray' in sys.modules else '', file=sys.stderr)\n"
)
"""`choreography` with its arguments, saying at the end whether it imported Ray."""


@pytest.fixture(scope="module")
def jobs(ray_instance, tmp_path_factory):
    import choreography_ray as cr

    global DATABASE
    DATABASE = tmp_path_factory.mktemp("cli") / "jobs.db"
    return cr.connect(f"sqlite:///{DATABASE}", modules=["tests.runtime.ray_jobs"])


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_jobs_list_and_show_describe_a_job(jobs):
    job_id = jobs.start(FanOutJob, FanOut(steps=4, stages=2))
    jobs.wait(job_id, timeout=60)
    listed = invoke("jobs", "list", "--wide")
    assert listed.exit_code == 0, listed.output
    assert job_id in listed.output and "COMPLETED_SUCCESSFULLY" in listed.output
    shown = invoke("jobs", "show", job_id)
    assert shown.exit_code == 0, shown.output
    assert "stage 0" in shown.output and "stage 1" in shown.output
    assert "RUNNING" in shown.output  # the status history


def test_jobs_show_names_the_nodes_whose_imports_failed(jobs, monkeypatch):
    """The job's own type, and a step type's module that failed on a host running the job's
    type: both name the node and the reason."""
    from choreography_ray.placement.capability import HostAdvert
    from choreography_ray.runtime import adverts

    job_id = jobs.start(FanOutJob, FanOut(steps=1))
    jobs.wait(job_id, timeout=60)
    told = {
        "c:n1": HostAdvert(
            name="c:n1", node_id="n1", failed_modules={"jobs_a": "No module named 'jobs_a'"}
        ),
        "w:n2": HostAdvert(
            name="w:n2",
            node_id="n2",
            job_types=[FanOutJob.name],
            failed_modules={"steps_b": "boom"},
        ),
    }
    monkeypatch.setattr(adverts, "read_adverts", lambda namespace, hosts=None: told)
    shown = invoke("jobs", "show", job_id)
    assert shown.exit_code == 0, shown.output
    assert f"cannot run {FanOutJob.name} on node n1 (c:n1): module jobs_a" in shown.output
    assert "import failed on node n2 (w:n2): module steps_b: boom" in shown.output
    assert "cannot run" not in shown.output.split("import failed")[1]


def test_reading_commands_read_the_control_store_and_storage_without_joining_the_cluster(jobs):
    """`jobs list`, `jobs show` and `jobs steps` from a new process: each answers without
    registering a driver with the cluster (joining costs seconds while a big job runs), nor
    importing Ray, and a running job's step records are counted from their stored status."""
    import ray
    from ray._raylet import GcsClient

    handle = gate()
    try:
        job_id = jobs.start(FanOutJob, FanOut(steps=2, block=True))
        gcs = ray.get_runtime_context().gcs_address
        drivers = GcsClient(address=gcs).get_all_job_info(timeout=10)

        def command(*args: str) -> subprocess.CompletedProcess[str]:
            done = subprocess.run(
                [sys.executable, "-c", REPORTS_RAY, *args, "--address", gcs],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert "ray imported" not in done.stderr  # half a second of CPU (issue 23)
            return done

        listed = command("jobs", "list", "--wide")
        assert listed.returncode == 0, listed.stderr
        assert job_id in listed.stdout and "RUNNING" in listed.stdout
        shown = command("jobs", "show", job_id)
        assert shown.returncode == 0, shown.stderr
        assert "by stored status; --verify reads each record" in shown.stdout
        steps = command("jobs", "steps", job_id)
        assert steps.returncode == 0, steps.stderr
        assert command("jobs", "show", "no-such-job").returncode == 3
        assert GcsClient(address=gcs).get_all_job_info(timeout=10).keys() == drivers.keys()
    finally:
        ray.get(handle.open.remote())
        ray.kill(handle)
    jobs.wait(job_id, timeout=60)
    at_rest = invoke("jobs", "show", job_id)  # completed: every record read
    assert at_rest.exit_code == 0 and "--verify" not in at_rest.output


def test_jobs_stop_resume_and_remove(jobs):
    import ray

    handle = gate()
    try:
        job_id = jobs.start(FanOutJob, FanOut(steps=2, block=True))
        assert invoke("jobs", "stop", job_id).exit_code == 0
        assert jobs.wait(job_id, timeout=60).status == JobStatus.STOPPED
        ray.get(handle.open.remote())
        resumed = invoke("jobs", "resume", job_id)
        assert resumed.exit_code == 0 and "SUCCESS" in resumed.output
        assert jobs.wait(job_id, timeout=60).status == JobStatus.COMPLETED_SUCCESSFULLY
        assert invoke("jobs", "remove", job_id).exit_code == 1  # completed: refused
    finally:
        ray.kill(handle)


def test_jobs_retry_failed_runs_the_failed_steps_again_with_exact_counts(jobs):
    import ray

    handle = gate()
    try:
        job_id = jobs.start(FanOutJob, FanOut(steps=3, flaky=[1, 2]))
        first = jobs.wait(job_id, timeout=60)
        assert first.status == JobStatus.COMPLETED_WITH_FAILURES
        assert (first.progress.successful_steps, first.progress.failed_steps) == (1, 2)
        ray.get(handle.open.remote())
        rerun = invoke("jobs", "retry-failed", job_id)
        assert rerun.exit_code == 0, rerun.output
        assert "2 failed step(s) run again" in rerun.output
        after = jobs.wait(job_id, timeout=60)
        assert after.status == JobStatus.COMPLETED_SUCCESSFULLY
        assert after.progress.total_steps == 3
        assert (after.progress.successful_steps, after.progress.failed_steps) == (3, 0)
        assert after.execution_generation == first.execution_generation + 1
        again = runner.invoke(app, ["jobs", "retry-failed", job_id])
        assert again.exit_code == 1 and "only a job completed with failures" in again.output
        named = runner.invoke(app, ["jobs", "retry-failed", job_id, "--steps", " , "])
        assert named.exit_code != 0 and "steps" in named.output
    finally:
        ray.kill(handle)


def test_a_jobs_priority_is_stored_shown_and_changed_while_it_runs(jobs):
    import json

    import ray

    handle = gate()
    try:
        job_id = jobs.start(FanOutJob, FanOut(steps=2, block=True), priority=4)
        shown = invoke("jobs", "show", job_id)
        assert shown.exit_code == 0 and "priority: 4" in shown.output, shown.output
        changed = invoke("jobs", "set-priority", job_id, "9")
        assert changed.exit_code == 0, changed.output
        assert jobs.get(job_id).priority == 9
        listed = json.loads(invoke("jobs", "list", "--output", "json").output)
        assert {job["id"]: job["priority"] for job in listed}[job_id] == 9
        wrong = runner.invoke(app, ["jobs", "set-priority", job_id, "10000000"])
        assert wrong.exit_code != 0 and "priority" in wrong.output
        ray.get(handle.open.remote())
        assert jobs.wait(job_id, timeout=60).status == JobStatus.COMPLETED_SUCCESSFULLY
    finally:
        ray.kill(handle)


def test_jobs_drain_stops_a_job_and_names_the_steps_that_drained(jobs):
    import ray

    handle = gate()
    try:
        job_id = jobs.start(FanOutJob, FanOut(steps=2, block=True))
        drained = invoke("jobs", "drain", job_id, "--timeout", "30")
        assert drained.exit_code == 0, drained.output
        assert "DRAINED" in drained.output
        state = jobs.get(job_id)
        assert state.status == JobStatus.STOPPED and state.stop_finalized
        assert not state.pending_drain
        assert jobs.step_counts(job_id).get(JobStepStatus.STOPPED) == 2
        assert invoke("jobs", "drain", "no-such-job").exit_code == 3  # not found
        refused = invoke("jobs", "drain", job_id, "--timeout", "0")
        assert refused.exit_code == 2 and "timeout" in refused.output  # a bad value
    finally:
        ray.kill(handle)


def test_a_job_whose_step_records_cannot_be_read_is_shown_refused_and_removable(jobs):
    import ray

    handle = gate()
    try:
        job_id = jobs.start(FanOutJob, FanOut(steps=3, block=True))
        jobs.stop(job_id)
        assert jobs.wait(job_id, timeout=60).status == JobStatus.STOPPED
    finally:
        ray.kill(handle)
    with sqlite3.connect(DATABASE) as db:
        db.execute(
            "UPDATE choreography_job_steps SET state = '{not json' WHERE job_id = ?", (job_id,)
        )

    stored = _rows(job_id)

    shown = invoke("jobs", "show", job_id)
    assert shown.exit_code == 0, shown.output
    assert "3 step record(s) cannot be read" in shown.output
    assert jobs.step_counts(job_id).unreadable == 3

    with pytest.raises(ResumeJobFailed) as refused:
        jobs.resume(job_id)
    assert refused.value.code == CannotResumeJobError.UNREADABLE_STEPS
    message = str(refused.value)
    assert "\n" not in message and "3 step record(s) cannot be read" in message
    resumed = invoke("jobs", "resume", job_id)
    assert resumed.exit_code == 1
    [line] = resumed.output.strip().splitlines()
    assert "cannot be read" in line
    assert jobs.get(job_id).status == JobStatus.STOPPED
    assert _rows(job_id) == stored  # neither refusal changed the job or its steps

    assert invoke("jobs", "remove", job_id).exit_code == 0
    with sqlite3.connect(DATABASE) as db:
        left = db.execute(
            "SELECT count(*) FROM choreography_job_steps WHERE job_id = ?", (job_id,)
        ).fetchone()
    assert left == (0,)


def _rows(job_id: str) -> list[tuple]:
    """The job's stored rows, as they are in the file."""
    with sqlite3.connect(DATABASE) as db:
        job = db.execute("SELECT * FROM choreography_jobs WHERE id = ?", (job_id,)).fetchall()
        steps = db.execute(
            "SELECT * FROM choreography_job_steps WHERE job_id = ? ORDER BY step_id", (job_id,)
        ).fetchall()
    return job + steps


def test_jobs_watch_follows_a_job_to_its_end(jobs):
    job_id = jobs.start(FanOutJob, FanOut(steps=30))
    watched = invoke("jobs", "watch", job_id, "--timeout", "60")
    assert watched.exit_code == 0, watched.output
    assert "COMPLETED_SUCCESSFULLY" in watched.output


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("jobs", "show", "no-such-job"), 3, "no job with id 'no-such-job'"),
        (("jobs", "stop", "no-such-job"), 3, "no job with id 'no-such-job'"),
        (("jobs", "watch", "no-such-job"), 3, "no job with id 'no-such-job'"),
        (("jobs", "list", "--status", "bogus"), 2, "unknown status 'bogus'"),
    ],
)
def test_mistakes_are_one_line_errors_with_a_non_zero_exit(jobs, args, code, message):
    result = runner.invoke(app, list(args))
    assert result.exit_code == code
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_an_unreachable_cluster_is_a_one_line_error():
    result = subprocess.run(
        [sys.executable, "-m", "choreography_ray.cli", "jobs", "list", "--address", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 4
    assert "cannot reach the Ray cluster at '127.0.0.1:1'" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreachable_storage_is_a_one_line_error(tmp_path):
    url = "postgresql+psycopg://nobody@127.0.0.1:1/none"
    result = runner.invoke(app, ["storage", "check", "--storage", url])
    assert result.exit_code == 4
    assert "storage" in result.output and "Traceback" not in result.output


def test_a_job_module_no_host_can_import_is_refused_and_forgotten(jobs):
    import choreography_ray as cr
    from choreography_ray.jobs import ConfigurationError
    from choreography_ray.runtime.config import read_config

    with pytest.raises(ConfigurationError, match="no_such_module_for_tests"):
        cr.connect(modules=["no_such_module_for_tests"])
    assert "no_such_module_for_tests" not in read_config("choreography").modules
    cr.connect()  # the cluster goes on as it was


def test_up_reports_a_module_that_cannot_be_imported(jobs):
    result = runner.invoke(app, ["up", "--module", "no_such_module_either"])
    assert result.exit_code == 2
    assert "could not import job module(s): no_such_module_either" in result.output


def test_bench_prints_the_fan_out_table_beside_plain_ray(tmp_path):
    # Its own local Ray, so a process of its own: this module's Ray is already up.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "choreography_ray.cli",
            "bench",
            "--steps",
            "50",
            "--runs",
            "1",
            "--workers-per-node",
            "2",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "fan-out of 50 no-op steps, SQLite, medians of 1 run(s)" in done.stdout
    assert "plain Ray tasks" in done.stdout
    assert "choreography_ray" in done.stdout and "default" in done.stdout
    assert "tuned: max_parallel_steps=256, 2 worker hosts per node" in done.stdout


def test_the_benchmarks_refuse_a_driver_and_workers_of_two_checkouts(ray_instance, monkeypatch):
    """Ray's workers import the package from the driver's working directory first: a
    benchmark of an old version on `PYTHONPATH`, started from the new checkout, would measure
    the new code in every host. The benchmarks check before measuring."""
    import importlib.util
    from types import SimpleNamespace

    from choreography_ray.bench import check_same_code

    check_same_code()  # the suite's workers import it from where the tests do
    find_spec = importlib.util.find_spec
    here = find_spec("choreography_ray").origin  # type: ignore[union-attr]
    elsewhere = SimpleNamespace(origin="/elsewhere/choreography_ray/__init__.py")
    monkeypatch.setattr(  # the driver's copy only: the workers look in their own processes
        importlib.util,
        "find_spec",
        lambda name, *rest: elsewhere if name == "choreography_ray" else find_spec(name, *rest),
    )
    with pytest.raises(ConfigurationError) as refused:
        check_same_code()
    assert f"Ray's workers import choreography_ray from {here}" in str(refused.value)
    assert "this driver from /elsewhere/choreography_ray/__init__.py" in str(refused.value)
