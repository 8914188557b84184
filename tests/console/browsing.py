"""Headless Chromium (Debian's package) driven by Selenium, for the tests that open the
console in a real browser: what of it is missing, the browser itself, bounded waits, and a
console served in a thread meanwhile."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from choreography_ray.console import serve

CHROMIUM = os.environ.get("CHOREOGRAPHY_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHOREOGRAPHY_CHROMEDRIVER", "/usr/bin/chromedriver")
WAIT = 20.0
"""Seconds the browser may take to show what a test waits for."""


def missing_browser(chromium: str = CHROMIUM, chromedriver: str = CHROMEDRIVER) -> str | None:
    """What of the browser is not installed, by name and with the package to install; None
    when both are there."""
    missing = []
    if not Path(chromium).exists():
        missing.append(f"Chromium (no {chromium}; apt-get install chromium)")
    if not shutil.which(chromedriver):
        missing.append(f"chromedriver (no {chromedriver}; apt-get install chromium-driver)")
    return " and ".join(missing) or None


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium, quit after."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,860",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


def until(driver: Any, condition: Any, what: str) -> Any:
    """What `condition(driver)` answers once it is true, within `WAIT` seconds."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # A condition that found an element live refresh then replaced is asked again.
    wait = WebDriverWait(
        driver, WAIT, poll_frequency=0.05, ignored_exceptions=[StaleElementReferenceException]
    )
    return wait.until(condition, what)


@contextlib.contextmanager
def serving(web_app: Any) -> Iterator[str]:
    """`web_app` served on a loop of its own in a thread, for a browser to use meanwhile."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    where: concurrent.futures.Future[str] = concurrent.futures.Future()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    served = asyncio.run_coroutine_threadsafe(
        serve(web_app, "127.0.0.1", 0, listening=where.set_result, stop=stop), loop
    )
    try:
        yield where.result(30)
    finally:
        loop.call_soon_threadsafe(stop.set)
        served.result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
