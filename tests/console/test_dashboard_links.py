"""The cluster page links Ray's dashboard when it answers, token authentication included."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator

import pytest

from choreography_ray.console import ray_cluster


def _serving(status: int) -> Iterator[str]:
    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("status", "linked"), [(200, True), (401, True), (403, True), (500, False)]
)
def test_a_dashboard_that_answers_is_linked_even_when_it_asks_for_the_token(
    monkeypatch, status, linked
):
    """Ray 2.60 turns token authentication on for a local Ray: its dashboard answers 401
    without the token, and the console (which holds none) must still link it."""
    for address in _serving(status):
        url = functools.partial(str, address)
        monkeypatch.setattr(ray_cluster.ray._private.worker, "get_dashboard_url", url)
        found = ray_cluster.reachable_dashboard()
        assert found == (f"http://{address}" if linked else "")


def test_no_dashboard_no_link(monkeypatch):
    monkeypatch.setattr(ray_cluster.ray._private.worker, "get_dashboard_url", lambda: "")
    assert ray_cluster.reachable_dashboard() == ""
