"""The pages as pure functions of what storage holds: the states a job can be in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from choreography_ray.console import job_list, pages
from choreography_ray.jobs.state import JobOwner, JobProgress, JobStageProgress, JobState
from choreography_ray.jobs.status import JobStatus, JobStepStatus
from choreography_ray.storage.protocols import StepCounts

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def job(**fields: object) -> JobState:
    values: dict[str, object] = {
        "id": "j1",
        "type": "rebuild-index",
        "status": JobStatus.RUNNING,
        "created": NOW - timedelta(minutes=5),
        "progress": JobProgress(
            total_steps=10,
            successful_steps=4,
            stages=[JobStageProgress(stage=0, is_started=True, total_steps=10, successful_steps=4)],
        ),
    }
    values.update(fields)
    return JobState.model_validate(values)


def render(state: JobState, counts: StepCounts | None = None) -> str:
    return pages.job_page(state, counts or StepCounts(), NOW, actions="")


def test_the_owner_host_its_activation_and_lease_are_shown():
    lease = NOW + timedelta(seconds=40)
    page = render(job(owner=JobOwner(host="controller-7", activation_epoch=3, lease_expires=lease)))
    assert "controller-7 (activation 3, lease until 2026-05-01 12:00:40 UTC)" in page
    assert "lease expired" not in page


def test_an_expired_lease_of_a_running_job_says_recovery_takes_it_over():
    lease = NOW - timedelta(seconds=1)
    page = render(job(owner=JobOwner(host="gone", activation_epoch=1, lease_expires=lease)))
    assert "(expired)" in page and "recovers it" in page


def test_a_drain_a_stop_under_way_and_unreadable_steps_are_stated():
    assert "draining" in render(job(pending_drain=True))
    assert "stop under way" in render(job(status=JobStatus.STOPPED))
    assert "stop finished" in render(job(status=JobStatus.STOPPED, stop_finalized=True))
    page = render(job(), StepCounts({JobStepStatus.RUNNING: 2}, unreadable=3))
    assert "3 step record(s) cannot be read" in page and "unreadable" in page


def test_a_job_waiting_for_a_worker_says_why_and_since_when():
    from types import SimpleNamespace

    from choreography_ray.cli.output import job_json
    from choreography_ray.console.reader import status_text

    waiting = job(status=JobStatus.STARTING_STEPS)
    wait = SimpleNamespace(reason="no worker host runs rebuild-index", since=NOW)
    object.__setattr__(waiting, "waiting_for_worker", wait)  # the field placement adds
    assert "waiting for a worker since 2026-05-01 12:00:00 UTC: no worker host runs" in render(
        waiting
    )
    assert status_text(waiting) == "STARTING_STEPS (waiting)"
    assert job_json(waiting)["waiting_for_worker"] == {
        "reason": "no worker host runs rebuild-index",
        "since": "2026-05-01T12:00:00Z",
    }
    assert job_json(job())["waiting_for_worker"] is None


def test_a_job_shows_its_plan_size_timing_and_stage_bars():
    page = render(job(has_stored_step_plan=True, stored_step_plan_incarnation=2))
    assert "10 steps, stored apart (incarnation 2)" in page
    assert "running for" in page and "5m 00s" in page
    assert 'aria-valuenow="4" aria-valuemax="10"' in page


def test_actions_are_disabled_where_the_state_makes_them_meaningless():
    def enabled(state: JobState, can_drain: bool = True) -> set[str]:
        form = pages.actions_form(state, enabled=True, can_drain=can_drain, token="t")
        return {a for a in ("stop", "drain", "resume", "remove") if f'value="{a}">' in form}

    assert enabled(job()) == {"stop", "drain", "remove"}
    assert enabled(job(), can_drain=False) == {"stop", "remove"}
    assert enabled(job(pending_drain=True)) == {"remove"}
    assert enabled(job(status=JobStatus.STOPPED)) == {"resume", "remove"}
    assert enabled(job(status=JobStatus.COMPLETED_SUCCESSFULLY)) == set()
    assert enabled(job(status=JobStatus.REMOVING)) == set()


def test_the_footer_says_whether_the_console_binds_to_loopback():
    from choreography_ray.console.html import footer

    assert "bound to the loopback interface (127.0.0.1:8266)" in footer("127.0.0.1:8266")
    assert "bound to the loopback interface" in footer("[::1]:8266")
    assert "beyond this machine" in footer("0.0.0.0:8266")


def test_a_quarantined_job_says_why_and_that_resume_takes_it_out():
    from choreography_ray.console.reader import JobFilter, Page
    from choreography_ray.jobs.state import Quarantine

    reason = "3 recoveries in a row did not complete; the last error: <b>boom</b>"
    lease = NOW - timedelta(seconds=1)
    poisoned = job(
        quarantine=Quarantine(reason=reason, attempts=3, since=NOW - timedelta(minutes=1)),
        owner=JobOwner(host="gone", activation_epoch=1, lease_expires=lease),
    )
    page = render(poisoned)
    assert '<span class="badge j-running">RUNNING (quarantined)</span>' in page
    assert "quarantined since 2026-05-01 11:59:00 UTC after 3 recovery attempts" in page
    assert "&lt;b&gt;boom&lt;/b&gt;; Resume takes it out of quarantine" in page  # escaped
    assert "recovers it" not in page  # the sweep leaves it alone, whatever its lease
    assert '<span class="badge j-running">RUNNING</span>' in render(job())
    listed = job_list.jobs_page(JobFilter(), Page([poisoned, job(id="j2")], 2, 0, 50), NOW)
    badge = '<td class="status"><span class="badge j-running">RUNNING{}</span></td>'
    assert badge.format(" (quarantined)") in listed
    assert badge.format("") in listed


def test_resume_is_offered_for_a_quarantined_job_whatever_its_status():
    from choreography_ray.jobs.state import Quarantine

    quarantine = Quarantine(reason="r", attempts=3, since=NOW)
    form = pages.actions_form(job(quarantine=quarantine), enabled=True, can_drain=True, token="t")
    assert 'value="resume">' in form and 'value="stop">' in form
    form = pages.actions_form(job(), enabled=True, can_drain=True, token="t")
    assert 'value="resume" disabled' in form


def test_a_jobs_adaptive_window_is_shown_live():
    from choreography_ray.cli.output import job_json
    from choreography_ray.jobs.state import WindowState

    adapting = job(adaptive_window=WindowState(window=37, limit=256, throttled=12))
    assert "window 37/256, throttled 12 times" in render(adapting)
    assert job_json(adapting)["adaptive_window"] == {"window": 37, "limit": 256, "throttled": 12}
    assert job_json(job())["adaptive_window"] is None
    assert job_json(job())["adaptive_windows"] == {}


def test_each_adaptive_step_class_shows_its_own_window():
    from choreography_ray.cli.output import job_json
    from choreography_ray.jobs.state import WindowState

    adapting = job(
        adaptive_windows={
            "partner-api": WindowState(window=37, limit=256, throttled=12),
            "geo-api": WindowState(window=8, limit=8),
        }
    )
    page = render(adapting)
    assert "adaptive partner-api: window 37/256, throttled 12 times" in page
    assert "adaptive geo-api: window 8/8, throttled 0 times" in page
    windows = job_json(adapting)["adaptive_windows"]
    assert windows["partner-api"] == {"window": 37, "limit": 256, "throttled": 12}
    # A record of an earlier version, with its one window only, is shown under no name.
    old = job(adaptive_window=WindowState(window=3, limit=32, throttled=5))
    assert "adaptive: window 3/32, throttled 5 times" in render(old)
    assert job_json(old)["adaptive_windows"] == {"": {"window": 3, "limit": 32, "throttled": 5}}


def test_a_job_waiting_for_its_concurrency_key_says_so():
    from choreography_ray.cli.output import job_json
    from choreography_ray.console.reader import status_text
    from choreography_ray.jobs.state import KeyWait

    waiting = job(concurrency_key="acme", waiting_for_key=KeyWait(key="acme", limit=2, since=NOW))
    assert "waiting: key acme at its limit 2 since 2026-05-01 12:00:00 UTC" in render(waiting)
    assert status_text(waiting) == "RUNNING (waiting)"
    assert job_json(waiting)["waiting_for_key"] == {
        "key": "acme",
        "limit": 2,
        "since": "2026-05-01T12:00:00Z",
    }
    stopped = waiting.model_copy(update={"status": JobStatus.STOPPED})
    assert status_text(stopped) == "STOPPED" and "waiting: key" not in render(stopped)
