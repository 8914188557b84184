"""Poison jobs: a job whose recovery never completes is quarantined after
`max_recovery_attempts` recoveries in a row, and nothing but an explicit resume takes it up.

A restart is `cluster.crash()` (every activation lost, nothing written) and a rehydration, as
a controller host that starts again does. A host that dies while it activates a job is a resume
hook raising `HostCrash`, a BaseException nothing in the engine catches: nothing after it runs
or writes, and the test then loses every process as the host's death would.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pytest

from choreography_ray.engine.messages import StepReport
from choreography_ray.engine.quarantine import RecoveryAttempts
from choreography_ray.jobs import (
    CannotResumeJobError,
    JobKey,
    JobQuarantinedError,
    JobsOptions,
    JobState,
    JobStatus,
    JobStepStatus,
    OwnedElsewhereError,
    ResumeJobFailed,
    ResumeJobSuccess,
    StatusChange,
    StorageUnavailableError,
)
from choreography_ray.recovery import RehydrationReport
from choreography_ray.storage.protocols import JobsStorage
from choreography_ray.testing import InProcessCluster, WriteFaults

from .fixtures import ScenarioJob, Script, request
from .test_ownership import host

LIMIT = 3


class HostCrash(BaseException):
    """The host process dies: no `except Exception` catches it, nothing after it runs."""


@dataclass
class Poison:
    mode: str = "raise"
    """What the resume hook does: "raise" an error, "crash" the host, or "" (it passes)."""
    calls: int = 0


POISON = Poison()


class PoisonJob(ScenarioJob, name="scenario.poison-job"):
    def on_before_resuming_job_steps(self) -> None:
        POISON.calls += 1
        if POISON.mode == "raise":
            raise RuntimeError("the resume hook broke")
        if POISON.mode == "crash":
            raise HostCrash()


@pytest.fixture(autouse=True)
def poison() -> Poison:
    POISON.mode, POISON.calls = "raise", 0
    return POISON


@pytest.fixture
def options() -> JobsOptions:
    return JobsOptions(max_parallel_steps=8, max_recovery_attempts=LIMIT)


async def start_blocked(
    cluster: InProcessCluster, script: Script, job_type: Any, *ids: str
) -> None:
    """Start one job per id, whose one step (keyed by the id) blocks until released."""
    for job_id in ids:
        script.behaviour[job_id].block = True
        result = await cluster.start(job_type, request(job_id), job_id=job_id)
        assert result.error is None, result
    await cluster.settle()


async def restart(cluster: InProcessCluster) -> RehydrationReport:
    """Every process lost, then the controller host starts again and rehydrates."""
    await cluster.crash()
    report = await (await cluster.manager().rehydrate())
    await cluster.settle()
    return report


async def stored(cluster: InProcessCluster, job_id: str) -> JobState:
    return await cluster.storage().jobs.get(job_id)


async def quarantine(cluster: InProcessCluster, script: Script, *ids: str) -> list[JobState]:
    """Poison jobs, recovered until recovery gave up on them."""
    await start_blocked(cluster, script, PoisonJob, *ids)
    for _ in range(LIMIT):
        assert sorted((await restart(cluster)).failed) == sorted(ids)
    report = await restart(cluster)
    assert sorted(report.quarantined) == sorted(ids), report
    return [await stored(cluster, job_id) for job_id in ids]


def test_a_job_whose_resume_fails_at_every_recovery_is_quarantined_after_the_limit(
    run, cluster, script, poison
):
    async def scenario():
        await start_blocked(cluster, script, PoisonJob, "poison")
        await start_blocked(cluster, script, ScenarioJob, "healthy")
        counted = []
        for _ in range(LIMIT):
            report = await restart(cluster)
            assert report.failed == ["poison"] and report.resumed == ["healthy"], report
            counted.append((await stored(cluster, "poison")).recovery_attempts)
        final = await restart(cluster)
        return counted, final, await stored(cluster, "poison")

    counted, final, state = run(scenario())
    assert counted == [1, 2, 3]  # each attempt stored before it ran
    assert final.quarantined == ["poison"]
    assert final.resumed == ["healthy"] and final.failed == []
    assert poison.calls == LIMIT  # the attempt past the limit ran nothing of the job
    assert state.status == JobStatus.RUNNING
    assert state.quarantine is not None
    assert state.quarantine.attempts == LIMIT
    assert state.quarantine.since == cluster.clock.now()
    assert "3 recoveries in a row did not complete" in state.quarantine.reason
    assert state.quarantine.reason.endswith(
        "the last error: the resume hook failed: the resume hook broke (RuntimeError)"
    )


def test_a_job_that_kills_its_host_while_activating_stops_taking_the_host_down(
    run, cluster, script, poison
):
    poison.mode = "crash"

    async def scenario():
        await start_blocked(cluster, script, PoisonJob, "poison")
        await start_blocked(cluster, script, ScenarioJob, "healthy")
        counted = []
        for _ in range(LIMIT):
            await cluster.crash()
            drain = await cluster.manager().rehydrate()
            with pytest.raises(HostCrash):
                await drain  # the host dies activating the job
            await cluster.settle()
            counted.append((await stored(cluster, "poison")).recovery_attempts)
        clean = await restart(cluster)  # this start gives up on the job and runs cleanly
        quarantined = await stored(cluster, "poison")
        again = await restart(cluster)
        untouched = await stored(cluster, "poison")
        script.release("healthy")
        return counted, clean, quarantined, again, untouched, await cluster.wait("healthy")

    counted, clean, quarantined, again, untouched, healthy = run(scenario())
    assert counted == [1, 2, 3]  # counted before the activation that killed the host
    assert clean.quarantined == ["poison"] and clean.resumed == ["healthy"]
    assert quarantined.quarantine is not None
    assert "its host may have died while activating it" in quarantined.quarantine.reason
    assert again.quarantined == ["poison"] and again.resumed == ["healthy"]
    assert untouched.version == quarantined.version  # the next start wrote nothing to it
    assert poison.calls == LIMIT
    assert healthy.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_a_recovery_that_completes_sets_the_count_back_to_zero(run, cluster, script, poison):
    async def scenario():
        await start_blocked(cluster, script, PoisonJob, "poison")
        for _ in range(LIMIT - 1):
            await restart(cluster)
        raised = await stored(cluster, "poison")
        poison.mode = ""
        recovered = await restart(cluster)
        reset = await stored(cluster, "poison")
        poison.mode = "raise"
        for _ in range(LIMIT - 1):
            await restart(cluster)
        again = await stored(cluster, "poison")
        poison.mode = ""
        last = await restart(cluster)
        script.release("poison")
        return raised, recovered, reset, again, last, await cluster.wait("poison")

    raised, recovered, reset, again, last, final = run(scenario())
    assert raised.recovery_attempts == LIMIT - 1 and raised.recovery_error
    assert recovered.resumed == ["poison"]
    assert (reset.recovery_attempts, reset.recovery_error) == (0, "")  # written at once
    assert again.recovery_attempts == LIMIT - 1 and again.quarantine is None
    assert last.resumed == ["poison"]
    assert final.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_a_quarantine_is_kept_through_restarts_and_a_resume_takes_the_job_out(
    run, cluster, script, poison
):
    async def scenario():
        [quarantined] = await quarantine(cluster, script, "poison")
        report = await restart(cluster)
        kept = await stored(cluster, "poison")
        poison.mode = ""
        answer = await cluster.manager().resume("poison")
        out = await stored(cluster, "poison")
        script.release("poison")
        return quarantined, report, kept, answer, out, await cluster.wait("poison")

    quarantined, report, kept, answer, out, final = run(scenario())
    assert report.quarantined == ["poison"] and report.resumed == report.failed == []
    assert kept.version == quarantined.version and kept.quarantine == quarantined.quarantine
    assert poison.calls == LIMIT + 1  # the failed recoveries, then the caller's resume
    assert answer == ResumeJobSuccess.SUCCESS
    assert out.quarantine is None
    assert (out.recovery_attempts, out.recovery_error) == (0, "")
    assert final.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_a_quarantined_job_held_by_a_live_activation_is_not_recovered_either(
    run, cluster, script, poison
):
    """Starting a job under its id again activates it (to answer what it is): recovery finds
    that activation idle, and still refuses the job before counting or writing anything."""

    async def scenario():
        [quarantined] = await quarantine(cluster, script, "poison")
        answer = await cluster.start(PoisonJob, request("poison"), job_id="poison")
        report = await (await cluster.manager().rehydrate())
        await cluster.settle()
        return quarantined, answer, report, await stored(cluster, "poison")

    quarantined, answer, report, after = run(scenario())
    assert answer.error is not None  # already prepared: nothing started
    assert report.quarantined == ["poison"] and report.resumed == []
    assert after.version == quarantined.version and after.quarantine == quarantined.quarantine
    assert poison.calls == LIMIT


class StubbornPoisonJob(PoisonJob, name="scenario.stubborn-poison-job"):
    can_resume = False


def test_a_resume_the_job_refuses_leaves_it_in_quarantine(run, cluster, script):
    """A job that allows no resume fails every recovery; a caller's resume is refused as
    before, and a refused resume changes nothing stored."""

    async def scenario():
        await start_blocked(cluster, script, StubbornPoisonJob, "stubborn")
        for _ in range(LIMIT + 1):
            report = await restart(cluster)
        quarantined = await stored(cluster, "stubborn")
        with pytest.raises(ResumeJobFailed) as refused:
            await cluster.manager().resume("stubborn")
        return report, quarantined, refused.value, await stored(cluster, "stubborn")

    report, quarantined, refused, after = run(scenario())
    assert report.quarantined == ["stubborn"]
    assert "the job does not allow resuming" in quarantined.quarantine.reason
    assert refused.code == CannotResumeJobError.JOB_CANNOT_BE_RESUMED
    assert after.version == quarantined.version and after.quarantine == quarantined.quarantine


def test_a_quarantined_job_can_be_stopped_and_removed(run, cluster, script):
    async def scenario():
        await quarantine(cluster, script, "to-stop", "to-remove")
        manager = cluster.manager()
        await manager.stop("to-stop")
        stopped = await cluster.wait("to-stop")
        await manager.remove("to-remove")
        return stopped, await cluster.wait("to-remove")

    stopped, removed = run(scenario())
    assert stopped.status == JobStatus.STOPPED and stopped.stop_finalized
    assert stopped.quarantine is not None  # a resume takes it out, as from any status
    assert removed is None  # cleared, with its steps


def test_a_report_for_a_quarantined_job_does_not_activate_it(run, cluster, script, caplog):
    async def scenario():
        [quarantined] = await quarantine(cluster, script, "poison")
        manager = cluster.manager()
        with pytest.raises(JobQuarantinedError) as refused:
            await manager.activate("poison", recovering=True)
        [step] = await cluster.storage().steps.get_for_job("poison")
        report = StepReport(step.id, JobStepStatus.COMPLETED_SUCCESSFULLY, 0, 1)
        with caplog.at_level(logging.WARNING):
            await cluster.report(JobKey(), "poison", [report])
            await cluster.settle()
        return quarantined, refused.value, manager.live("poison"), await stored(cluster, "poison")

    quarantined, refused, live, after = run(scenario())
    assert quarantined.quarantine is not None
    assert refused.job_id == "poison" and refused.reason == quarantined.quarantine.reason
    message = str(refused)
    assert "job 'poison' is quarantined: 3 recoveries in a row" in message
    assert "`choreography jobs resume poison` takes it out" in message and "\n" not in message
    assert live is None  # the report activated nothing
    assert after.version == quarantined.version
    assert "job poison could not be recovered now: job 'poison' is quarantined" in caplog.text


def test_reports_that_activate_a_poison_job_count_as_its_recoveries(run, cluster, script):
    async def scenario():
        await start_blocked(cluster, script, PoisonJob, "poison")
        [step] = await cluster.storage().steps.get_for_job("poison")
        report = StepReport(step.id, JobStepStatus.RUNNING, 0, 1)
        counted = []
        for _ in range(LIMIT + 1):
            await cluster.crash()  # the job's controller host is gone; its worker reports
            await cluster.report(JobKey(), "poison", [report])
            await cluster.settle()
            counted.append((await stored(cluster, "poison")).recovery_attempts)
        return counted, cluster.manager().live("poison"), await stored(cluster, "poison")

    counted, live, state = run(scenario())
    assert counted == [1, 2, 3, 3]
    assert live is None and state.quarantine is not None
    assert "the resume hook broke" in state.quarantine.reason


def test_the_sweep_leaves_a_quarantined_job_alone(run, cluster, script, caplog):
    async def scenario():
        [quarantined] = await quarantine(cluster, script, "poison")
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            swept = await cluster.manager().reconcile()
        return quarantined, swept, await stored(cluster, "poison")

    quarantined, swept, after = run(scenario())
    assert swept.queued == [] and swept.quarantined == []  # not even read again
    assert after.version == quarantined.version
    assert "job poison" not in caplog.text


def _faulty_writes_cluster() -> tuple[InProcessCluster, WriteFaults]:
    faults = WriteFaults()
    cluster = InProcessCluster(
        options=JobsOptions(max_parallel_steps=8, max_recovery_attempts=LIMIT),
        wrap_storage=faults.wrap,
    )
    return cluster, faults


def test_a_quarantined_job_a_storage_failure_let_go_is_not_tried_again(run, script, caplog):
    """An explicit stop of a quarantined job fails to write: its activation lets it go, and
    recovery after a storage failure finds the job quarantined and ends its attempts."""
    cluster, faults = _faulty_writes_cluster()

    async def scenario():
        async with cluster:
            await quarantine(cluster, script, "poison")
            faults.fail_at = {faults.writes + 1}  # the Stopped write
            with pytest.raises(Exception, match="injected failure"):
                await cluster.manager().stop("poison")
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                for _ in range(12):
                    await cluster.advance(60)
            return await stored(cluster, "poison")

    after = run(scenario())
    assert after.quarantine is not None and after.status == JobStatus.RUNNING
    assert "gave up recovering it" not in caplog.text
    assert "is not recovered" not in caplog.text


def test_a_quarantine_that_could_not_be_written_is_written_by_the_next_attempt(run, script):
    cluster, faults = _faulty_writes_cluster()

    async def scenario():
        async with cluster:
            await start_blocked(cluster, script, PoisonJob, "poison")
            for _ in range(LIMIT):
                await restart(cluster)
            await cluster.crash()
            faults.fail_at = {faults.writes + 1}  # the quarantine's write
            report = await (await cluster.manager().rehydrate())
            refused = await stored(cluster, "poison")
            await cluster.advance(60)  # recovery after the storage failure tries again
            return report, refused, await stored(cluster, "poison")

    report, refused, after = run(scenario())
    assert report.failed == ["poison"] and refused.quarantine is None
    assert after.quarantine is not None and after.quarantine.attempts == LIMIT
    assert POISON.calls == LIMIT


def test_a_resume_that_cannot_take_the_job_out_of_quarantine_does_not_run(run, script, poison):
    cluster, faults = _faulty_writes_cluster()

    async def scenario():
        async with cluster:
            [quarantined] = await quarantine(cluster, script, "poison")
            poison.mode = ""
            faults.fail_at = {faults.writes + 1}  # the write that takes it out
            with pytest.raises(StorageUnavailableError):
                await cluster.manager().resume("poison")
            await cluster.settle()
            return quarantined, await stored(cluster, "poison")

    quarantined, after = run(scenario())
    assert after.version == quarantined.version and after.quarantine is not None
    assert poison.calls == LIMIT  # the resume ran nothing of the job
    assert script.ran("poison") == 1


def test_a_stop_finished_by_recovery_sets_the_count_back_to_zero(run, cluster, script):
    async def scenario():
        await start_blocked(cluster, script, ScenarioJob, "job")
        await cluster.crash()
        state = await stored(cluster, "job")
        state.status = JobStatus.STOPPED  # as a host that died mid-stop left it
        state.status_changes = [
            *state.status_changes,
            StatusChange(status=int(JobStatus.STOPPED), occurred=cluster.clock.now()),
        ]
        await cluster.storage().jobs.save(state)
        report = await (await cluster.manager().rehydrate())
        return report, await cluster.wait("job")

    report, state = run(scenario())
    assert report.finished_stops == ["job"]
    assert state.status == JobStatus.STOPPED and state.stop_finalized
    assert state.recovery_attempts == 0


class FaultyJobs:
    """Job storage whose writes fail `left` times where `failing(stored, state)` says so:
    "outage" refuses them, "conflict" lets another writer store the record first."""

    def __init__(self, inner: Any, how: str, failing: Any) -> None:
        self._inner = inner
        self.how = how
        self.failing = failing
        self.left = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def save(self, state: JobState) -> int:
        if self.left:
            before = await self._inner.find(state.id)
            if before is not None and self.failing(before, state):
                self.left -= 1
                if self.how == "outage":
                    raise StorageUnavailableError("injected: the database went away")
                await self._inner.save(before)  # the version moves on under the writer
        return await self._inner.save(state)


def faulty_cluster(how: str, failing: Any) -> tuple[InProcessCluster, FaultyJobs]:
    made: list[FaultyJobs] = []

    def wrap(storage: JobsStorage) -> JobsStorage:
        made.append(FaultyJobs(storage.jobs, how, failing))
        return JobsStorage(key=storage.key, jobs=made[-1], steps=storage.steps, plans=storage.plans)

    cluster = InProcessCluster(
        options=JobsOptions(max_parallel_steps=8, max_recovery_attempts=LIMIT), wrap_storage=wrap
    )
    cluster.storage()
    return cluster, made[0]


def _status_write(before: JobState, state: JobState) -> bool:
    return len(state.status_changes) > len(before.status_changes)


def recover_through_faults(run, script, cluster: InProcessCluster, jobs: FaultyJobs) -> Any:
    """A job interrupted, then recovered while LIMIT + 1 of its writes fail (as `jobs` says):
    the rehydration's report, the job once recovery after the storage failure is done
    retrying, and the job once its step was let finish."""

    async def scenario():
        async with cluster:
            await start_blocked(cluster, script, ScenarioJob, "job")
            await cluster.crash()
            jobs.left = LIMIT + 1
            report = await (await cluster.manager().rehydrate())
            for _ in range(8):  # recovery after the storage failure tries again, backing off
                await cluster.advance(60)
            state = await stored(cluster, "job")
            script.release("job")
            return report, state, await cluster.wait("job")

    return run(scenario())


@pytest.mark.parametrize("how", ["outage", "conflict"])
def test_recoveries_that_storage_or_another_writer_ended_do_not_count(run, script, how):
    """Each recovery's count is stored, then its Running write fails: LIMIT + 1 times, which
    would quarantine the job were those attempts counted."""
    cluster, jobs = faulty_cluster(how, _status_write)
    report, state, final = recover_through_faults(run, script, cluster, jobs)
    assert report.failed == ["job"] and jobs.left == 0
    assert state.quarantine is None
    assert (state.recovery_attempts, state.recovery_error) == (0, "")
    assert final.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert script.ran("job") == 2


def test_recoveries_that_completed_but_could_not_store_their_reset_do_not_count(run, script):
    """Each recovery resumes the job, then the write that sets its count back to 0 fails and
    lets the job go: LIMIT + 1 times, which would quarantine it were those attempts counted."""
    cluster, jobs = faulty_cluster(
        "outage", lambda before, state: before.recovery_attempts and not state.recovery_attempts
    )
    report, state, final = recover_through_faults(run, script, cluster, jobs)
    assert report.resumed == ["job"] and jobs.left == 0
    assert state.quarantine is None and state.recovery_attempts == 0
    assert final.status == JobStatus.COMPLETED_SUCCESSFULLY


def test_the_memory_of_uncounted_attempts_stays_bounded(run):
    class Failing:
        id = ""
        released = True
        release_reason = "storage went away"

        async def count_recovery(self) -> None: ...

        async def recovery_failed(self, error: BaseException) -> None: ...

        def let_go(self, reason: str) -> None: ...

    async def down() -> None:
        raise StorageUnavailableError("down")

    async def scenario():
        attempts = RecoveryAttempts()
        for n in range(RecoveryAttempts.KEPT + 5):
            failing = Failing()
            failing.id = f"job-{n}"
            with pytest.raises(StorageUnavailableError):
                await attempts.run(failing, down)
        return attempts

    attempts = run(scenario())
    assert 0 < len(attempts._uncounted) <= RecoveryAttempts.KEPT


def test_a_recovery_whose_count_cannot_be_stored_does_not_begin(run, script):
    cluster, jobs = faulty_cluster(
        "outage", lambda before, state: state.recovery_attempts > before.recovery_attempts
    )

    async def scenario():
        async with cluster:
            await start_blocked(cluster, script, ScenarioJob, "job")
            await cluster.crash()
            jobs.left = 1
            report = await (await cluster.manager().rehydrate())
            await cluster.settle()
            hooks, ran = script.hooks.count("on_before_resuming_job_steps"), script.ran("job")
            refused = await stored(cluster, "job")
            await cluster.advance(60)  # recovery after the storage failure tries again
            script.release("job")
            return report, hooks, ran, refused, await cluster.wait("job")

    report, hooks, ran, refused, final = run(scenario())
    assert report.failed == ["job"]
    assert (hooks, ran) == (0, 1)  # nothing of the job ran: the attempt never began
    assert refused.recovery_attempts == 0 and refused.status == JobStatus.RUNNING
    assert final.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert script.ran("job") == 2


def test_a_job_another_live_host_owns_is_not_counted(run, cluster, script):
    alive = {"host-a", "host-b"}
    first, second = host(cluster, "host-a", alive), host(cluster, "host-b", alive)

    async def scenario():
        script.behaviour["a"].block = True
        result = await first.start(ScenarioJob, request("a"))
        await cluster.settle()
        report = await (await second.rehydrate())
        with pytest.raises(OwnedElsewhereError):
            await second.resume(result.job_id)
        return result.job_id, report, await stored(cluster, result.job_id)

    job_id, report, state = run(scenario())
    assert report.skipped == [job_id]
    assert state.recovery_attempts == 0 and state.owner.host == "host-a"


class _Yielding:
    """Storage whose reads take loop turns, as a real store's do: reports that arrive
    together all find the job not yet activated and wait for the same activation, and its
    resume's dispatch waits on a worker outside the job's turn."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if name not in ("find", "get_many", "get_all_for_job"):
            return method

        async def slow(*args: Any, **kwargs: Any) -> Any:
            import asyncio

            for _ in range(3):
                await asyncio.sleep(0)
            return await method(*args, **kwargs)

        return slow


