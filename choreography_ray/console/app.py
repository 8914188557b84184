"""The console as an aiohttp application: routes, input checks, and actions behind a token.

`create_app` takes a reader and, optionally, the cluster's actions and view, so tests serve it
over any storage without Ray. Actions are off unless `allow_actions`; when on, every action is
a POST that carries this process's random token, so a page of another site cannot make the
browser of someone who has the console open stop their jobs (cross-site request forgery).
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from ..jobs.errors import ChoreographyError, JobNotFoundError, RecordNotFoundError
from ..jobs.options import option_error
from ..jobs.state import JobKey, utc
from ..jobs.status import FAILED_STEP_STATUSES, JobStatus
from ..storage.codec import check_id
from ..storage.job_order import JobOrder
from ..storage.retry import one_line
from ..storage.step_query import StepCursor, StepOrder, StepQuery
from . import job_list, pages, step_pages
from .html import e, key_params, layout, main, path, url
from .ports import ACTIONS, ClusterView, JobActions
from .reader import (
    JobFilter,
    JobsReader,
    check_page,
    parse_status,
    parse_step_statuses,
    reads_every_step,
)

log = logging.getLogger("choreography_ray.console")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ConsoleSettings:
    allow_actions: bool = False
    refresh_seconds: float = 2.0
    """How often a live page asks for its changing part again; 0 turns live refresh off."""
    bound: str = "127.0.0.1"
    """Where the server listens, for the footer."""
    source: str = ""
    """The storage read, redacted, for the header."""
    page_size: int = 50
    allowed_hosts: frozenset[str] | None = None
    """Host names a request may name in its Host header (None: any). A console on loopback
    answers only to loopback names, so a web page whose name was rebound to 127.0.0.1 (DNS
    rebinding) cannot read it or its form token."""


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})

FAILED_SHOWN = 10
"""How many failed steps a job's page lists above everything else."""

READER: web.AppKey[JobsReader] = web.AppKey("reader", JobsReader)
SETTINGS: web.AppKey[ConsoleSettings] = web.AppKey("settings", ConsoleSettings)
ACTIONS_KEY: web.AppKey[JobActions | None] = web.AppKey("actions")
CLUSTER_KEY: web.AppKey[ClusterView | None] = web.AppKey("cluster")
TOKEN: web.AppKey[str] = web.AppKey("token", str)


FAILED_FIRST = StepQuery(statuses=FAILED_STEP_STATUSES, order=StepOrder.CHANGED, take=FAILED_SHOWN)
"""The failed steps a job's page opens with: the latest failures first."""


class BadInput(ValueError):
    """A query parameter the console cannot use; answered 400 with the reason."""


def create_app(
    reader: JobsReader,
    *,
    settings: ConsoleSettings | None = None,
    actions: JobActions | None = None,
    cluster: ClusterView | None = None,
) -> web.Application:
    app = web.Application(middlewares=[_known_host, _errors])
    app[READER] = reader
    app[SETTINGS] = settings or ConsoleSettings()
    app[ACTIONS_KEY] = actions
    app[CLUSTER_KEY] = cluster
    app[TOKEN] = secrets.token_urlsafe(24)
    app.router.add_get("/", _home)
    app.router.add_get("/jobs", _jobs)
    app.router.add_get("/jobs/{job_id}", _job)
    app.router.add_get("/jobs/{job_id}/steps", _steps)
    app.router.add_get("/jobs/{job_id}/steps/{step_id}", _step)
    app.router.add_post("/jobs/{job_id}/{action}", _action)
    app.router.add_get("/cluster", _cluster)
    return app


# -- helpers ----------------------------------------------------------------------------------


def _render(
    request: web.Request, title: str, body: str, *, live: bool, filters: str = "", status: int = 200
) -> web.Response:
    """The whole page, or only its live part when the page's script asks (`fragment=1`)."""
    settings = request.app[SETTINGS]
    part = main(body, live=live and settings.refresh_seconds > 0)
    if request.query.get("fragment") == "1":
        text = part
    else:
        text = layout(
            title,
            part,
            filters=filters,
            refresh_ms=int(settings.refresh_seconds * 1000),
            bound=settings.bound,
            source=settings.source,
        )
    return web.Response(text=text, content_type="text/html", status=status)


