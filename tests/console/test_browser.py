"""The console in a real browser: headless Chromium (Debian's package) driven by Selenium,
against an in-process cluster whose steps the test releases one by one, and over a SQLite
store of a 150,000-step job, paged from storage.

Skipped only when Chromium or its driver is not installed; `.ci/run` installs them and fails
when these tests did not run. With CHOREOGRAPHY_SCREENSHOTS=1 the run also writes the
screenshots of docs/console.md into docs/images/ (off by default, so a test run leaves the
tree as it was).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from choreography_ray.console import ConsoleSettings, JobsReader, create_app
from choreography_ray.console.app import LOOPBACK_NAMES
from choreography_ray.jobs import (
    JobProgress,
    JobState,
    JobStatus,
    JobStepState,
    JobStepStatus,
    StatusChange,
    TypeKind,
    TypeRegistry,
)
from choreography_ray.storage import StepCursor, StepOrder, open_storage

from ..engine import fixtures
from ..engine.fixtures import ScenarioJob, request
from .browsing import chromium, missing_browser, serving, until
from .harness import ConsoleHarness

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "images"


pytestmark = pytest.mark.skipif(
    missing_browser() is not None, reason=f"not installed: {missing_browser()}"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture
def console() -> Iterator[ConsoleHarness]:
    with ConsoleHarness(refresh_seconds=0.2, page_size=5) as harness:
        yield harness


def main_text(driver: Any) -> str:
    """The live part's text, read in the page in one step: live refresh replaces the whole
    element (outerHTML), so a found element can go stale before its text is read."""
    return str(driver.execute_script("return document.getElementById('main').innerText;"))


def shows(text: str) -> Any:
    def check(driver: Any) -> bool:
        try:
            return text in main_text(driver)
        except Exception:  # the live part was being replaced
            return False

    return check


def listed(*job_ids: str) -> Any:
    """The jobs page lists exactly these jobs, in this order."""

    def check(driver: Any) -> bool:
        rows = driver.execute_script(
            "return Array.from(document.querySelectorAll('tr[data-job]'), r => r.dataset.job);"
        )
        return bool(rows == list(job_ids))

    return check


def screenshot(driver: Any, name: str) -> None:
    if os.environ.get("CHOREOGRAPHY_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SCREENSHOTS / name))


def start(console: ConsoleHarness, *keys: str, job_id: str | None = None) -> str:
    result = console.run(console.cluster.start(ScenarioJob, request(*keys), job_id=job_id))
    assert result.succeeded, result
    console.run(console.cluster.settle())
    return result.job_id


def release(console: ConsoleHarness, *keys: str) -> None:
    console.call(fixtures.SCRIPT.release, *keys)


def test_the_jobs_page_shows_progress_advancing_while_a_job_runs(browser, console):
    from selenium.webdriver.common.by import By

    keys = ["a", "b", "c", "d"]
    for key in keys:
        fixtures.SCRIPT.behaviour[key].block = True
    start(console, "x", job_id="rebuild-index-finished")
    result = console.run(
        console.cluster.start(
            ScenarioJob, request(*keys, stages={"c": 1, "d": 1}), job_id="rebuild-index"
        )
    )
    job_id = result.job_id
    browser.get(f"{console.url}/jobs")
    until(browser, shows("0/4"), "the running job at 0 of 4")
    browser.execute_script("window.notReloaded = true;")  # a reload would forget it
    release(console, "a", "b")
    until(browser, shows("2/4"), "progress advancing to 2 of 4 without a reload")
    assert browser.execute_script("return window.notReloaded === true;")
    screenshot(browser, "console-jobs.png")
    click(browser, By.LINK_TEXT, "id")  # the server sorts by id, ascending first
    until(browser, lambda d: "sort=id&dir=asc" in d.current_url, "the page sorted by id")
    until(browser, listed(job_id, "rebuild-index-finished"), "the jobs sorted by id")
    click(browser, By.LINK_TEXT, "id")  # and the other way
    until(browser, listed("rebuild-index-finished", job_id), "the jobs by id descending")

    click(browser, By.LINK_TEXT, job_id)
    until(browser, shows(f"Job {job_id}"), "the job's page")
    # Stage 0 done. Read through `shows`: a live refresh may replace the element between
    # finding it and reading its text (a stale element, seen in two full runs of four).
    until(browser, shows("started"), "stage 0 started")
    until(browser, shows("2/2"), "stage 0 at 2 of 2")
    chart = browser.execute_script(  # in one step, for the same reason as main_text
        "var c = document.querySelector('svg.chart');"
        "return c && [c.getAttribute('aria-label'), c.querySelectorAll('polyline').length];"
    )
    assert chart and "progress over time" in chart[0] and chart[1] > 0, chart
    screenshot(browser, "console-job.png")
    release(console, "c", "d")
    until(browser, shows("4/4"), "the job's page following it to 4 of 4")
    until(browser, shows("COMPLETED_SUCCESSFULLY"), "the job completed")
    assert console.run(console.cluster.manager().get(job_id)).status == (
        JobStatus.COMPLETED_SUCCESSFULLY
    )


def test_open_a_job_and_page_through_its_steps_to_a_failed_one(browser, console):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    fixtures.SCRIPT.behaviour["shard-07"].raise_error = True
    fixtures.SCRIPT.retry = False
    keys = [f"shard-{n:02d}" for n in range(12)]
    job_id = start(console, *keys, job_id="reindex-products")
    browser.get(f"{console.url}/jobs")
    click(browser, By.LINK_TEXT, job_id)
    until(browser, shows(f"Job {job_id}"), "the job's page")
    assert "COMPLETED_WITH_FAILURES" in main_text(browser)
    assert "completed_with_failure" in main_text(browser)  # its step counts

    click(browser, By.PARTIAL_LINK_TEXT, "all steps")
    seen = []
    for page in (0, 1, 2):  # in plan order, five to a page: shard-07 is on the second
        if page:
            click(browser, By.PARTIAL_LINK_TEXT, "next")
        until(browser, shows(f"shard-{page * 5:02d}"), f"page {page + 1} of the steps")
        assert "12 matching steps" in main_text(browser)
        seen.append(main_text(browser))
    assert ["step shard-07 broke" in text for text in seen] == [False, True, False]
    assert sum(text.count("scenario.key-step") for text in seen) == 12

    Select(browser.find_element(By.NAME, "status")).select_by_value("failed")
    browser.find_element(By.XPATH, "//button[text()='Filter']").click()
    until(browser, shows("1 matching steps"), "only the failed step")
    screenshot(
        browser, "console-steps.png"
    )  # before the trace opens: it names this machine's paths
    click(browser, By.TAG_NAME, "summary")
    until(browser, shows("Traceback (most recent call last)"), "the stack trace, opened")


def test_a_script_in_a_request_renders_as_text(browser, console):
    from selenium.common.exceptions import NoAlertPresentException

    job_id = start(
        console, "<script>alert('owned')</script>", job_id="<img src=x onerror=alert(1)>"
    )
    browser.get(f"{console.url}/jobs")
    until(browser, shows("<img src=x onerror=alert(1)>"), "the job id, as text")
    browser.get(browser.current_url.split("/jobs")[0] + "/jobs/" + _quoted(job_id))
    until(browser, shows("<script>alert('owned')</script>"), "the request, as text")
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - reading it is the check
    assert browser.execute_script("return document.querySelectorAll('main script').length") == 0


def test_stop_and_resume_a_job_from_its_page(browser, console):
    from selenium.webdriver.common.by import By

    fixtures.SCRIPT.behaviour["slow"].block = True
    job_id = start(console, "slow", "quick")
    browser.get(f"{console.url}/jobs/{job_id}")
    until(browser, shows("RUNNING"), "the running job")
    until(browser, lambda d: not _button(d, "resume").is_enabled(), "no resume while it runs")

    click(browser, By.CSS_SELECTOR, "button[value='stop']")
    alert(browser).dismiss()  # changed their mind: nothing happens
    console.run(console.cluster.settle())
    assert console.run(console.cluster.manager().get(job_id)).status == JobStatus.RUNNING

    click(browser, By.CSS_SELECTOR, "button[value='stop']")
    alert(browser).accept()
    until(browser, shows("stop: requested"), "the stop's notice")
    until(browser, shows("STOPPED"), "the stopped job")
    until(browser, lambda d: _button(d, "resume").is_enabled(), "resume offered")
    until(browser, lambda d: not _button(d, "stop").is_enabled(), "stop no longer offered")

    release(console, "slow")
    click(browser, By.CSS_SELECTOR, "button[value='resume']")
    alert(browser).accept()
    until(browser, shows("resume: requested"), "the resume's notice")
    until(browser, shows("COMPLETED_SUCCESSFULLY"), "the resumed job completing")
    until(browser, lambda d: d.execute_script(live_flag) == "0", "live refresh ended")


live_flag = "return document.getElementById('main').dataset.live;"


def alert(driver: Any) -> Any:
    """The confirmation the click asked for, once the browser shows it."""
    from selenium.webdriver.support import expected_conditions

    return until(driver, expected_conditions.alert_is_present(), "the confirmation")


def _button(driver: Any, action: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f"button[value='{action}']")


def click(driver: Any, by: str, value: str) -> None:
    """Click what `by`/`value` finds, again if live refresh replaced it meanwhile."""
    from selenium.common.exceptions import StaleElementReferenceException

    def clicked(driver: Any) -> bool:
        try:
            driver.find_element(by, value).click()
        except StaleElementReferenceException:
            return False
        return True

    until(driver, clicked, f"a click on {value}")


def _quoted(job_id: str) -> str:
    from urllib.parse import quote

    return quote(job_id, safe="")


def test_search_jobs_by_an_id_prefix(browser, console):
    from selenium.webdriver.common.by import By

    for job_id in ("nightly-2026-05-01", "nightly-2026-05-02", "weekly-2026-w18"):
        start(console, "x", job_id=job_id)
    browser.get(f"{console.url}/jobs")
    until(browser, shows("weekly-2026-w18"), "every job listed")
    field = browser.find_element(By.NAME, "id")
    field.send_keys("nightly-2026-05-0")
    browser.find_element(By.XPATH, "//form[@class='job-filters']//button").click()
    until(browser, lambda d: "weekly" not in main_text(d), "only the jobs the prefix starts")
    shown = main_text(browser)
    assert "nightly-2026-05-01" in shown and "nightly-2026-05-02" in shown
    assert "id=nightly-2026-05-0" in browser.current_url  # the search can be bookmarked


def test_a_failed_step_s_error_comes_first_on_its_job_s_page(browser, console):
    from selenium.webdriver.common.by import By

    fixtures.SCRIPT.behaviour["shard-3"].raise_error = True
    fixtures.SCRIPT.retry = False
    job_id = start(console, *(f"shard-{n}" for n in range(6)), job_id="failing-job")
    browser.get(f"{console.url}/jobs/{job_id}")
    until(browser, shows("Failed steps (1)"), "the failed steps, listed")
    first = browser.execute_script(
        "var main = document.getElementById('main');"
        "var failures = main.querySelector('section.failures');"
        "var facts = main.querySelector('table.facts');"
        "return failures.compareDocumentPosition(facts) & Node.DOCUMENT_POSITION_FOLLOWING;"
    )
    assert first, "the failures come before the job's facts"
    failure = browser.find_element(By.CSS_SELECTOR, "section.failures li")
    assert "step shard-3 broke" in failure.text
    click(browser, By.CSS_SELECTOR, "section.failures li a")
    until(browser, shows("Status history"), "the failed step's own page")
    shown = main_text(browser)
    assert "step shard-3 broke" in shown and "checkpoint" in shown and "attempt" in shown
    screenshot(browser, "console-step.png")


def test_live_refresh_pauses_while_the_tab_is_hidden(browser, console):
    fixtures.SCRIPT.behaviour["slow"].block = True
    job_id = start(console, "slow")
    browser.get(f"{console.url}/jobs/{job_id}")
    until(browser, shows("RUNNING"), "the running job")
    count = (
        "window.asked = 0; var real = window.fetch;"
        "window.fetch = function () { window.asked += 1; return real.apply(this, arguments); };"
    )
    browser.execute_script(count)
    until(browser, lambda d: d.execute_script("return window.asked") >= 2, "refreshes")
    hide = (
        "Object.defineProperty(document, 'hidden', {value: %s, configurable: true});"
        "document.dispatchEvent(new Event('visibilitychange')); window.asked = 0;"
    )
    browser.execute_script(hide % "true")
    paused = "return document.body.dataset.live === 'paused'"
    until(browser, lambda d: d.execute_script(paused), "the refresh pausing")
    # Paused, the script asks nothing and schedules nothing: the next ask is the tab's return.
    assert browser.execute_script("return window.asked") <= 1  # one may have been under way
    browser.execute_script("window.asked = 0;")
    browser.execute_script(hide % "false")
    until(browser, lambda d: d.execute_script("return window.asked") >= 1, "refreshing again")
    release(console, "slow")


MANY = 150_000


class _Shard(BaseModel):
    n: int


@pytest.fixture(scope="module")
def many_steps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The console over a SQLite store of one running job of 150,000 step records (two
    stages, one step in fifty failed), served in a thread; the job page's address."""
    registry = TypeRegistry()
    for kind, name in ((TypeKind.JOB, "pages.job"), (TypeKind.STEP, "pages.step")):
        registry.register(type(name, (), {}), kind=kind, name=name)
    registry.register(_Shard, kind=TypeKind.STATE, name="pages.shard")
    url = f"sqlite:///{tmp_path_factory.mktemp('many-steps') / 'jobs.db'}"
    provider = open_storage(url, registry=registry)
    began = datetime(2026, 5, 1, tzinfo=UTC)
    job = JobState(
        id="reindex-150k",
        type="pages.job",
        status=JobStatus.RUNNING,  # counted by stored status, as while it runs
        created=began,
        progress=JobProgress(total_steps=MANY, successful_steps=MANY - MANY // 50),
    )
    changed = [StatusChange(status=int(JobStepStatus.COMPLETED_SUCCESSFULLY), occurred=began)]
    failed = [StatusChange(status=int(JobStepStatus.FAILED), occurred=began)]
    template = JobStepState(
        id="",
        job_id=job.id,
        type="pages.step",
        status=JobStepStatus.COMPLETED_SUCCESSFULLY,
        status_changes=changed,
        state=registry.dump(_Shard(n=0)),
    )
    records = [
        template.model_copy(
            update={"stage": n * 2 // MANY, "position": n, "id": f"{n:06d}-{n * 7919 % MANY:06d}"}
            | ({"status": JobStepStatus.FAILED, "status_changes": failed} if n % 50 == 7 else {})
        )
        for n in range(MANY)
    ]

    async def fill() -> None:
        await provider.initialize()
        await provider.for_key(job.key).jobs.save(job)
        steps = provider.for_key(job.key).steps
        for start in range(0, MANY, 10_000):
            await steps.save_many(records[start : start + 10_000])

    asyncio.run(fill())
    settings = ConsoleSettings(refresh_seconds=0, allowed_hosts=LOOPBACK_NAMES, page_size=50)
    with serving(create_app(JobsReader(provider), settings=settings)) as base:
        yield f"{base}/jobs/{job.id}"


def served_ms(driver: Any) -> float:
    """How long the page's document took, from the request sent to the response's end."""
    return float(
        driver.execute_script(
            "var n = performance.getEntriesByType('navigation')[0];"
            "return n.responseEnd - n.requestStart;"
        )
    )


def test_any_page_of_a_150_000_step_job_is_served_from_storage_pages(browser, many_steps):
    """Each page at 150,000 steps shows what it should; how long each took is printed, and
    measured against the issue's 300 ms by `benchmarks/step_pages.py` (speed is proven there,
    on an idle machine, not by a timed assertion in a shared test run)."""
    deep = StepCursor(order=StepOrder.PLAN, step_id="100000-", stage=1, position=100_000)
    pages = {  # what is asked: where, and what it shows
        "the first page": (f"{many_steps}/steps", "000000-"),
        "a page 100,000 steps in": (f"{many_steps}/steps?after={deep.token()}", "100001-"),
        "the failed steps": (f"{many_steps}/steps?status=failed", "3000 matching steps"),
        "the last change first": (f"{many_steps}/steps?order=changed", "150000 matching"),
        "the job, its failed steps first": (many_steps, "Failed steps (3000)"),
    }
    times = {}
    for what, (address, text) in pages.items():
        browser.get(address)
        until(browser, shows(text), what)
        times[what] = served_ms(browser)
    print({what: f"{ms:.0f} ms" for what, ms in times.items()})
