"""What every command shares: the apps, the common options, and errors as one line.

Errors the user can act on (an unreachable cluster or store, an unknown job id, a bad option)
are printed as one line and end the command with a non-zero exit code; `--debug` (or
CHOREOGRAPHY_DEBUG) shows the traceback instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from ..jobs.errors import (
    ChoreographyError,
    ClusterAuthenticationError,
    ClusterUnreachableError,
    ConfigurationError,
    JobNotFoundError,
    JobOperationError,
    StorageUnavailableError,
)
from ..jobs.options import JobsOptions
from ..storage.retry import one_line
from ..storage.url import redact

STORAGE_ENV = "CHOREOGRAPHY_STORAGE"
ADDRESS_ENV = "CHOREOGRAPHY_ADDRESS"
CONFIG_ENV = "CHOREOGRAPHY_CONFIG"
DEBUG_ENV = "CHOREOGRAPHY_DEBUG"

EXIT_FAILED = 1
"""The job ended failed (`jobs watch`), or it refused the operation, or a wait timed out."""
EXIT_USAGE = 2
"""The command was used wrongly: an unknown option, a bad value, id, status or URL."""
EXIT_NOT_FOUND = 3
"""No job has the id given."""
EXIT_UNREACHABLE = 4
"""The cluster or the storage cannot be reached (or refuses this process's token)."""

T = TypeVar("T")

app = typer.Typer(no_args_is_help=True, help="Durable jobs on Ray.")
storage_app = typer.Typer(no_args_is_help=True, help="Inspect and prepare job storage.")
jobs_app = typer.Typer(no_args_is_help=True, help="List, watch, stop, resume and remove jobs.")
app.add_typer(storage_app, name="storage")
app.add_typer(jobs_app, name="jobs")

console = Console()
errors = Console(stderr=True)
_debug = {"on": bool(os.environ.get(DEBUG_ENV))}

StorageOption = Annotated[
    str | None,
    typer.Option(
        "--storage",
        envvar=STORAGE_ENV,
        help="Storage URL (sqlite:///…, postgresql+psycopg://…, mongodb://…).",
    ),
]
AddressOption = Annotated[
    str | None,
    typer.Option(
        "--address",
        envvar=ADDRESS_ENV,
        help="Ray cluster: 'auto' (this machine), 'ray://host:10001', or none for a local Ray.",
    ),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", envvar=CONFIG_ENV, help="TOML file with a \\[jobs] table of options."),
]
ScopeOption = Annotated[str, typer.Option("--scope", help="Storage scope of the jobs.")]
NamespaceOption = Annotated[str, typer.Option("--namespace", help="Namespace of the jobs.")]


@app.callback()
def _main(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False) -> None:
    _debug["on"] = _debug["on"] or debug


def fail(error: BaseException) -> typer.Exit:
    """Print `error` as one line; the exit to raise."""
    message = (one_line(error) or type(error).__name__) + short_id_hint(error)
    if not isinstance(error, ChoreographyError | ValueError | OSError | TimeoutError):
        message = f"{type(error).__name__}: {message} (--debug shows the traceback)"
    errors.print(f"[red]error:[/red] {redact(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=exit_code(error))


def short_id_hint(error: BaseException) -> str:
    """For an unknown id that looks like the short ids `jobs list` prints: how to get the
    whole one, which commands need."""
    job_id = getattr(error, "job_id", None) if isinstance(error, JobNotFoundError) else None
    hex_digits = set("0123456789abcdef")
    if isinstance(job_id, str) and 4 <= len(job_id) < 32 and set(job_id) <= hex_digits:
        return " (a short id? commands take the whole id: `jobs list --wide` prints it)"
    return ""


def exit_code(error: BaseException) -> int:
    """The documented exit code of `error` (docs/running.md, "Exit codes")."""
    if isinstance(error, JobNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(
        error,
        StorageUnavailableError
        | ClusterUnreachableError
        | ClusterAuthenticationError
        | ConnectionError,
    ):
        return EXIT_UNREACHABLE
    if isinstance(error, JobOperationError | TimeoutError):
        return EXIT_FAILED
    if isinstance(error, ValueError | ConfigurationError):
        return EXIT_USAGE
    return EXIT_FAILED


def guard(fn: Callable[[], T]) -> T:
    """Run a command's work; turn every error into one line and a non-zero exit code."""
    try:
        return fn()
    except (typer.Exit, KeyboardInterrupt):
        raise
    except Exception as error:
        if _debug["on"]:
            raise
        raise fail(error) from None


def connect(
    storage: str | None, address: str | None, config: Path | None = None, **kwargs: Any
) -> Any:
    """The Jobs client of the cluster at `address`, with the options of the file and of
    CHOREOGRAPHY_* variables (none given, none sent)."""
    from ..runtime import connect

    options = JobsOptions.load(config)
    given = options if options.model_fields_set else None
    return connect(storage, address=address, options=given, **kwargs)
