"""Checks of what callers pass to the client, made before anything is sent or written.

A bad argument must fail here, in the caller's process, with one line that names it: once it
crosses to a host it comes back as a Ray traceback, and once it is written to the cluster's
configuration every later `connect` inherits it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from ..jobs.errors import InvalidOptionError
from ..jobs.options import JobsOptions, option_error
from ..jobs.state import JobKey, check_job_id
from ..placement.roles import check_workers_per_node
from ..storage.protocols import JobQuery

__all__ = ["check_connect_arguments", "check_job_id", "check_query", "check_step_ids", "job_key"]


def job_key(scope: str, namespace: str) -> JobKey:
    """The partition, or a one-line error naming the part that is wrong."""
    try:
        return JobKey(scope=scope, namespace=namespace)
    except ValidationError as error:
        raise option_error(error, "job key") from None


def check_step_ids(step_ids: Sequence[str]) -> list[str]:
    """Step ids as a list of non-empty strings (a lone string is one id, not its letters)."""
    if isinstance(step_ids, str):
        step_ids = [step_ids]
    ids = list(step_ids)
    for step_id in ids:
        if not isinstance(step_id, str) or not step_id.strip():
            raise InvalidOptionError("steps", f"expected step ids, got {step_id!r}")
    if not ids:
        raise InvalidOptionError("steps", "names no step (leave it out for every failed step)")
    return ids


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
    workers_per_node: int | None,
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
