"""The console's page frame: escaping, links, the layout and its one small script.

Every value that comes from a user or from storage goes through `e` (or a helper that calls
it): job ids, types, requests, details, error messages and stack traces render as text.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import quote, urlencode

from ..jobs.state import JobKey


def e(value: object) -> str:
    """`value` as HTML text: every `<`, `>`, `&` and quote escaped."""
    return html.escape(str(value), quote=True)


def path(*parts: str) -> str:
    """A URL path from segments, each quoted whole (job ids may hold `?`, `#` or `%`)."""
    return "/" + "/".join(quote(part, safe="") for part in parts)


def url(base: str, params: Mapping[str, object]) -> str:
    """`base` with the non-empty `params` as its query string."""
    kept = {k: str(v) for k, v in params.items() if v not in (None, "")}
    return f"{base}?{urlencode(kept)}" if kept else base


def key_params(key: JobKey) -> dict[str, str]:
    return {"scope": key.scope, "namespace": key.namespace}


def when(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def bar(done: int, total: int, failed: int = 0) -> str:
    """A progress bar with its figures as text (screen readers and tests read those)."""
    share = 100.0 if total == 0 else 100.0 * done / total
    bad = 0.0 if total == 0 else 100.0 * failed / total
    return (
        f'<span class="bar" role="progressbar" aria-valuenow="{done}" aria-valuemax="{total}">'
        f'<span class="ok" style="width:{share - bad:.1f}%"></span>'
        f'<span class="bad" style="width:{bad:.1f}%"></span></span>'
        f' <span class="figures">{done}/{total}</span>'
    )


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f8fa}
header,footer{background:#24292f;color:#fff;padding:.5em 1em}
header a{color:#fff;margin-right:1.2em;text-decoration:none;font-weight:600}
footer{background:#eaeef2;color:#57606a;font-size:12px}
main,.filters{padding:.5em 1em}
table{border-collapse:collapse;background:#fff;width:100%}
th,td{border-bottom:1px solid #d0d7de;padding:.25em .5em;text-align:left;vertical-align:top}
td.num{text-align:right}
code,pre{font-family:ui-monospace,monospace;font-size:12px}
pre{white-space:pre;background:#fff;border:1px solid #d0d7de;padding:.5em;
  max-height:20em;max-width:48em;overflow:auto}
td.trace{max-width:40em;overflow-wrap:anywhere}
.bar{display:inline-flex;width:10em;height:.8em;background:#d0d7de;border-radius:3px;
  overflow:hidden;vertical-align:middle}
.bar .ok{background:#2da44e}.bar .bad{background:#cf222e}
.status{font-weight:600}.notice{background:#dafbe1;padding:.5em}.error{background:#ffebe9;padding:.5em}
.facts td:first-child{width:12em;color:#57606a}
form.inline{display:inline}
button{margin-right:.5em}
.muted{color:#57606a}
.badge{padding:0 .45em;border-radius:.7em;font-size:12px;font-weight:600;color:#fff;
  background:#57606a;white-space:nowrap}
.s-completed_successfully,.j-completed_successfully{background:#1a7f37}
.s-failed,.s-completed_with_failure,.j-failed,.j-completed_with_failures{background:#cf222e}
.s-running,.s-scheduled,.j-running{background:#0969da}
.s-prepared,.j-none,.j-preparing_job,.j-preparing_steps,.j-starting_steps{background:#6e7781}
.s-stopped,.s-removing,.j-stopped,.j-removing{background:#9a6700}
.s-unreachable{background:#8250df}
svg.chart .frame{fill:#fff;stroke:#d0d7de}svg.chart .line{fill:none;stroke:#2da44e;stroke-width:2}
.failures{background:#fff5f5;border:1px solid #ffcecb;padding:.25em 1em;margin-bottom:1em}
th a{color:inherit}
"""

SCRIPT = """
(function () {
  var every = %d, last = null, timer = null;
  if (!every) { return; }
  function later() { clearTimeout(timer); timer = setTimeout(tick, every); }
  function tick() {
    timer = null;
    var main = document.getElementById("main");
    if (!main || main.dataset.live !== "1") { return; }
    if (document.hidden) {  // paused, nothing scheduled: showing the tab again resumes
      document.body.dataset.live = "paused"; return;
    }
    document.body.dataset.live = "on";
    var target = new URL(window.location.href);
    target.searchParams.set("fragment", "1");
    fetch(target, {headers: {"Accept": "text/html"}})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        // Replaced only when it changed, so a button is not swapped under the pointer.
        if (text !== null && text !== last) {
          last = text; main.outerHTML = text;
          document.body.dataset.refreshed = String(Date.now());
        }
      })
      .catch(function () {})
      .then(later);
  }
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) { clearTimeout(timer); tick(); }
  });
  later();
})();
"""


def footer(bound: str) -> str:
    """Where the console listens, and what that means for who can reach it."""
    name = bound.rsplit(":", 1)[0].strip("[]") if ":" in bound else bound
    if name in ("127.0.0.1", "localhost", "::1"):
        return (
            f"choreography console, bound to the loopback interface ({e(bound)}): only this "
            "machine reaches it. See docs/console.md to share it behind authentication."
        )
    return (
        f"choreography console, listening on {e(bound)}, beyond this machine: it has no login "
        "of its own, so keep it behind authentication (docs/console.md)."
    )


def main(body: str, *, live: bool) -> str:
    """The part of a page that live refresh replaces."""
    return f'<main id="main" data-live="{1 if live else 0}">{body}</main>'


def layout(
    title: str, body: str, *, filters: str = "", refresh_ms: int, bound: str, source: str
) -> str:
    """A whole page: header, the filters (never refreshed, so typing is not lost), the live
    part, and the footer that says where the console listens."""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{e(title)} · choreography</title>"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<style>{STYLE}</style></head><body>"
        '<header><a href="/jobs">Jobs</a><a href="/cluster">Cluster</a>'
        f'<span class="muted">{e(source)}</span></header>'
        f'<div class="filters">{filters}</div>{body}'
        f"<footer>{footer(bound)}</footer>"
        f"<script>{SCRIPT % refresh_ms}</script></body></html>"
    )
