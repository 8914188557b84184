"""The project's mypy configuration run over a snippet: the errors a call that gets its types
wrong must raise, so a typed chain cannot quietly become untyped."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mypy_errors(source: str, where: Path) -> dict[int, str]:
    """mypy's errors over `source` (written to a file in `where`), by line; asserts that mypy
    found some (a snippet that passes checks nothing)."""
    from mypy import api

    snippet = where / "calls.py"
    snippet.write_text(source)
    out, err, status = api.run(
        ["--config-file", str(ROOT / "pyproject.toml"), "--no-error-summary", str(snippet)]
    )
    assert status == 1, out + err
    return {int(line.split(":")[1]): line for line in out.splitlines() if ": error:" in line}