def test_reports_arriving_together_for_a_job_whose_owner_died_count_one_recovery(run, script):
    """The fault matrix's owning controller removed: dozens of report batches reach the
    survivor at once. They share one activation, and join its one recovery: counting each
    as an attempt quarantined a healthy job within milliseconds."""

    def yielding(storage: JobsStorage) -> JobsStorage:
        return JobsStorage(
            key=storage.key,
            jobs=_Yielding(storage.jobs),
            steps=_Yielding(storage.steps),
            plans=storage.plans,
        )

    async def scenario():
        import asyncio

        options = JobsOptions(max_parallel_steps=8, max_recovery_attempts=LIMIT)
        async with InProcessCluster(options=options, wrap_storage=yielding) as cluster:
            POISON.mode = ""
            await start_blocked(cluster, script, PoisonJob, "healthy")
            [step] = await cluster.storage().steps.get_for_job("healthy")
            stale = StepReport(step.id, JobStepStatus.COMPLETED_SUCCESSFULLY, 0, 1)
            await cluster.crash()
            manager = cluster.manager()
            await asyncio.gather(*(manager.deliver("healthy", [stale]) for _ in range(LIMIT * 4)))
            return await stored(cluster, "healthy"), POISON.calls

    state, resumes = run(scenario())
    assert state.quarantine is None
    assert state.recovery_attempts == 0  # one recovery, counted once and completed
    assert resumes == 1  # one resume, not one per report


