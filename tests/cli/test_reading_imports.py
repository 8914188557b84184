"""`jobs show`, `jobs list` and `jobs steps` against a cluster address import no Ray: importing
it is half a second of the command's CPU, twice that in wall time on a busy machine (issue 23).
The command's path (its modules, the control store's client, the storage it opens) is
imported in a new process, which then says what it loaded; `tests/runtime/test_cli.py` runs
the commands themselves against a cluster and checks the same."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("ray", "rich.markdown", "typer.rich_utils")
"""Modules a reading command does not need: Ray, and what only help and errors render."""


def test_the_reading_path_loads_no_ray():
    script = (
        "import json, sys\n"
        "import choreography_ray.cli\n"
        "from choreography_ray.runtime import cluster_storage, control_store\n"
        "import choreography_ray.storage.sql\n"  # the provider of a SQLite or SQL store
        "from choreography_ray.jobs.errors import ClusterUnreachableError\n"
        "try:\n"
        "    control_store.ControlStore('127.0.0.1:1')\n"  # what its client imports
        "except ClusterUnreachableError:\n"
        "    pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(done.stdout) == []
