"""`connect`: join or start Ray, configure the cluster's job system, start its hosts.

Nothing reaches the cluster before it is known to work: the arguments are checked and the
storage opened in this process first, so a typo in a URL or a database that is down fails here,
in one line, and leaves the cluster's configuration as it was. A failure while the hosts start
puts the previous configuration back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

from ..jobs.errors import (
    ChoreographyError,
    ClusterAuthenticationError,
    ClusterUnreachableError,
    ConfigurationError,
    StorageUnavailableError,
)
from ..jobs.options import JobsOptions
from ..jobs.state import JobKey
from .arguments import check_connect_arguments
from .client import Jobs
from .config import (
    DEFAULT_STORAGE,
    ClusterConfig,
    check_same_storage,
    merge,
    read_config,
    restore_config,
    taking_down,
    write_config,
)
from .constants import NAMESPACE
from .packages import runtime_packages
from .placement import roles_of_node as roles_of_node  # one node's roles: a node that joins
from .placement import start_hosts, stop_hosts
from .reachability import auth_message, check_reachable
from .remote import first_line, last_raised, project_error


def connect(
    storage: str | None = None,
    *,
    address: str | None = None,
    namespace: str = NAMESPACE,
    options: JobsOptions | None = None,
    modules: list[str] | tuple[str, ...] = (),
    max_parallel_steps: int | None = None,
    workers_per_node: int | None = None,
    runtime_env: dict[str, Any] | None = None,
) -> Jobs:
    """Connect to the job system of a Ray cluster, starting what is missing.

    `address`: None lets Ray decide (RAY_ADDRESS, else a cluster started with `ray start` on
    this machine, else a new local Ray); "auto" joins a running cluster on this machine;
    "host:port" or "ray://host:10001" joins that one. `storage` is needed the first time a
    cluster is used (it defaults to SQLite under .choreography/ then); later connections may
    leave it out, and may not name another. `modules` are imported by every host, so the job
    types they define resolve; a job class's own module is added when it is started.
    `workers_per_node`: worker hosts on each worker node; None (the default) runs one per CPU
    of each node, at least 1 and at most `engine.limits.MAX_WORKER_HOSTS` (docs/configuration.md).
    The first `connect` of a cluster sets it; a later one may leave it out, and changes it only
    after `choreography down`.
    """
    max_parallel_steps = check_connect_arguments(
        address=address,
        namespace=namespace,
        options=options,
        modules=modules,
        max_parallel_steps=max_parallel_steps,
        workers_per_node=workers_per_node,
        runtime_env=runtime_env,
    )
    if storage is not None:
        probe_storage(storage)
    init_ray(address, namespace, runtime_env)
    previous = read_config(namespace)
    config = _wanted_config(previous, storage, options, list(modules), runtime_packages())
    if previous is not None:
        config = _placed(previous, config, workers_per_node, namespace)
    else:
        config = config.model_copy(
            update={"max_parallel_steps": max_parallel_steps, "workers_per_node": workers_per_node}
        )
    if config is not previous:
        write_config(config, namespace)
    try:
        start_hosts(namespace, max_parallel_steps, workers_per_node)
    except BaseException as error:
        if previous is None:
            stop_hosts(namespace)  # hosts started with a configuration that is taken back
        restore_config(previous, namespace)
        if isinstance(error, ChoreographyError):
            raise
        mapped = project_error(error, "starting the hosts")
        if mapped is error:
            raise
        raise mapped from error
    return Jobs(namespace)


def _wanted_config(
    previous: ClusterConfig | None,
    storage: str | None,
    options: JobsOptions | None,
    modules: list[str],
    packages: list[str],
) -> ClusterConfig:
    """The configuration to run with: a new one, or `previous` if nothing changes. `packages`
    are this process's runtime env packages, recorded with `modules` (runtime/packages.py)."""
    if previous is None:
        if storage is None:
            probe_storage(DEFAULT_STORAGE)
        return ClusterConfig(
            storage=storage or DEFAULT_STORAGE,
            options=(options or JobsOptions()).model_dump(mode="json", exclude_unset=True),
            modules=modules,
            packages={m: packages for m in modules} if packages else {},
            keys=[JobKey()],  # the default partition is always recovered
        )
    check_same_storage(previous, storage)
    if options is not None:
        wanted = options.model_dump(mode="json", exclude_unset=True)
        if wanted != previous.options:
            raise ConfigurationError(
                f"this Ray cluster's job system already runs with options {previous.options}; "
                f"it cannot switch to {wanted} while its hosts run (use `choreography down` "
                "first, or another namespace)"
            )
    return merge(previous, modules=modules, keys=[], packages=packages)


