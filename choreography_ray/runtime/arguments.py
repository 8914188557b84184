"""Checks of what callers pass to the client, made before anything is sent or written.

A bad argument must fail here, in the caller's process, with one line that names it: once it
crosses to a host it comes back as a Ray traceback, and once it is written to the cluster's
configuration every later `connect` inherits it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from ..jobs.errors import InvalidJobIdError, InvalidOptionError
from ..jobs.options import JobsOptions, option_error
from ..jobs.state import MAX_ID_LENGTH, JobKey
from ..placement.roles import check_workers_per_node
from ..storage.protocols import JobQuery


def check_job_id(job_id: object) -> str:
    """`job_id` if it can name a job: any printable text of 1 to 200 characters without a path
    separator (`/` or `\\`) and without whitespace at either end."""
    if not isinstance(job_id, str):
        raise InvalidJobIdError(job_id, f"is a {type(job_id).__name__}, not a string")
    if not job_id:
        raise InvalidJobIdError(job_id, "is empty")
    if len(job_id) > MAX_ID_LENGTH:
        raise InvalidJobIdError(
            job_id[:20] + "…", f"is {len(job_id)} characters long; at most {MAX_ID_LENGTH}"
        )
    if job_id != job_id.strip():
        raise InvalidJobIdError(job_id, "has whitespace at its start or end")
    if not job_id.isprintable():
        raise InvalidJobIdError(job_id, "contains a control or other non-printable character")
    if "/" in job_id or "\\" in job_id:
        raise InvalidJobIdError(job_id, "contains a path separator ('/' or '\\')")
    return job_id


def job_key(scope: str, namespace: str) -> JobKey:
    """The partition, or a one-line error naming the part that is wrong."""
    try:
        return JobKey(scope=scope, namespace=namespace)
    except ValidationError as error:
        raise option_error(error, "job key") from None


def check_query(query: JobQuery) -> JobQuery:
    """`query` unless its `take` is negative: storage reads that as "all", which a caller
    who typed -1 hardly meant."""
    if query.take < 0:
        raise InvalidOptionError("limit", f"must be 0 (all) or more, got {query.take}")
    return query


def check_connect_arguments(
    *,
    address: str | None,
    namespace: str,
    options: JobsOptions | None,
    modules: Sequence[str],
    max_parallel_steps: int | None,
    workers_per_node: int,
    runtime_env: dict[str, Any] | None,
) -> int | None:
    """Refuse a bad `connect` argument, as `JobsOptions` refuses a bad setting (the storage
    URL is checked by `connection.probe_storage`, which opens the store); the step limit as
    `JobsOptions` reads it (`"3"` is 3), which is what the hosts are given."""
    if address is not None and (not isinstance(address, str) or not address.strip()):
        raise InvalidOptionError("address", f"expected 'auto' or 'host:port', not {address!r}")
    if not isinstance(namespace, str) or not namespace.strip():
        raise InvalidOptionError("namespace", f"expected a Ray namespace name, not {namespace!r}")
    if options is not None and not isinstance(options, JobsOptions):
        raise InvalidOptionError("options", f"expected JobsOptions, not {type(options).__name__}")
    if isinstance(modules, str) or not all(isinstance(m, str) and m.strip() for m in modules):
        raise InvalidOptionError("modules", f"expected a list of module names, not {modules!r}")
    limit = JobsOptions(max_parallel_steps=max_parallel_steps).max_parallel_steps  # its rule
    check_workers_per_node(workers_per_node)
    if runtime_env is not None and not isinstance(runtime_env, dict):
        raise InvalidOptionError("runtime_env", f"expected a dict, not {runtime_env!r}")
    return limit
