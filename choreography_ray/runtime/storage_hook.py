"""A testing hook of the host actors: their job storage wrapped by a callable you name, so a
fault can be injected into a real Ray cluster (`MultiNodeCluster`) as `InProcessCluster(
wrap_storage=...)` does in-process. It lives in the runtime, which applies it, and is named to
tests from `testing.hooks`: the runtime imports nothing of `testing`.

    runtime_env={"env_vars": {STORAGE_WRAPPER_ENV: "choreography_ray.testing.faults:lost_acks"}}

The environment variable names a `module:callable` that takes a partition's `JobsStorage` and
returns the one the controller host's jobs use. It is never set by the job system: unset (the
default, and in production) a host uses its storage as it is, and nothing is imported. A name
that cannot be used fails the host's start, naming the variable.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable

from ..jobs.errors import ConfigurationError
from ..jobs.options import CALLABLE_NAME
from ..jobs.state import JobKey
from ..storage.protocols import JobsStorage

STORAGE_WRAPPER_ENV = "CHOREOGRAPHY_TESTING_STORAGE_WRAPPER"
"""Names the `module:callable` that wraps a controller host's job storage (tests only)."""

log = logging.getLogger("choreography_ray.runtime")

PartitionStorage = Callable[[JobKey], JobsStorage]


def storage_wrapper(name: str) -> Callable[[JobsStorage], JobsStorage]:
    """The callable `name` (`module:callable`) names; `ConfigurationError` when there is none."""
    what = f"{STORAGE_WRAPPER_ENV}={name!r}"
    if not CALLABLE_NAME.match(name.strip()):
        raise ConfigurationError(f"{what}: expected a callable as module:callable")
    module_name, _, attribute = name.strip().partition(":")
    try:
        found: object = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except Exception as error:
        raise ConfigurationError(f"{what}: {type(error).__name__}: {error}") from error
    if not callable(found):
        raise ConfigurationError(f"{what}: {attribute} is not callable")
    return found


def hooked_storage(for_key: PartitionStorage, host: str) -> PartitionStorage:
    """`for_key` itself, unless `STORAGE_WRAPPER_ENV` names a wrapper: then every partition's
    storage goes through it (and the host logs that a testing hook is active)."""
    name = os.environ.get(STORAGE_WRAPPER_ENV, "").strip()
    if not name:
        return for_key
    wrap = storage_wrapper(name)
    log.warning("%s: testing hook %s=%s wraps its job storage", host, STORAGE_WRAPPER_ENV, name)
    return lambda key: wrap(for_key(key))
