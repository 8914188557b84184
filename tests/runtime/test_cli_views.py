"""The command line's listings, JSON output, steps, status and exit codes, and the console
(its links to Ray's dashboard followed in a browser), against a running single-node Ray with
its dashboard (one instance for the module)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from typer.testing import CliRunner

from choreography_ray.cli import app

from ..console.browsing import missing_browser
from .ray_jobs import FanOut, FanOutJob

runner = CliRunner()


@pytest.fixture(scope="module")
def jobs(ray_instance, tmp_path_factory):
    import choreography_ray as cr

    database = tmp_path_factory.mktemp("cli-views") / "jobs.db"
    return cr.connect(f"sqlite:///{database}", modules=["tests.runtime.ray_jobs"])


@pytest.fixture(scope="module")
def finished(jobs):
    """A job that succeeded and one whose step 1 failed."""
    good = jobs.start(FanOutJob, FanOut(steps=4, stages=2))
    bad = jobs.start(FanOutJob, FanOut(steps=3, fail=[1]))
    jobs.wait(good, timeout=60)
    jobs.wait(bad, timeout=60)
    return good, bad


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_a_listing_is_one_line_per_job_in_80_columns(finished):
    good, bad = finished
    listed = invoke("jobs", "list")
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert len(lines) == 3  # the header and one line per job
    assert good not in listed.output  # short ids…
    assert any(line.startswith(good[:8]) for line in lines)
    wide = invoke("jobs", "list", "--wide")
    assert good in wide.output and bad in wide.output  # …unless --wide


def test_list_and_show_answer_json(finished):
    good, bad = finished
    listed = json.loads(invoke("jobs", "list", "--output", "json").output)
    assert {j["id"] for j in listed} == {good, bad}
    assert {j["status"] for j in listed} == {"COMPLETED_SUCCESSFULLY", "COMPLETED_WITH_FAILURES"}
    shown = json.loads(invoke("jobs", "show", bad, "-o", "json").output)
    assert shown["id"] == bad and shown["progress"]["failed"] == 1
    assert shown["step_counts"] and shown["status_history"][0]["status"] == "PREPARING_JOB"


def test_jobs_steps_shows_a_failed_steps_error(finished):
    _, bad = finished
    failed = invoke("jobs", "steps", bad, "--status", "failed")
    assert failed.exit_code == 0, failed.output
    assert "item 1 failed" in failed.output
    assert len(failed.output.splitlines()) == 2  # the header and the failed step
    every = json.loads(invoke("jobs", "steps", bad, "--output", "json").output)
    assert every["total"] == 3 and len(every["steps"]) == 3
    [error] = [s["error"] for s in every["steps"] if s["error"]]
    assert "item 1 failed" in error["messages"][0] and error["stack_trace"]


def test_status_shows_the_cluster_in_one_screen(finished):
    shown = invoke("status")
    assert shown.exit_code == 0, shown.output
    assert "controller host" in shown.output
    # The module's Ray has 2 CPUs: by default, one worker host per CPU.
    assert "worker host 1 of 2" in shown.output and "worker host 2 of 2" in shown.output
    assert "1 completed_successfully" in shown.output
    as_json = json.loads(invoke("status", "--output", "json").output)
    [node] = as_json["nodes"]
    assert node["alive"] and node["controller"] and node["worker"]
    assert sorted(host["role"] for host in node["hosts"]) == ["controller", "worker", "worker"]
    assert "tests.runtime.ray_jobs" in as_json["modules"]


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("jobs", "list", "--status", "bogus"), 2),
        (("jobs", "show", "a/b"), 2),
        (("jobs", "steps", "no-such-job"), 3),
        (("jobs", "steps", "x", "--status", "bogus"), 2),
    ],
)
def test_exit_codes(finished, args, code):
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_watching_a_job_that_failed_exits_1(finished):
    _, bad = finished
    watched = invoke("jobs", "watch", bad, "--timeout", "60")
    assert watched.exit_code == 1 and "COMPLETED_WITH_FAILURES" in watched.output


def jobs_client():
    from choreography_ray.runtime import Jobs

    return Jobs()


def test_the_console_serves_the_cluster_it_joined(finished):
    import aiohttp
    import ray

    from choreography_ray.console import ClientActions, ConsoleSettings, console_app, serve
    from choreography_ray.console.app import TOKEN
    from choreography_ray.console.ray_cluster import RayClusterView, cluster_storage
    from choreography_ray.jobs import JobStatus
    from choreography_ray.runtime import Jobs

    from .ray_jobs import gate

    good, _ = finished
    provider, _config = cluster_storage("choreography")
    handle = gate()
    blocked = jobs_client().start(FanOutJob, FanOut(steps=2, block=True))

    async def scenario() -> tuple[str, str]:
        web_app = console_app(
            provider,
            settings=ConsoleSettings(allow_actions=True),
            actions=ClientActions(Jobs()),
            cluster=RayClusterView("choreography"),
        )
        stop = asyncio.Event()
        where: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        server = asyncio.ensure_future(
            serve(web_app, "127.0.0.1", 0, listening=where.set_result, stop=stop)
        )
        try:
            base = await asyncio.wait_for(where, 30)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
                async with http.get(f"{base}/jobs") as answer:
                    jobs_page = await answer.text()
                async with http.get(f"{base}/cluster") as answer:
                    cluster_page = await answer.text()
                stop_url = f"{base}/jobs/{blocked}/stop"
                form = {"token": web_app[TOKEN]}
                async with http.post(stop_url, data=form, allow_redirects=False) as answer:
                    assert answer.status == 303, await answer.text()
        finally:
            stop.set()
            await asyncio.wait_for(server, 30)
        return jobs_page, cluster_page

    try:
        jobs_page, cluster_page = asyncio.run(scenario())
        assert jobs_client().wait(blocked, timeout=60).status == JobStatus.STOPPED
    finally:
        ray.kill(handle)
    assert good in jobs_page
    assert "choreography:controller:" in cluster_page and "alive" in cluster_page
    assert "live job activations" in cluster_page and "running steps" in cluster_page
    assert "tests.runtime.ray_jobs" in cluster_page


@pytest.fixture(scope="module")
def ray_instance():
    """This module's Ray has its dashboard: the console's cluster page links it."""
    from .conftest import local_ray

    with local_ray(dashboard=True):
        yield


@pytest.mark.skipif(missing_browser() is not None, reason=f"not installed: {missing_browser()}")
def test_a_host_s_logs_link_opens_its_actor_s_logs_in_ray_s_dashboard(finished):
    """Followed in a browser, the cluster page's link lands on the host actor's page of Ray's
    dashboard (its own route, `#/actors/<id>`); Ray 2.60 asks there for its token, as it
    would of the operator, and given it shows the actor's logs."""
    import ray
    from selenium.webdriver.common.by import By

    from choreography_ray.console import ConsoleSettings, console_app
    from choreography_ray.console.ray_cluster import RayClusterView, cluster_storage
    from choreography_ray.runtime.constants import CONTROLLER_PREFIX

    from ..console.browsing import chromium, serving, until

    provider, _ = cluster_storage("choreography")
    view = RayClusterView("choreography")
    web_app = console_app(provider, settings=ConsoleSettings(), cluster=view)
    actors = ray.util.list_named_actors(all_namespaces=True)
    [name] = [a["name"] for a in actors if a["name"].startswith(CONTROLLER_PREFIX)]
    actor_id = ray.get_actor(name, namespace="choreography")._actor_id.hex()
    dashboard = f"http://{ray._private.worker.get_dashboard_url()}"
    logs = f"//code[text()='{name}']/following-sibling::a[text()='logs']"
    with serving(web_app) as base, chromium() as browser:
        browser.get(f"{base}/cluster")
        until(browser, lambda d: d.find_elements(By.XPATH, logs), "the controller's logs link")
        browser.find_element(By.XPATH, logs).click()
        until(browser, lambda d: d.current_url.startswith(dashboard), "Ray's dashboard")
        assert browser.current_url == f"{dashboard}/#/actors/{actor_id}"
        token = "input[placeholder='Enter your authentication token']"
        shown = until(
            browser,
            lambda d: d.find_elements(By.CSS_SELECTOR, token) or _body_shows(d, name),
            "the dashboard's actor page, or its token prompt",
        )
        if shown is not True:  # Ray's token authentication is on (the default in 2.60)
            shown[0].send_keys(_ray_token())
            browser.find_element(By.XPATH, "//button[text()='Submit']").click()
        until(browser, lambda d: _body_shows(d, name), "the actor's page, its name on it")
        until(browser, _logs_shown, "the actor's logs")
        assert browser.current_url == f"{dashboard}/#/actors/{actor_id}"


def _logs_shown(driver: Any) -> bool:
    """The actor's logs are on its page; when the dashboard failed to read them ("Failed to
    load", seen in a run on a busy machine), the page is loaded again, as an operator would."""
    if _body_shows(driver, ":actor_name:ControllerHost"):  # Ray's first line in them
        return True
    if _body_shows(driver, "Failed to load"):
        driver.refresh()
    return False


def _body_shows(driver: Any, text: str) -> bool:
    return text in str(driver.execute_script("return document.body.innerText;"))


def _ray_token() -> str:
    """The token of the local Ray, as `ray get-auth-token` prints it (without its start-up)."""
    from ray._raylet import AuthenticationTokenLoader

    return str(AuthenticationTokenLoader.instance().get_raw_token())
