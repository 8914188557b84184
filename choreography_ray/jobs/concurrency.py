"""Concurrency keys: at most `max_running` jobs of one key run at once across the cluster.

The author's side: a job class names its key as a field of its request or a callable over
the request, and a limit per key:

    class Export(Job[ExportRequest], name="export"):
        concurrency = ConcurrencyKey("tenant", max_running=2)

`Jobs.start(..., concurrency_key="tenant-a")` names the key of one job instead. How the limit
is kept is the engine's (`engine.concurrency`); docs/scheduling.md says what it guarantees.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from .errors import InvalidOptionError, TypeRegistryError

MAX_KEY_LENGTH = 200


def check_key(value: Any) -> str:
    """A key's value: printable text of 1 to 200 characters, else a one-line error."""
    if not isinstance(value, str) or not value or not value.isprintable():
        raise InvalidOptionError("concurrency_key", f"expected printable text, got {value!r}")
    if len(value) > MAX_KEY_LENGTH or value != value.strip():
        raise InvalidOptionError(
            "concurrency_key",
            f"must be at most {MAX_KEY_LENGTH} characters, without spaces at either end",
        )
    return value


@dataclass(frozen=True)
class ConcurrencyKey:
    """The key of a job class's jobs and how many of one key may run at once."""

    key: str | Callable[[Any], str]
    """A field of the request, or a callable that takes the request and returns the key."""
    max_running: int

    def __post_init__(self) -> None:
        if isinstance(self.max_running, bool) or not isinstance(self.max_running, int):
            raise TypeRegistryError(f"max_running must be a whole number, not {self.max_running!r}")
        if self.max_running < 1:
            raise TypeRegistryError(f"max_running must be at least 1, not {self.max_running}")
        if not (callable(self.key) or (isinstance(self.key, str) and self.key)):
            raise TypeRegistryError(
                f"a concurrency key is a request field's name or a callable, not {self.key!r}"
            )

    def check(self, request_type: type[BaseModel], owner: str) -> None:
        """A key naming a field the request does not have is refused when the class is made."""
        if isinstance(self.key, str) and self.key not in request_type.model_fields:
            raise TypeRegistryError(
                f"{owner}: concurrency key {self.key!r} is not a field of "
                f"{request_type.__qualname__}"
            )

    def of(self, request: BaseModel) -> str:
        """The key of a job started with `request`."""
        try:
            value = getattr(request, self.key) if isinstance(self.key, str) else self.key(request)
        except Exception as error:
            raise InvalidOptionError(
                "concurrency_key", f"the key of this request could not be read: {error!r}"
            ) from error
        return check_key(value if isinstance(value, str) else str(value))