def test_an_activation_whose_steps_were_never_read_counts_and_completes_nothing(
    run, cluster, script
):
    """A running job activated from storage but not recovered yet (its recovery is under way
    elsewhere in the host, or failed) knows none of its steps: a report, a lost host or a
    joined one must not count an outcome into it nor complete it (a job was seen completed
    with 550 of 1,500 successes that way)."""

    async def scenario():
        await start_blocked(cluster, script, ScenarioJob, "a")
        [step] = await cluster.storage().steps.get_for_job("a")
        before = await stored(cluster, "a")
        await cluster.crash()
        activation = await cluster.manager().activate("a")
        activation.deliver([StepReport(step.id, JobStepStatus.COMPLETED_SUCCESSFULLY, 1, 1)])
        await cluster.settle()
        await activation.hosts_lost(frozenset({"worker-0"}))
        await activation.workers_joined(frozenset({"worker-9"}))
        return before, await stored(cluster, "a"), activation.state

    before, after, held = run(scenario())
    assert after.status == JobStatus.RUNNING and held.status == JobStatus.RUNNING
    assert after.progress == before.progress == held.progress


def test_a_recovery_that_fails_lets_the_job_go_so_the_next_one_tries_again(run, cluster, script):
    async def scenario():
        await start_blocked(cluster, script, PoisonJob, "poison")
        report = await restart(cluster)
        return report, cluster.manager().live("poison")

    report, live = run(scenario())
    assert report.failed == ["poison"]
    assert live is None  # not an idle activation that nothing would ever recover again
