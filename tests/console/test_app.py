"""The console over HTTP, against an in-process cluster: pages, filters, paging, escaping,
and actions behind --allow-actions and the form token."""

from __future__ import annotations

import html
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

import choreography_ray as cr
from choreography_ray.jobs import JobState, JobStatus

from ..engine import fixtures
from ..engine.fixtures import ScenarioJob, request
from .harness import ConsoleHarness


@pytest.fixture
def console() -> Iterator[ConsoleHarness]:
    with ConsoleHarness() as harness:
        yield harness


def get(harness: ConsoleHarness, target: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(harness.url + target, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def post(harness: ConsoleHarness, target: str, form: dict[str, str]) -> tuple[int, str]:
    opener = urllib.request.build_opener(_NoRedirect)
    data = urllib.parse.urlencode(form).encode()
    try:
        with opener.open(harness.url + target, data=data, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Location", "") or error.read().decode()


def token_of(page: str) -> str:
    match = re.search(r'name="token" value="([^"]+)"', page)
    assert match, "the page has no action form"
    return match.group(1)


def start(harness: ConsoleHarness, *keys: str, job_id: str | None = None) -> str:
    result = harness.run(harness.cluster.start(ScenarioJob, request(*keys), job_id=job_id))
    assert result.succeeded, result
    harness.run(harness.cluster.settle())
    return result.job_id


def job_ids_in(page: str) -> list[str]:
    return re.findall(r'<tr data-job="([^"]+)">', page)


def test_jobs_are_listed_newest_first_in_pages(console):
    for n in range(5):
        start(console, "a", job_id=f"job-{n}")
    status, first = get(console, "/jobs?size=2")
    assert status == 200
    assert job_ids_in(first) == ["job-4", "job-3"]
    assert "page 1 of 3 (5 in all)" in first and 'rel="next"' in first
    assert 'rel="prev"' not in first
    _, last = get(console, "/jobs?size=2&page=2")
    assert job_ids_in(last) == ["job-0"]
    assert 'rel="next"' not in last and 'rel="prev"' in last


def test_jobs_are_filtered_by_status_type_and_partition(console):
    fixtures.SCRIPT.behaviour["slow"].block = True
    running = start(console, "slow", job_id="running-job")
    start(console, "a", job_id="done-job")
    _, page = get(console, "/jobs?status=running")
    assert job_ids_in(page) == [running]
    _, page = get(console, "/jobs?status=completed-successfully&type=scenario.job")
    assert job_ids_in(page) == ["done-job"]
    _, page = get(console, "/jobs?type=no.such.type")
    assert job_ids_in(page) == [] and "no jobs" in page
    _, page = get(console, "/jobs?scope=elsewhere")
    assert job_ids_in(page) == []
    fixtures.SCRIPT.release("slow")  # the in-process cluster's run ends as the test does


def test_jobs_sort_by_any_column_both_ways_and_filter_by_last_change(console):
    """Sorting is storage's, so it holds across pages; the sorted column's header turns it."""
    base = datetime(2026, 5, 1, 12, tzinfo=UTC)
    jobs = console.cluster.storage().jobs
    for job_id, created, changed, status in [
        ("b-job", 0, 30, JobStatus.COMPLETED_SUCCESSFULLY),
        ("a-job", 10, 20, JobStatus.FAILED),
        ("c-job", 20, 25, JobStatus.STOPPED),
    ]:
        at = base + timedelta(minutes=created)
        state = JobState(
            id=job_id,
            type="scenario.job",
            status=status,
            stop_finalized=True,
            created=at,
            changed=base + timedelta(minutes=changed),
        )
        console.run(jobs.save(state))

    def ids(target: str) -> list[str]:
        status, page = get(console, target)
        assert status == 200, page
        return job_ids_in(page)

    assert ids("/jobs") == ["c-job", "a-job", "b-job"]  # newest first
    assert ids("/jobs?sort=changed") == ["b-job", "c-job", "a-job"]
    assert ids("/jobs?sort=changed&dir=asc") == ["a-job", "c-job", "b-job"]
    assert ids("/jobs?sort=status&dir=asc") == ["b-job", "c-job", "a-job"]
    assert ids("/jobs?changed_from=2026-05-01T12:25") == ["c-job", "b-job"]
    assert ids("/jobs?changed_to=2026-05-01T12:25&changed_from=2026-05-01") == ["a-job"]
    assert ids("/jobs?order=oldest") == ["b-job", "a-job", "c-job"]  # links of before
    _, first = get(console, "/jobs?sort=id&dir=asc&size=2")
    assert job_ids_in(first) == ["a-job", "b-job"]
    following = re.search(r'rel="next" href="([^"]+)"', first)
    assert following and ids(html.unescape(following.group(1))) == ["c-job"]
    turned = re.search(r'<th aria-sort="ascending"><a href="([^"]+)"', first)
    assert turned and ids(html.unescape(turned.group(1))) == ["c-job", "b-job"]  # size kept
    by_change = re.search(r'<a href="([^"]+)" title="sort by last change', first)
    assert by_change and ids(html.unescape(by_change.group(1))) == ["b-job", "c-job"]


def test_partitions_with_unfinished_jobs_are_linked(console):
    from choreography_ray.jobs.state import JobKey

    fixtures.SCRIPT.behaviour["slow"].block = True
    result = console.run(
        console.cluster.start(
            ScenarioJob, request("slow"), key=JobKey(scope="studio", namespace="<tenant>")
        )
    )
    console.run(console.cluster.settle())
    _, page = get(console, "/jobs")
    assert (
        '<a href="/jobs?scope=studio&amp;namespace=%3Ctenant%3E">studio/&lt;tenant&gt;</a>' in page
    )
    _, page = get(console, "/jobs?scope=studio&namespace=%3Ctenant%3E")
    assert job_ids_in(page) == [result.job_id]
    fixtures.SCRIPT.release("slow")


@pytest.mark.parametrize(
    ("target", "code", "message"),
    [
        ("/jobs?status=bogus", 400, "unknown status &#x27;bogus&#x27;"),
        ("/jobs?page=x", 400, "page must be a whole number"),
        ("/jobs?page=-1", 400, "page must be 0 or more"),
        ("/jobs?size=100000", 400, "page size must be between 1 and 500"),
        ("/jobs?scope=%20", 400, "scope"),
        ("/jobs?sort=age", 400, "sort must be one of created, changed, id, status"),
        ("/jobs?dir=up", 400, "dir must be asc or desc"),
        ("/jobs?changed_from=yesterday", 400, "changed_from must be a date"),
        ("/jobs/no-such-job", 404, "no job with id &#x27;no-such-job&#x27;"),
        ("/jobs/no-such-job/steps", 404, "no job with id"),
        ("/jobs/j/steps?after=zzz", 400, "is not a page cursor"),
        ("/jobs/j/steps?order=sideways", 400, "sideways"),
        ("/jobs/j/steps?stage=x", 400, "stage must be a whole number"),
        ("/jobs/j/steps?status=bogus", 400, "unknown step status"),
    ],
)
def test_bad_input_is_a_one_line_error_page(console, target, code, message):
    status, page = get(console, target)
    assert status == code
    assert message in page
    assert "Traceback" not in page


def test_a_job_page_shows_stages_counts_history_and_owner(console):
    fixtures.SCRIPT.behaviour["b"].block = True
    job_id = start(console, "a", "b", job_id="two-steps")
    status, page = get(console, f"/jobs/{job_id}")
    assert status == 200
    assert '<span class="badge j-running">RUNNING</span>' in page
    assert 'aria-valuenow="1" aria-valuemax="2"' in page  # one of two steps done
    assert "completed_successfully" in page and "running" in page  # step counts
    assert "owner host" in page
    assert "PREPARING_JOB" in page  # the status history
    assert 'data-live="1"' in page  # refreshed while it runs
    fixtures.SCRIPT.release("b")
    console.run(console.cluster.settle())
    _, page = get(console, f"/jobs/{job_id}")
    assert 'data-live="0"' in page and "COMPLETED_SUCCESSFULLY" in page


def test_a_failed_steps_error_and_stack_trace_are_shown(console):
    fixtures.SCRIPT.behaviour["bad"].raise_error = True
    fixtures.SCRIPT.retry = False
    job_id = start(console, "good", "bad")
    _, page = get(console, f"/jobs/{job_id}/steps?status=failed")
    assert "step bad broke" in page
    assert "RuntimeError" in page and "<summary>stack trace</summary>" in page
    assert 'data-step="' in page and "good" not in re.sub(r"<[^>]+>", " ", page).split()


def test_a_steps_page_refreshes_itself_while_its_job_runs(console):
    fixtures.SCRIPT.behaviour["k2"].block = True
    job_id = start(console, "k0", "k1", "k2")
    _, page = get(console, f"/jobs/{job_id}/steps")
    assert 'data-live="1"' in page  # one index range per refresh, however large the job
    fixtures.SCRIPT.release("k2")
    console.run(console.cluster.wait(job_id))
    _, page = get(console, f"/jobs/{job_id}/steps")
    assert 'data-live="0"' in page


def _next_page(page: str) -> str | None:
    match = re.search(r'rel="next" href="([^"]+)"', page)
    return html.unescape(match.group(1)) if match else None


def test_steps_are_paged_by_cursor_in_plan_order(console):
    keys = [f"k{n:02d}" for n in range(7)]
    job_id = start(console, *keys)
    pages = [get(console, f"/jobs/{job_id}/steps?size=3")[1]]
    while (target := _next_page(pages[-1])) is not None:
        assert "after=" in target
        pages.append(get(console, target)[1])
        assert len(pages) < 5
    assert [page.count("<tr data-step=") for page in pages] == [3, 3, 1]
    assert all("7 matching steps" in page for page in pages)
    listed = [re.findall(r'data-step="([^"]+)"', page) for page in pages]
    steps = console.run(console.cluster.storage().steps.get_for_job(job_id))
    in_plan = [s.id for s in sorted(steps, key=lambda s: (s.stage, s.position, s.id))]
    assert [i for page in listed for i in page] == in_plan


def test_steps_are_found_by_id_prefix_and_sorted_by_last_change(console):
    job_id = start(console, "alpha", "beta", "gamma")
    steps = console.run(console.cluster.storage().steps.get_for_job(job_id))
    wanted = steps[1].id
    _, page = get(console, f"/jobs/{job_id}/steps?prefix={wanted[:-2]}")
    assert re.findall(r'data-step="([^"]+)"', page) == [wanted]
    _, page = get(console, f"/jobs/{job_id}/steps?order=changed")
    newest_first = sorted(steps, key=lambda s: (s.last_change, s.id), reverse=True)
    assert re.findall(r'data-step="([^"]+)"', page) == [s.id for s in newest_first]
    assert 'title="sort by stage"' in page  # the other order is a link


def test_user_text_is_escaped(console):
    # The client refuses an id with a '/' now; one stored before is still shown, escaped.
    started = console.cluster.manager().start(
        ScenarioJob, request("<script>alert(1)</script>"), job_id="<b>job</b>"
    )
    job_id = console.run(started).job_id
    console.run(console.cluster.settle())
    for target in ("/jobs", f"/jobs/{urllib.parse.quote(job_id, safe='')}"):
        _, page = get(console, target)
        assert "<b>job</b>" not in page and "&lt;b&gt;job&lt;/b&gt;" in page
        assert "<script>alert(1)" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the request, as text


def test_a_live_page_answers_its_changing_part_alone(console):
    start(console, "a")
    _, part = get(console, "/jobs?fragment=1")
    assert part.startswith('<main id="main"') and part.endswith("</main>")
    assert "<footer>" not in part


def test_actions_need_the_form_token(console):
    fixtures.SCRIPT.behaviour["slow"].block = True
    job_id = start(console, "slow")
    status, _ = post(console, f"/jobs/{job_id}/stop", {"token": "forged"})
    assert status == 403
    status, _ = post(console, f"/jobs/{job_id}/stop", {})
    assert status == 403
    console.run(console.cluster.settle())
    assert console.run(console.cluster.manager().get(job_id)).status == JobStatus.RUNNING

    _, page = get(console, f"/jobs/{job_id}")
    status, location = post(console, f"/jobs/{job_id}/stop", {"token": token_of(page)})
    assert status == 303 and "done=stop" in location
    console.run(console.cluster.settle())
    assert console.run(console.cluster.manager().get(job_id)).status == JobStatus.STOPPED


def test_buttons_of_meaningless_actions_are_disabled():
    with ConsoleHarness() as console:
        job_id = start(console, "a")
        _, page = get(console, f"/jobs/{job_id}")
    buttons = dict(
        re.findall(r'<button type="submit" name="action" value="([\w-]+)"([^>]*)>', page)
    )
    assert set(buttons) == {"stop", "drain", "resume", "retry-failed", "remove"}
    assert all("disabled" in attributes for attributes in buttons.values())  # completed


def test_retry_failed_runs_a_finished_jobs_failed_steps_again(console):
    fixtures.SCRIPT.behaviour["bad"].fail = True
    fixtures.SCRIPT.retry = False
    job_id = start(console, "good", "bad")
    _, page = get(console, f"/jobs/{job_id}")
    button = re.search(r'<button type="submit" name="action" value="retry-failed"([^>]*)>', page)
    assert button is not None and "disabled" not in button.group(1)
    fixtures.SCRIPT.behaviour["bad"].fail = False
    status, location = post(console, f"/jobs/{job_id}/retry-failed", {"token": token_of(page)})
    assert status == 303 and "done=retry-failed" in location
    console.run(console.cluster.settle())
    state = console.run(console.cluster.manager().get(job_id))
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert (state.progress.successful_steps, state.progress.failed_steps) == (2, 0)
    _, page = get(console, f"/jobs/{job_id}")  # nothing failed now: the button is off
    button = re.search(r'<button type="submit" name="action" value="retry-failed"([^>]*)>', page)
    assert button is not None and "disabled" in button.group(1)


def test_the_job_page_and_the_listing_show_a_job_waiting_for_its_key(console):
    fixtures.SCRIPT.behaviour["t1"].block = True
    fixtures.SCRIPT.behaviour["t2"].block = True
    for key in ("t1", "t2"):
        console.run(console.cluster.start(fixtures.TenantJob, fixtures.tenant("acme", key)))
    waiting = console.run(console.cluster.start(fixtures.TenantJob, fixtures.tenant("acme", "t3")))
    console.run(console.cluster.settle())
    _, page = get(console, f"/jobs/{waiting.job_id}")
    assert "waiting: key acme at its limit 2 since" in page
    _, listing = get(console, "/jobs")
    assert "RUNNING (waiting)" in listing
    fixtures.SCRIPT.release("t1", "t2")


def test_the_job_page_shows_the_jobs_priority(console):
    result = console.run(console.cluster.start(ScenarioJob, request("a"), priority=7))
    console.run(console.cluster.settle())
    _, page = get(console, f"/jobs/{result.job_id}")
    assert re.search(r"<t[hd]>priority</t[hd]>\s*<td>7</td>", page)


def test_a_read_only_console_offers_and_accepts_no_action():
    with ConsoleHarness(allow_actions=False) as console:
        fixtures.SCRIPT.behaviour["slow"].block = True
        job_id = start(console, "slow")
        _, page = get(console, f"/jobs/{job_id}")
        assert "Read-only" in page and "<button" not in page.split("<main", 1)[1]
        from choreography_ray.console.app import TOKEN

        status, _ = post(console, f"/jobs/{job_id}/stop", {"token": console.app[TOKEN]})
        assert status == 403  # even with the right token
        assert console.run(console.cluster.manager().get(job_id)).status == JobStatus.RUNNING
        fixtures.SCRIPT.release("slow")


def test_without_a_cluster_the_cluster_page_says_so(console):
    status, page = get(console, "/cluster")
    assert status == 200 and "Not connected to a cluster" in page


def test_the_footer_says_the_console_binds_to_loopback(console):
    _, page = get(console, "/jobs")
    assert "bound to the loopback interface" in page


def test_the_console_app_does_not_import_ray():
    code = "import sys, choreography_ray.console; print('ray' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"


def test_a_loopback_console_answers_only_to_loopback_names(console):
    # DNS rebinding: a page of evil.example, its name rebound to 127.0.0.1, asks the console.
    port = urllib.parse.urlsplit(console.url).port
    for host, code in ((f"evil.example:{port}", 421), (f"localhost:{port}", 200)):
        asked = urllib.request.Request(console.url + "/jobs", headers={"Host": host})
        try:
            with urllib.request.urlopen(asked, timeout=30) as answer:
                status = answer.status
        except urllib.error.HTTPError as error:
            status = error.code
        assert status == code, host


@cr.step(name="tests.console.halve")
async def halve(n: int) -> int:
    if n == 3:
        raise ValueError("three is odd")
    return n // 2


def test_a_map_job_shows_like_any_job_with_its_failed_item_first(console):
    """`jobs.map` makes an ordinary job: listed, its page with the failed item's error first,
    its steps by item name."""
    result = console.run(console.cluster.map(halve, range(5), job_id="halves"))
    console.run(console.cluster.settle())
    assert result.job_id == "halves"
    _, listing = get(console, "/")
    assert "halves" in job_ids_in(listing)
    status, page = get(console, "/jobs/halves")
    assert status == 200 and "choreography.map" in page
    assert "three is odd" in page  # failures first, with their error
    _, steps = get(console, "/jobs/halves/steps")
    assert all(f"item {n}" in steps for n in range(5))
