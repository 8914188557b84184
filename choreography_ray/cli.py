"""The `choreography` command.

Errors the user can act on (a bad option, an unreachable store) are printed as one line and end
the command with a non-zero exit code; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from .jobs.errors import ChoreographyError
from .jobs.options import JobsOptions
from .storage import JobQuery, open_storage
from .storage.url import redact

STORAGE_ENV = "CHOREOGRAPHY_STORAGE"
CONFIG_ENV = "CHOREOGRAPHY_CONFIG"
DEFAULT_STORAGE = "sqlite:///.choreography/jobs.db"

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Durable jobs on Ray.")
storage_app = typer.Typer(no_args_is_help=True, help="Inspect and prepare job storage.")
app.add_typer(storage_app, name="storage")

console = Console()
errors = Console(stderr=True)
_debug = False

StorageOption = Annotated[
    str,
    typer.Option(
        "--storage", envvar=STORAGE_ENV, help="Storage URL (sqlite:///…, postgresql+psycopg://…)."
    ),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", envvar=CONFIG_ENV, help="TOML file with a [jobs] table of options."),
]


@app.callback()
def _main(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False) -> None:
    global _debug
    _debug = debug


def _fail(error: BaseException) -> typer.Exit:
    message = str(error) or type(error).__name__
    errors.print(f"[red]error:[/red] {redact(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=1)


@app.command()
def options(config: ConfigOption = None) -> None:
    """Show the effective job options: defaults, then the file, then CHOREOGRAPHY_* variables."""
    try:
        loaded = JobsOptions.load(config)
    except ChoreographyError as error:
        raise _fail(error) from None
    table = Table("setting", "value", "source")
    env_values = JobsOptions.from_env()
    file_values = JobsOptions.from_toml(config) if config else {}
    for name in JobsOptions.model_fields:
        source = (
            "environment" if name in env_values else "file" if name in file_values else "default"
        )
        table.add_row(name, str(getattr(loaded, name)), source)
    console.print(table)


@storage_app.command("check")
def storage_check(
    storage: StorageOption = DEFAULT_STORAGE, scope: str = "default", namespace: str = "default"
) -> None:
    """Open the store, create its schema if needed, and count the jobs of one partition."""

    async def check() -> int:
        provider = open_storage(storage)
        try:
            await provider.initialize()
            return await provider.for_key(scope=scope, namespace=namespace).jobs.count(JobQuery())
        finally:
            await provider.close()

    try:
        count = asyncio.run(check())
    except Exception as error:
        if _debug:
            raise
        raise _fail(error) from None
    console.print(f"{redact(storage)}: reachable, {count} job(s) in {scope}/{namespace}")


def main() -> None:
    if os.environ.get("CHOREOGRAPHY_DEBUG"):
        global _debug
        _debug = True
    app()


if __name__ == "__main__":
    main()
