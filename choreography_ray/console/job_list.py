"""The console's jobs page as HTML: the search form, the sortable table and its pager.

Sorting is the server's: a column's header links to the same listing sorted by it (its
second click turns the order), and storage answers that order a page at a time
(`JobQuery.order`), so paging stays one count and one query however many jobs there are.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..jobs.state import JobKey, JobState
from ..jobs.status import JobStatus
from ..storage.job_order import JobOrder
from .html import bar, duration, e, key_params, url, when
from .pages import job_badge, job_link, select_options
from .reader import JobFilter, Page

_LABELS = {
    JobOrder.ID: "id",
    JobOrder.STATUS: "status",
    JobOrder.CREATED: "created (UTC)",
    JobOrder.CHANGED: "last change (UTC)",
}
_FIRST_DESCENDING = frozenset({JobOrder.CREATED, JobOrder.CHANGED})
"""The orders a first click sorts newest first; the others start ascending."""


def _moment(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


def _range(label: str, names: tuple[str, str], bounds: tuple[datetime | None, ...]) -> str:
    after, before = bounds
    return (
        f'{label} from <input name="{names[0]}" type="datetime-local" '
        f'value="{_moment(after)}" aria-label="{label} from (UTC)"> '
        f'to <input name="{names[1]}" type="datetime-local" value="{_moment(before)}" '
        f'aria-label="{label} before (UTC)"> '
    )


def jobs_filters(wanted: JobFilter) -> str:
    status = next(iter(wanted.statuses)).name if len(wanted.statuses) == 1 else ""
    return (
        '<form method="get" action="/jobs" class="job-filters">'
        f'id <input name="id" value="{e(wanted.id_prefix)}" size="16" '
        'placeholder="id or prefix" aria-label="job id or prefix"> '
        f'scope <input name="scope" value="{e(wanted.key.scope)}" size="12"> '
        f'namespace <input name="namespace" value="{e(wanted.key.namespace)}" size="12"> '
        f'status <select name="status">{select_options(status, (s.name for s in JobStatus))}'
        "</select> "
        f'type <input name="type" value="{e(wanted.type or "")}" size="18"> '
        + _range("created", ("from", "to"), (wanted.created_after, wanted.created_before))
        + _range(
            "last change",
            ("changed_from", "changed_to"),
            (wanted.changed_after, wanted.changed_before),
        )
        + f'<input type="hidden" name="size" value="{wanted.size}">'
        f'<input type="hidden" name="sort" value="{wanted.sort.value}">'
        f'<input type="hidden" name="dir" value="{_direction(wanted.descending)}">'
        '<button type="submit">Filter</button></form>'
    )


def partitions(keys: list[JobKey], current: JobKey) -> str:
    """Links to the partitions that hold unfinished jobs, the one shown in bold."""
    if not keys:
        return ""
    links = [
        f"<b>{e(key)}</b>"
        if key == current
        else f'<a href="{e(url("/jobs", key_params(key)))}">{e(key)}</a>'
        for key in keys
    ]
    return f'<p class="partitions muted">unfinished jobs in: {" · ".join(links)}</p>'


def pager(base: str, params: dict[str, object], found: Page[Any], labels: tuple[str, str]) -> str:
    links = []
    if found.has_previous:
        target = url(base, {**params, "page": found.page - 1})
        links.append(f'<a rel="prev" href="{e(target)}">← {labels[0]}</a>')
    links.append(f"page {found.page + 1} of {found.pages} ({found.total} in all)")
    if found.has_next:
        target = url(base, {**params, "page": found.page + 1})
        links.append(f'<a rel="next" href="{e(target)}">{labels[1]} →</a>')
    return f'<p class="pager">{" · ".join(links)}</p>'


def _direction(descending: bool) -> str:
    return "desc" if descending else "asc"


def _header(order: JobOrder, wanted: JobFilter, params: dict[str, object]) -> str:
    """A column's header: a link sorting by it, or, on the sorted column, the other way."""
    label = _LABELS[order]
    current = wanted.sort == order
    descending = not wanted.descending if current else order in _FIRST_DESCENDING
    target = url("/jobs", {**params, "sort": order.value, "dir": _direction(descending)})
    if not current:
        return f'<th><a href="{e(target)}" title="sort by {e(label)}">{e(label)}</a></th>'
    way = "descending" if wanted.descending else "ascending"
    arrow = "▾" if wanted.descending else "▴"
    return (
        f'<th aria-sort="{way}"><a href="{e(target)}" title="sort the other way">{e(label)}</a>'
        f' <span class="muted">{arrow}</span></th>'
    )


def jobs_page(wanted: JobFilter, found: Page[JobState], now: datetime) -> str:
    rows = []
    for job in found.items:
        p = job.progress
        failed = p.failed_steps + p.unreachable_steps
        rows.append(
            f'<tr data-job="{e(job.id)}"><td><a href="{e(job_link(job.id, wanted.key))}">'
            f"<code>{e(job.id)}</code></a></td><td>{e(job.type)}</td>"
            f'<td class="status">{job_badge(job)}</td>'
            f"<td>{bar(p.done_steps, p.total_steps, failed)}</td>"
            f"<td>{e(when(job.created))}</td><td>{e(when(job.last_change))}</td>"
            f"<td>{e(duration((now - job.created).total_seconds()))}</td></tr>"
        )
    params: dict[str, object] = {
        **key_params(wanted.key),
        "status": ",".join(s.name for s in sorted(wanted.statuses)),
        "type": wanted.type or "",
        "id": wanted.id_prefix,
        "from": _moment(wanted.created_after),
        "to": _moment(wanted.created_before),
        "changed_from": _moment(wanted.changed_after),
        "changed_to": _moment(wanted.changed_before),
        "size": wanted.size,
    }
    heads = "".join(
        [
            _header(JobOrder.ID, wanted, params),
            "<th>type</th>",
            _header(JobOrder.STATUS, wanted, params),
            "<th>progress</th>",
            _header(JobOrder.CREATED, wanted, params),
            _header(JobOrder.CHANGED, wanted, params),
            "<th>age</th>",
        ]
    )
    table = (
        f"<table><thead><tr>{heads}</tr></thead><tbody>"
        + ("".join(rows) or '<tr><td colspan="7" class="muted">no jobs</td></tr>')
        + "</tbody></table>"
    )
    title = f"<h1>Jobs in {e(wanted.key.scope)}/{e(wanted.key.namespace)}</h1>"
    sorted_by = {**params, "sort": wanted.sort.value, "dir": _direction(wanted.descending)}
    labels = ("previous", "next")
    if wanted.sort in _FIRST_DESCENDING:
        labels = ("newer", "older") if wanted.descending else ("older", "newer")
    return title + table + pager("/jobs", sorted_by, found, labels)
