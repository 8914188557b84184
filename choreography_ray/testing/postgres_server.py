"""A PostgreSQL server of a test's own, to stop and start again: a storage outage for real.

    with PostgresServer() as server:
        jobs = cr.connect(server.url)
        ...
        server.stop()        # pg_ctl stop -m immediate: connections drop, nothing answers
        server.start()       # the same data directory, the same port

The server lives in a new temporary directory of its own (`initdb`), listens on 127.0.0.1 on a
port of its own and on a socket in that directory, and is stopped and deleted on leaving. It
never touches another server on the machine. The binaries come from `pg_config --bindir`, or
the newest `/usr/lib/postgresql/*/bin`; as root they run as the `postgres` user, which initdb
requires.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from ..jobs.errors import ConfigurationError


def _bin_dir() -> Path:
    found = shutil.which("pg_config")
    if found:
        answer = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(answer.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if versions:
        return versions[-1].parent
    raise ConfigurationError("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PostgresServer:
    """One PostgreSQL server in a new temporary directory, on `port` (a free one by default)."""

    def __init__(self, port: int | None = None) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="choreography-pg-"))
        self.data = self.directory / "data"
        self.port = port or free_port()
        self.bin = _bin_dir()
        self._as: list[str] = []
        if os.geteuid() == 0:  # initdb refuses root
            self._as = ["runuser", "-u", "postgres", "--"]
            user = pwd.getpwnam("postgres")
            os.chown(self.directory, user.pw_uid, user.pw_gid)
        self._initialized = False

    @property
    def url(self) -> str:
        """The storage URL of the server's `postgres` database (trust authentication)."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*self._as, *args], capture_output=True, text=True, check=False, timeout=120
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{Path(args[0]).name} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()}"
            )
        return done

    def init(self) -> None:
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        )
        self._initialized = True

    def start(self) -> None:
        """Start the server (again) and wait until it takes connections."""
        if not self._initialized:
            self.init()
        options = (
            f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=200"
        )
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.directory / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        )
        deadline = time.monotonic() + 60
        while True:
            ready = self._run(
                str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), check=False
            )
            if ready.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL on port {self.port} did not start: {ready.stdout}")
            time.sleep(0.1)

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server: `immediate` drops every connection at once, as a crash would."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    @property
    def running(self) -> bool:
        status = self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "status", check=False)
        return status.returncode == 0

    def close(self) -> None:
        """Stop the server if it runs and delete its directory."""
        if self._initialized and self.running:
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