def _placed(
    previous: ClusterConfig, config: ClusterConfig, workers_per_node: int | None, namespace: str
) -> ClusterConfig:
    """`config` with the worker hosts per node a later `connect` names: the cluster's own when
    it names none or the same; another only while the hosts are down (`choreography down`),
    since running hosts were placed by it and every node that joins is placed by it too."""
    if workers_per_node is None or workers_per_node == previous.workers_per_node:
        return config
    if not taking_down(namespace):
        running = (
            f"workers_per_node={previous.workers_per_node}"
            if previous.workers_per_node is not None
            else "workers_per_node unset (one worker host per CPU of each node)"
        )
        raise ConfigurationError(
            f"this Ray cluster's job system already runs with {running}; it cannot switch to "
            f"{workers_per_node} while its hosts run (use `choreography down` first, or "
            "another namespace)"
        )
    return config.model_copy(update={"workers_per_node": workers_per_node})


def probe_storage(url: str) -> None:
    """Open the store once in this process, so a bad URL or a dead database fails here.

    `memory://` lives in a cluster actor, so there is nothing to open yet. Any other URL's
    scheme is checked as it is opened (known, and its driver installed), in one line.
    """
    from ..storage.schemes import open_storage
    from ..storage.url import StorageURL

    parsed = StorageURL(url)
    if parsed.scheme == "memory":
        return
    options = JobsOptions(transient_retry_attempts=1)

    async def probe() -> None:
        provider = open_storage(parsed, options=options)
        try:
            await provider.initialize()
        finally:
            await provider.close()

    try:
        # On a thread of its own: `connect` may be called where an event loop runs.
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, probe()).result()
    except ConfigurationError:
        raise
    except Exception as error:
        cause = error.__cause__ if isinstance(error, ChoreographyError) else error
        cause = cause or error
        raise StorageUnavailableError(
            f"cannot reach storage {parsed.redacted}: {type(cause).__name__}: "
            f"{first_line(str(cause))}"
        ) from error


# -- Ray --------------------------------------------------------------------------------------


def init_ray(
    address: str | None, namespace: str, runtime_env: dict[str, Any] | None = None
) -> None:
    """Join the cluster at `address` (or start a local Ray), unless this process already has;
    an unreachable cluster or a refused token is a one-line `ConfigurationError`."""
    if ray.is_initialized():
        return
    gcs = check_reachable(address)
    if gcs is not None:
        _check_authenticated(gcs, address or gcs)
    try:
        ray.init(
            address=address,
            namespace=namespace,
            runtime_env=runtime_env,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    except ray.exceptions.AuthenticationError:
        raise ClusterAuthenticationError(auth_message(address)) from None
    except ConnectionError as error:
        if is_authentication_failure(error):
            raise ClusterAuthenticationError(auth_message(address)) from None
        raise ClusterUnreachableError(
            f"cannot reach the Ray cluster at {address!r}: {last_raised(str(error))}"
        ) from None


def _check_authenticated(gcs_address: str, address: str) -> None:
    """Ask the cluster's GCS once whether it lets this process in.

    A cluster with token authentication refuses a process without its token on every call, and
    `ray.init` retries that for 20 seconds before it gives up with "Failed to connect". One
    request tells at once; any other failure is left for `ray.init` to report.
    """
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # not in Ray's _raylet.pyi

    with quiet_stderr():
        try:
            GcsClient(address=gcs_address)
        except ray.exceptions.AuthenticationError:
            raise ClusterAuthenticationError(auth_message(address)) from None
        except Exception:
            return


def is_authentication_failure(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is a cluster refusing this process's token.

    Ray 2.60 raises `ray.exceptions.AuthenticationError` ("InvalidAuthToken: Authentication
    token is missing or incorrect") from its GCS client, and `ray.init` wraps it in a
    `ConnectionError` whose cause carries that text.
    """
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ray.exceptions.AuthenticationError):
            return True
        text = str(seen)
        if "InvalidAuthToken" in text or "ray.exceptions.AuthenticationError" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Ray's C++ client logs each refused request to the process's stderr: keep the one
    probe request out of the user's terminal."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)