def _int(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise BadInput(f"{name} must be a whole number (got {raw!r})") from None


def _time(request: web.Request, name: str) -> datetime | None:
    """A time of the query string, as a date or an ISO date and time (UTC unless it says)."""
    raw = request.query.get(name, "").strip()
    if not raw:
        return None
    try:
        return utc(datetime.fromisoformat(raw))
    except ValueError:
        raise BadInput(
            f"{name} must be a date or a date and time, as 2026-05-01 or 2026-05-01T12:30 "
            f"(got {raw!r})"
        ) from None


def _job_sort(request: web.Request) -> dict[str, Any]:
    """The jobs page's `sort` (a column) and `dir` (asc or desc); newest first by default.
    `order=oldest`, what its links said before columns sorted, still means created ascending."""
    if request.query.get("order", "") == "oldest" and "sort" not in request.query:
        return {"sort": JobOrder.CREATED, "descending": False}
    raw = request.query.get("sort", "").strip() or JobOrder.CREATED.value
    try:
        sort = JobOrder(raw)
    except ValueError:
        names = ", ".join(o.value for o in JobOrder)
        raise BadInput(f"sort must be one of {names} (got {raw!r})") from None
    way = request.query.get("dir", "").strip() or "desc"
    if way not in ("asc", "desc"):
        raise BadInput(f"dir must be asc or desc (got {way!r})")
    return {"sort": sort, "descending": way == "desc"}


def _key(request: web.Request) -> JobKey:
    scope = request.query.get("scope") or "default"
    namespace = request.query.get("namespace") or "default"
    try:
        return JobKey(scope=scope, namespace=namespace)
    except ValidationError as error:
        raise BadInput(option_error(error, "job key").message) from None


def _job_id(request: web.Request) -> str:
    """The job id of the path; storage refuses an empty or over-long one (a `/` cannot reach
    here: it would be another path)."""
    return check_id(request.match_info["job_id"], "job id")


def _status_names(request: web.Request) -> list[str]:
    return [name for name in request.query.get("status", "").split(",") if name.strip()]


@web.middleware
async def _known_host(request: web.Request, handler: Handler) -> web.StreamResponse:
    allowed = request.app[SETTINGS].allowed_hosts
    if allowed is not None and _host_name(request.host) not in allowed:
        raise web.HTTPMisdirectedRequest(
            text="this console answers only to its own host names (see docs/console.md)"
        )
    return await handler(request)


def _host_name(host: str) -> str:
    """The name of a Host header, without its port: `[::1]:8266` -> `::1`."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Mistakes and unreachable storage as a page with one line, never a traceback."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except (JobNotFoundError, RecordNotFoundError) as error:
        return _render(
            request, "Not found", f'<p class="error">{e(error.message)}</p>', live=False, status=404
        )
    except (BadInput, ValueError) as error:
        return _render(
            request,
            "Bad request",
            f'<p class="error">{e(one_line(error))}</p>',
            live=False,
            status=400,
        )
    except Exception as error:
        log.warning("console request %s failed: %s", request.path, one_line(error))
        message = one_line(error) or type(error).__name__
        return _render(
            request,
            "Unavailable",
            f'<p class="error">{e(type(error).__name__)}: {e(message)}</p>',
            live=True,
            status=503,
        )


# -- pages ------------------------------------------------------------------------------------


async def _home(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/jobs")


async def _jobs(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    wanted = JobFilter(
        key=_key(request),
        statuses=frozenset(parse_status(n, JobStatus) for n in _status_names(request)),
        type=request.query.get("type", "").strip() or None,
        page=_int(request, "page", 0),
        size=_int(request, "size", settings.page_size),
        id_prefix=request.query.get("id", "").strip(),
        created_after=_time(request, "from"),
        created_before=_time(request, "to"),
        changed_after=_time(request, "changed_from"),
        changed_before=_time(request, "changed_to"),
        **_job_sort(request),
    )
    reader = request.app[READER]
    found = await reader.jobs(wanted)
    body = job_list.jobs_page(wanted, found, pages.now_utc())
    filters = job_list.jobs_filters(wanted) + job_list.partitions(await _busy(reader), wanted.key)
    return _render(request, "Jobs", body, live=True, filters=filters)


async def _busy(reader: JobsReader) -> list[JobKey]:
    """The partitions with unfinished jobs; none when the store keeps no catalog of them."""
    try:
        return await reader.busy_partitions()
    except Exception as error:
        log.debug("no partition catalog: %s", one_line(error))
        return []


async def _job(request: web.Request) -> web.Response:
    return await _job_response(request, message=_done(request))


def _done(request: web.Request) -> str:
    """The notice after an action redirected here: only the known action names render."""
    done = request.query.get("done", "")
    return f"{done}: requested" if done in ACTIONS else ""


async def _job_response(
    request: web.Request, *, message: str = "", problem: str = "", status: int = 200
) -> web.Response:
    reader = request.app[READER]
    settings = request.app[SETTINGS]
    key, job_id = _key(request), _job_id(request)
    job = await reader.job(key, job_id)
    counts = await reader.step_counts(key, job.id, verify=reads_every_step(job))
    actions = request.app[ACTIONS_KEY]
    form = pages.actions_form(
        job,
        enabled=settings.allow_actions and actions is not None,
        can_drain=actions is not None and actions.can_drain,
        token=request.app[TOKEN],
    )
    failed = await reader.steps(key, job.id, FAILED_FIRST)
    body = pages.job_page(
        job,
        counts,
        pages.now_utc(),
        actions=form,
        failures=step_pages.failed_steps(job, failed),
        message=message,
        problem=problem,
    )
    return _render(request, f"Job {job_id}", body, live=not job.is_finished, status=status)


def _step_query(request: web.Request, size: int) -> StepQuery:
    """The steps page's filter, order and cursor, from its query string."""
    after = request.query.get("after", "").strip()
    stage = request.query.get("stage", "").strip()
    order = request.query.get("order", "").strip() or StepOrder.PLAN.value
    try:
        return StepQuery(
            statuses=parse_step_statuses(_status_names(request)),
            stage=_int(request, "stage", 0) if stage else None,
            type=request.query.get("type", "").strip() or None,
            id_prefix=request.query.get("prefix", "").strip(),
            order=StepOrder(order),
            after=StepCursor.parse(after) if after else None,
            take=size,
        )
    except ValidationError as error:
        raise BadInput(option_error(error, "steps filter").message) from None


async def _steps(request: web.Request) -> web.Response:
    reader = request.app[READER]
    settings = request.app[SETTINGS]
    key, job_id = _key(request), _job_id(request)
    size = _int(request, "size", settings.page_size)
    check_page(0, size)
    query = _step_query(request, size)
    job = await reader.job(key, job_id)
    found = await reader.steps(key, job.id, query)
    # Each refresh reads one page from an index: live while the job runs, however large.
    body = step_pages.steps_page(job, query, found, pages.now_utc())
    filters = step_pages.steps_filters(job, query)
    return _render(request, f"Steps of {job.id}", body, live=not job.is_finished, filters=filters)


async def _step(request: web.Request) -> web.Response:
    reader = request.app[READER]
    key, job_id = _key(request), _job_id(request)
    step_id = check_id(request.match_info["step_id"], "step id")
    job = await reader.job(key, job_id)
    step = await reader.step(key, job.id, step_id)
    body = step_pages.step_page(job, step, pages.now_utc())
    live = not job.is_finished
    return _render(request, f"Step {step_id} of {job.id}", body, live=live)


async def _cluster(request: web.Request) -> web.Response:
    view = request.app[CLUSTER_KEY]
    source = request.app[SETTINGS].source
    if view is None:
        return _render(request, "Cluster", pages.cluster_page(None, source), live=False)
    try:
        snapshot = await view.snapshot()
    except Exception as error:
        body = pages.cluster_page(None, source, one_line(error) or type(error).__name__)
        return _render(request, "Cluster", body, live=True, status=503)
    return _render(request, "Cluster", pages.cluster_page(snapshot, source), live=True)


# -- actions ----------------------------------------------------------------------------------


async def _action(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    actions = request.app[ACTIONS_KEY]
    action = request.match_info["action"]
    if action not in ACTIONS:
        raise web.HTTPNotFound(text=f"unknown action {action!r}")
    if not settings.allow_actions or actions is None:
        raise web.HTTPForbidden(
            text="actions are off: start the console with --allow-actions (and a cluster)"
        )
    form = await request.post()
    token = str(form.get("token", ""))
    if not hmac.compare_digest(token.encode(), request.app[TOKEN].encode()):
        raise web.HTTPForbidden(text="missing or wrong form token: reload the page and try again")
    key, job_id = _key(request), _job_id(request)
    if action == "drain" and not actions.can_drain:
        raise web.HTTPConflict(text="this cluster's client cannot drain a job")
    try:
        await actions.run(action, key, job_id)
    except ChoreographyError as error:
        if isinstance(error, JobNotFoundError):
            raise
        return await _job_response(
            request, problem=f"{action} refused: {error.message}", status=409
        )
    log.info("console: %s of job %s in %s", action, job_id, key)
    raise web.HTTPSeeOther(url(path("jobs", job_id), {**key_params(key), "done": action}))
