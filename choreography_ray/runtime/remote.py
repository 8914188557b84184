"""Ray's failures turned into the project's one-line errors.

A host raising anything but a `ChoreographyError` reaches the caller as a `RayTaskError` whose
text is the host's whole traceback, with terminal colour codes; a host that dies gives an
`ActorDiedError` of a dozen lines. Users get one line naming what failed; the traceback stays in
the host's log, and `--debug` shows the driver's side.
"""

from __future__ import annotations

import re

import ray

from ..jobs.errors import ChoreographyError, HostError

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAISED = re.compile(r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception)\b.*?:\s")


def first_line(text: str) -> str:
    """The first non-empty line of `text`, without terminal colour codes."""
    for line in _ANSI.sub("", text).splitlines():
        if line.strip():
            return line.strip()
    return ""


def last_raised(text: str) -> str:
    """The `SomeError: message` line a traceback ends with, or the first line of `text`."""
    lines = [line.strip() for line in _ANSI.sub("", text).splitlines() if line.strip()]
    for line in reversed(lines):
        if _RAISED.match(line):
            return line
    return lines[0] if lines else ""


def is_host_gone(error: BaseException) -> bool:
    """Whether the actor called is dead or unreachable (not: whether the call failed)."""
    return isinstance(error, ray.exceptions.RayActorError)


def project_error(error: BaseException, what: str) -> BaseException:
    """The error to raise to the caller for `error`, raised by `what` (say, "jobs.remove")."""
    if isinstance(error, ray.exceptions.RayTaskError):
        cause = error.cause
        if isinstance(cause, ChoreographyError):
            return cause
        if cause is not None:
            text = first_line(str(cause)) or "(no message)"
            return HostError(f"{what} failed on the host: {type(cause).__name__}: {text}")
        return HostError(f"{what} failed on the host: {last_raised(str(error))}")
    if is_host_gone(error):
        detail = last_raised(str(error))
        return HostError(f"{what}: the host actor died or is unreachable: {detail}")
    return error
