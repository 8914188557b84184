"""Job modules that came with a submission: imported from its package where they are missing."""

from __future__ import annotations

import io
import sys
import zipfile
from collections.abc import Iterator

import pytest

from choreography_ray.jobs.state import JobKey
from choreography_ray.runtime import packages
from choreography_ray.runtime.config import ClusterConfig, import_modules, merge

PACKAGE = "gcs://_ray_pkg_0123abcd.zip"
MODULE = "submitted_jobs_for_test"


def _zip(**files: str) -> bytes:
    """A package as Ray uploads a working directory: the directory's files at the top."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buffer.getvalue()


@pytest.fixture
def fresh() -> Iterator[None]:
    """The module and the package unknown to this process before and after the test."""
    path = list(sys.path)
    yield
    sys.modules.pop(MODULE, None)
    packages._unpacked.pop(PACKAGE, None)
    sys.path[:] = path


def test_a_missing_module_is_imported_from_the_package_it_was_submitted_with(fresh) -> None:
    asked: list[str] = []

    def fetch(uri: str) -> bytes | None:
        asked.append(uri)
        return _zip(**{f"{MODULE}.py": "ANSWER = 42\n"})

    imported, failed = import_modules([MODULE], packages={MODULE: [PACKAGE]}, fetch=fetch)
    assert (imported, failed) == ([MODULE], [])
    assert sys.modules[MODULE].ANSWER == 42
    assert import_modules([MODULE], packages={MODULE: [PACKAGE]}, fetch=fetch)[0] == [MODULE]
    assert asked == [PACKAGE]  # fetched and unpacked once


def test_a_package_the_cluster_no_longer_holds_is_named_in_the_failure(fresh) -> None:
    _, [failure] = import_modules(
        [MODULE], packages={MODULE: [PACKAGE]}, fetch=lambda uri: None, quiet=True
    )
    assert failure.startswith(f"{MODULE}: ModuleNotFoundError: No module named '{MODULE}'")
    assert f"no longer holds the package it was submitted with ({PACKAGE})" in failure


def test_a_module_this_process_has_is_not_fetched() -> None:
    def fetch(uri: str) -> bytes | None:
        raise AssertionError("fetched a package for a module that imports")

    assert import_modules(["json"], packages={"json": [PACKAGE]}, fetch=fetch) == (["json"], [])


def test_the_packages_of_the_process_that_names_a_module_are_recorded_with_it() -> None:
    config = ClusterConfig(storage="memory://", modules=["a"], keys=[JobKey()])
    assert merge(config, modules=["a"], keys=[]) is config  # outside a runtime env: as it was
    named = merge(config, modules=["a", "b"], keys=[], packages=[PACKAGE])
    assert named.modules == ["a", "b"]
    assert named.packages == {"a": [PACKAGE], "b": [PACKAGE]}
    assert merge(named, modules=["a"], keys=[], packages=[PACKAGE]) is named
    later = "gcs://_ray_pkg_4567ef.zip"  # the module submitted again, changed
    assert merge(named, modules=["a"], keys=[], packages=[later]).packages["a"] == [later]
