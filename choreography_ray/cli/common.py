"""What every command shares: the apps, the common options, and errors as one line.

Errors the user can act on (an unreachable cluster or store, an unknown job id, a bad option)
are printed as one line and end the command with a non-zero exit code; `--debug` (or
CHOREOGRAPHY_DEBUG) shows the traceback instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperGroup

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
from ..storage.retry import not_a_retry, one_line
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

EXIT_INTERRUPTED = 130
"""Ctrl-C: the command stopped, after one line saying what is safe."""

NOTHING_CHANGED = "interrupted: nothing was changed; what is stored is as it was"
_INTERRUPTED = {"line": NOTHING_CHANGED}


def on_interrupt(line: str) -> None:
    """What Ctrl-C prints from now on in this command: what is safe, and how to go on."""
    _INTERRUPTED["line"] = line


class _Commands(TyperGroup):
    """Every command: Ctrl-C at any moment prints one line and exits 130, never a traceback
    nor a bare "Aborted"; and a command that reads storage itself prints its final error as
    one line, without the retries' warnings before it."""

    def invoke(self, ctx: Any) -> Any:  # typer's own click Context
        on_interrupt(NOTHING_CHANGED)  # a command begins; what one before it set is gone
        storage_log = logging.getLogger("choreography_ray.storage")
        storage_log.addFilter(not_a_retry)
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            errors.print("\n" + _INTERRUPTED["line"], highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        finally:
            storage_log.removeFilter(not_a_retry)


app = typer.Typer(cls=_Commands, no_args_is_help=True, help="Durable jobs on Ray.")
storage_app = typer.Typer(no_args_is_help=True, help="Inspect and prepare job storage.")
jobs_app = typer.Typer(no_args_is_help=True, help="List, watch, stop, resume and remove jobs.")
app.add_typer(storage_app, name="storage")
app.add_typer(jobs_app, name="jobs")

# No markup: what is printed is text (an error's `[postgres]`, a job's details), never styles
# by accident; a style is given as one (`style=`, or `Text`).
console = Console(markup=False)
errors = Console(stderr=True, markup=False)
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
        help="Ray cluster: 'auto' (this machine), 'host:port', 'ray://host:10001', or 'none': a "
        "local Ray of the command's own (a reading command then reads --storage with no Ray).",
    ),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", envvar=CONFIG_ENV, help="TOML file with a \\[jobs] table of options."),
]
ModuleOption = Annotated[
    list[str] | None,
    typer.Option(
        "--module",
        "-m",
        help="A module that defines job types, imported to read their records (repeatable): "
        "for --address none; a cluster's own job modules are imported without it.",
    ),
]
ScopeOption = Annotated[str, typer.Option("--scope", help="Storage scope of the jobs.")]
NamespaceOption = Annotated[str, typer.Option("--namespace", help="Namespace of the jobs.")]


NO_CLUSTER = "none"
"""`--address none`: a local Ray of the command's own, or for a reading command, no Ray."""


def no_cluster(address: str | None) -> bool:
    return address is not None and address.strip().lower() == NO_CLUSTER


def ray_address(address: str | None) -> str | None:
    """The address to give Ray: None (a local Ray) for `none`."""
    return None if no_cluster(address) else address


@app.callback()
def _main(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False) -> None:
    _debug["on"] = _debug["on"] or debug


def fail(error: BaseException) -> typer.Exit:
    """Print `error` as one line; the exit to raise."""
    message = one_line(error) or type(error).__name__
    if not isinstance(error, ChoreographyError | ValueError | OSError | TimeoutError):
        message = f"{type(error).__name__}: {message} (--debug shows the traceback)"
    errors.print(error_line(redact(message)), highlight=False, soft_wrap=True)
    return typer.Exit(code=exit_code(error))


def error_line(message: str) -> Text:
    """ "error: <message>", the word in red and the message as it is."""
    return Text.assemble(("error:", "red"), " ", message)


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
    return connect(storage, address=ray_address(address), options=given, **kwargs)
