"""What makes the console an operator's live view, as pure functions of stored records: the
job's pace and chart from its progress history, its failed steps first, a step's own page,
the history as events, badges, and the filters of the jobs and steps pages."""

from __future__ import annotations

import html
import itertools
import re
from datetime import UTC, datetime, timedelta

from choreography_ray.console import job_list, pages, step_pages
from choreography_ray.console.pace import pace, pace_text
from choreography_ray.console.reader import JobFilter, Page, StepListing
from choreography_ray.jobs.history import PROGRESS_EVERY, PROGRESS_POINTS, noted
from choreography_ray.jobs.registry import Payload
from choreography_ray.jobs.state import (
    JobOwner,
    JobProgress,
    JobStageProgress,
    JobState,
    JobStepState,
    Quarantine,
    StatusChange,
    StepError,
    StepLease,
)
from choreography_ray.jobs.status import JobStatus, JobStepStatus
from choreography_ray.storage import JobOrder, StepOrder, StepQuery
from choreography_ray.storage.protocols import StepCounts

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def job(**fields: object) -> JobState:
    values: dict[str, object] = {
        "id": "reindex",
        "type": "rebuild-index",
        "status": JobStatus.RUNNING,
        "created": NOW - timedelta(minutes=10),
        "progress": JobProgress(total_steps=1000, successful_steps=590, failed_steps=10),
        "progress_history": [(0, 0), (480, 400), (540, 500)],
    }
    values.update(fields)
    return JobState.model_validate(values)


def step(step_id: str, status: JobStepStatus, **fields: object) -> JobStepState:
    values: dict[str, object] = {"id": step_id, "job_id": "reindex", "type": "shard"}
    values.update(fields)
    values["status"] = status
    return JobStepState.model_validate(values)


