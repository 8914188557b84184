"""Every Python example in docs/ runs as written, in a fresh interpreter."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _examples() -> list[tuple[str, str]]:
    found = []
    for page in sorted(DOCS.glob("*.md")):
        for number, match in enumerate(BLOCK.finditer(page.read_text()), start=1):
            code = match.group(1)
            if "# not run" in code.splitlines()[0]:
                continue
            found.append((f"{page.name}#{number}", code))
    return found


@pytest.mark.parametrize(("where", "code"), _examples(), ids=[w for w, _ in _examples()])
def test_a_documented_example_runs(where, code, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{where} failed:\n{result.stderr}"
