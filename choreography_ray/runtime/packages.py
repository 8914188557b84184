"""Job modules that came with a Ray job submission, importable outside it.

`ray job submit --working-dir DIR` (or a `runtime_env` with a `working_dir` or `py_modules`)
zips the directory into Ray's control store as a package, `gcs://_ray_pkg_<hash>.zip`, and runs
the driver, and every actor it starts, in an unpacked copy: the hosts that a submission starts
import its job modules from there. A process outside the submission (`choreography jobs list`
on the head node, the console) has no copy, and the module is not installed there. So the
client records the packages of its runtime env with each job module it names, in the cluster's
configuration, and a process that cannot import a module from its own environment fetches
those packages from the control store and imports the module from them, as a Ray worker would.

A package lives in the control store while a job or a detached actor uses it (the hosts the
submission started), so it is there as long as those hosts run.
"""

from __future__ import annotations

import atexit
import io
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

PackageFetch = Callable[[str], bytes | None]
"""The bytes of a `gcs://` package from the cluster's control store; None when it is gone."""

_unpacked: dict[str, Path] = {}
"""Packages this process has put on its import path, by URI."""
_root: list[Path] = []


def runtime_packages() -> list[str]:
    """The `gcs://` zip packages of this process's runtime env (its working_dir first, then its
    py_modules), as Ray uploaded them; none outside a runtime env or before joining Ray."""
    import ray

    if not ray.is_initialized():
        return []
    try:
        env = ray.get_runtime_context().runtime_env
    except Exception:  # a Ray Client, or a Ray mid-start: then nothing is recorded
        return []
    found = [env.get("working_dir"), *(env.get("py_modules") or [])]
    return [uri for uri in found if _is_package(uri)]


def _is_package(uri: object) -> bool:
    return isinstance(uri, str) and uri.startswith("gcs://") and uri.endswith(".zip")


def fetch_joined(uri: str) -> bytes | None:
    """`PackageFetch` for a process that has joined the cluster."""
    from ray.experimental import internal_kv

    return internal_kv._internal_kv_get(uri)


def use_packages(uris: list[str], fetch: PackageFetch) -> list[str]:
    """Put the packages on this process's import path (each fetched and unpacked once); the
    ones no longer in the cluster."""
    gone = []
    for uri in uris:
        if uri in _unpacked or not _is_package(uri):
            continue
        data = fetch(uri)
        if data is None:
            gone.append(uri)
            continue
        # Named after the URI, as Ray names its own copies; Ray's packages are zips of the
        # directory's contents, so the directory itself is what goes on the path.
        name = uri.removeprefix("gcs://").removesuffix(".zip").replace("/", "_")
        target = _private_root() / name
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            archive.extractall(target)
        _unpacked[uri] = target
        sys.path.insert(0, str(target))
    return gone


def _private_root() -> Path:
    """A directory only this process writes (code is imported from it), removed at exit."""
    if not _root:
        _root.append(Path(tempfile.mkdtemp(prefix="choreography-packages-")))
        atexit.register(shutil.rmtree, _root[0], ignore_errors=True)
    return _root[0]