def text(page: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", page).split())


def test_the_pace_is_the_rate_over_the_last_minute_and_the_time_left_at_it():
    # 600 done now, 10 minutes in; 500 a minute ago: 100 steps in 60 s, 400 to go.
    measured = pace(job(), NOW)
    assert measured.rate is not None and abs(measured.rate - 100 / 60) < 1e-9
    assert measured.eta is not None and abs(measured.eta - 240) < 1e-6
    assert pace_text(job(), NOW) == "1.7 steps/s over the last minute, about 4m 00s left"


def test_a_job_that_stalled_says_so_and_a_new_one_is_not_measured_yet():
    stalled = job(progress_history=[(0, 0), (540, 600)])
    assert pace_text(stalled, NOW) == (
        "0.0 steps/s over the last minute: no step finished in that minute"
    )
    fresh = job(created=NOW, progress_history=[])
    assert pace_text(fresh, NOW) == "not measured yet"


def test_the_chart_draws_the_history_to_the_job_s_figure_now():
    page = pages.job_page(job(), StepCounts(), NOW, actions="")
    assert '<svg class="chart" role="img"' in page
    assert "progress over time: 600 of 1000 steps after 10m 00s" in page
    assert "1.7 steps/s over the last minute, about 4m 00s left" in page


def test_the_history_a_job_keeps_is_bounded_and_dense_at_its_end():
    history: list[tuple[int, int]] = []
    for n in range(500):
        history = noted(history, n * 5, n)  # a write every 5 s: a point every 10 s
    assert len(history) <= PROGRESS_POINTS
    assert history[0] == (0, 0) and history[-1] == (2490, 498)
    recent = [at for at, _ in history[-PROGRESS_POINTS // 3 :]]
    assert all(b - a == PROGRESS_EVERY for a, b in itertools.pairwise(recent))
    assert noted(history, 2495, 499) is history  # too soon for another point


def test_a_job_s_failed_steps_come_first_with_their_errors_and_links():
    failed = StepListing(
        [
            step(
                "shard-07",
                JobStepStatus.COMPLETED_WITH_FAILURE,
                attempt=3,
                error=StepError(messages=["disk <full>"], stack_trace="Traceback …"),
            )
        ],
        12,
        None,
    )
    failures = step_pages.failed_steps(job(), failed)
    page = pages.job_page(job(), StepCounts(), NOW, actions="", failures=failures)
    assert page.index("Failed steps (12)") < page.index('class="facts"')
    assert "disk &lt;full&gt;" in page and "<summary>stack trace</summary>" in page
    assert 'href="/jobs/reindex/steps/shard-07?scope=default&amp;namespace=default"' in page
    assert "all 12 failed steps →" in page
    assert step_pages.failed_steps(job(), StepListing([], 0, None)) == ""


def test_a_step_page_shows_its_attempt_error_checkpoint_lease_and_node():
    running = step(
        "shard-07",
        JobStepStatus.RUNNING,
        attempt=2,
        position=7,
        stage=1,
        state=Payload(type="shard-state", data={"done": 41}),
        lease=StepLease(
            node="node-a1", activation="act-9", heartbeat=NOW - timedelta(seconds=3), host="w1"
        ),
        error=StepError(messages=["timed out"], stack_trace="Traceback (most recent call last)"),
        status_changes=[
            StatusChange(status=int(JobStepStatus.RUNNING), occurred=NOW - timedelta(minutes=1))
        ],
    )
    shown = html.unescape(text(step_pages.step_page(job(), running, NOW)))
    assert "RUNNING" in shown and "2 (generation 0)" in shown and "1 (place 7 in the plan)" in shown
    assert "host w1 on node node-a1 , activation act-9" in shown and "(3s ago)" in shown
    assert "timed out" in shown and '"done":41' in shown


def test_the_history_tells_recoveries_resumes_stops_and_quarantine():
    at = [NOW - timedelta(minutes=m) for m in (9, 8, 7, 6, 5, 4)]
    changes = [
        StatusChange(status=int(JobStatus.PREPARING_JOB), occurred=at[0], host="c1"),
        StatusChange(status=int(JobStatus.RUNNING), occurred=at[1], host="c1"),
        StatusChange(status=int(JobStatus.RUNNING), occurred=at[2], host="c2"),
        StatusChange(status=int(JobStatus.STOPPED), occurred=at[3], host="c2"),
        StatusChange(status=int(JobStatus.RUNNING), occurred=at[4], host="c2"),
        StatusChange(status=int(JobStatus.RUNNING), occurred=at[5], host="c2"),
    ]
    quarantine = Quarantine(reason="host died thrice", attempts=3, since=NOW)
    shown = text(pages.history_rows(job(status_changes=changes, quarantine=quarantine)))
    assert "recovered on c2: the owner changed from c1" in shown
    assert "stopped" in shown and "resumed" in shown
    assert "resumed by a new activation after an interruption" in shown
    assert shown.endswith("quarantined after 3 recovery attempts in a row host died thrice")


def test_finished_stages_say_so_and_a_finished_job_s_lease_is_not_expired():
    done = job(
        status=JobStatus.COMPLETED_SUCCESSFULLY,
        status_changes=[StatusChange(status=int(JobStatus.COMPLETED_SUCCESSFULLY), occurred=NOW)],
        progress=JobProgress(
            total_steps=2,
            successful_steps=2,
            stages=[JobStageProgress(stage=0, is_started=True, total_steps=2, successful_steps=2)],
        ),
        owner=JobOwner(host="c1", lease_expires=NOW - timedelta(hours=1)),
    )
    page = pages.job_page(done, StepCounts(), NOW, actions="")
    assert "<td>0</td><td>finished</td>" in page
    assert "(expired)" not in page


def test_status_badges_carry_their_status_as_text():
    prepared = '<span class="badge s-prepared">PREPARED</span>'
    assert step_pages.step_badge(JobStepStatus.UNKNOWN) == prepared
    assert ">FAILED<" in step_pages.step_badge(JobStepStatus.FAILED)


def test_the_steps_filter_offers_each_status_once_and_keeps_the_query():
    query = StepQuery(id_prefix="shard-0", stage=1, order=StepOrder.CHANGED, take=25)
    form = step_pages.steps_filters(job(), query)
    values = re.findall(r'<option value="([^"]*)"', form)
    assert len(values) == len(set(values)) and "failed" in values and "prepared" in values
    assert 'name="prefix" value="shard-0"' in form and 'name="stage" value="1"' in form
    assert '<option value="changed" selected>' in form


def test_the_jobs_page_keeps_its_search_range_and_order_in_its_links():
    wanted = JobFilter(
        id_prefix="3f2a",
        created_after=NOW - timedelta(days=1),
        created_before=NOW,
        changed_after=NOW - timedelta(hours=2),
        sort=JobOrder.CHANGED,
        descending=False,
    )
    page = job_list.jobs_page(wanted, Page([job()], 60, 0, 50), NOW)
    assert "id=3f2a" in page and "from=2026-04-30T12%3A00" in page
    assert "changed_from=2026-05-01T10%3A00" in page
    next_page = re.search(r'<a rel="next" href="([^"]+)"', page)
    assert next_page and "sort=changed&amp;dir=asc&amp;page=1" in next_page.group(1)
    assert '<th aria-sort="ascending">' in page and "newer →" in page
    form = job_list.jobs_filters(wanted)
    assert 'name="id" value="3f2a"' in form and 'value="2026-04-30T12:00"' in form
    assert 'name="changed_from" type="datetime-local" value="2026-05-01T10:00"' in form
    assert 'name="sort" value="changed"' in form and 'name="dir" value="asc"' in form


def test_the_cluster_page_shows_cpu_memory_labels_rates_and_dashboard_links():
    from choreography_ray.console.ports import ClusterSnapshot, HostView, NodeView

    worker = HostView(
        "choreography_worker:n1",
        "worker",
        active_runs=3,
        max_parallel_steps=8,
        steps_per_second=12.5,
        logs_url="http://127.0.0.1:8265/#/actors/abc",
    )
    controller = HostView("choreography_controller:n1", "controller", live_jobs=2)
    node = NodeView(
        node_id="n1" * 10,
        address="10.0.0.5",
        hostname="head",
        alive=True,
        controller=True,
        worker=True,
        cpus=4,
        hosts=[controller, worker],
        memory_bytes=8 * 2**30,
        labels={"zone": "eu-1"},
        logs_url="http://127.0.0.1:8265/#/cluster/nodes/n1",
    )
    page = pages.cluster_page(ClusterSnapshot([node], ["m"], ["t"], "ns"), "sqlite://")
    shown = text(page)
    assert "8.0 GiB" in shown and "zone=eu-1" in shown and ">4<" in page
    assert "2 live job activations" in shown
    assert "3 running steps, at most 8 at once, 12.5 steps/s" in shown
    assert 'href="http://127.0.0.1:8265/#/actors/abc">logs</a>' in page
    assert 'href="http://127.0.0.1:8265/#/cluster/nodes/n1"' in page
    bare = NodeView("n2", "10.0.0.6", "w", True, False, True, 2)
    page = pages.cluster_page(ClusterSnapshot([bare], [], [], "ns"), "sqlite://")
    assert "logs" not in text(page) and "dashboard" not in page  # none reachable: no link


def test_a_host_s_step_rate_is_measured_between_two_askings():
    from choreography_ray.console.ports import StepRates

    rates = StepRates()
    assert rates.rate("w1", 100.0, 40) is None  # nothing to measure from yet
    assert rates.rate("w1", 102.0, 70) == 15.0
    assert rates.rate("w1", 103.0, 5) is None  # the host restarted: its count went back
    assert rates.rate("w1", 105.0, 11) == 3.0
