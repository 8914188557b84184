"""Optional drivers: psycopg comes with the `postgres` extra, pymongo with `mongo`.

A URL that needs a missing driver fails with one line naming the extra; SQLite and memory
storage never import either.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from choreography_ray.jobs import ConfigurationError
from choreography_ray.storage import open_storage


@pytest.mark.parametrize(
    ("url", "driver", "extra"),
    [
        ("postgresql+psycopg://user:secret@db.example/jobs", "psycopg", "postgres"),
        ("postgresql://user:secret@db.example/jobs", "psycopg", "postgres"),
        ("mongodb://user:secret@db.example:27017/jobs", "pymongo", "mongo"),
        ("mongodb+srv://user:secret@cluster.example/jobs", "pymongo", "mongo"),
        ("mongomock://localhost/jobs", "pymongo", "mongo"),
    ],
)
def test_a_url_whose_driver_is_missing_names_the_extra_to_install(monkeypatch, url, driver, extra):
    monkeypatch.setitem(sys.modules, driver, None)  # `import driver` now raises ImportError
    with pytest.raises(ConfigurationError) as refused:
        open_storage(url)
    message = str(refused.value)
    assert f"pip install 'choreography-ray[{extra}]'" in message
    assert driver in message
    assert "\n" not in message
    assert "secret" not in message


def test_sqlite_and_memory_storage_work_without_either_driver():
    # A fresh interpreter, so that no earlier test has imported a driver already.
    script = textwrap.dedent(
        """
        import asyncio, sys, tempfile
        sys.modules["psycopg"] = None
        sys.modules["pymongo"] = None
        sys.modules["bson"] = None
        from choreography_ray.storage import open_storage

        async def main():
            with tempfile.TemporaryDirectory() as folder:
                for url in (f"sqlite:///{folder}/jobs.db", "memory://drivers"):
                    provider = open_storage(url)
                    await provider.initialize()
                    print(url.split(":")[0], await provider.for_key().jobs.count())
                    await provider.close()

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["sqlite", "0", "memory", "0"]


def test_a_provider_that_cannot_be_imported_names_the_missing_module(monkeypatch):
    package = "choreography_ray.storage.sql"
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)  # a dependency, not an extra's driver
    with pytest.raises(ConfigurationError) as refused:
        open_storage("sqlite:///jobs.db")
    message = str(refused.value)
    assert message == (
        "storage URL 'sqlite:///jobs.db': its provider choreography_ray.storage.sql cannot be "
        "imported: module 'sqlalchemy' is missing"
    )
