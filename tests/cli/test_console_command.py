"""`choreography console` over a storage URL alone: no Ray, read-only, one-line mistakes."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

from typer.testing import CliRunner

from choreography_ray.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def test_actions_without_a_cluster_are_a_usage_error(tmp_path):
    result = runner.invoke(
        app, ["console", "--storage", f"sqlite:///{tmp_path}/jobs.db", "--allow-actions"]
    )
    assert result.exit_code == 2
    assert "--allow-actions needs a cluster" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_job_module_that_does_not_import_is_a_usage_error(tmp_path):
    result = runner.invoke(
        app, ["console", "--storage", f"sqlite:///{tmp_path}/jobs.db", "-m", "no_such_module_x"]
    )
    assert result.exit_code == 2
    assert "cannot import job modules: no_such_module_x" in result.output


def test_the_console_serves_a_storage_without_ray(tmp_path):
    command = [
        sys.executable,
        "-m",
        "choreography_ray.cli",
        "console",
        "--storage",
        f"sqlite:///{tmp_path}/jobs.db",
        "--port",
        "0",
    ]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # "console: http://127.0.0.1:PORT (read-only); …"
        assert line.startswith("console: http://127.0.0.1:") and "(read-only)" in line, line
        base = line.split()[1]
        with urllib.request.urlopen(f"{base}/jobs", timeout=30) as answer:
            page = answer.read().decode()
        assert "no jobs" in page and "bound to the loopback interface" in page
        with urllib.request.urlopen(f"{base}/cluster", timeout=30) as answer:
            assert "Not connected to a cluster" in answer.read().decode()
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_command_line_loads_ray_only_for_commands_that_join_a_cluster():
    code = "import sys, choreography_ray.cli; print('ray' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"
