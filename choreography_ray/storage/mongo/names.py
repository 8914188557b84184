"""Database names of MongoDB partitions: one database per (scope, namespace), from a prefix."""

from __future__ import annotations

import hashlib
import re
from urllib.parse import unquote, urlsplit

from ...jobs.errors import ConfigurationError
from ...jobs.state import DEFAULT_NAMESPACE, JobKey
from ..url import StorageURL

DEFAULT_PREFIX = "choreography"
MAX_DATABASE_NAME_BYTES = 63
PLAN_BATCH = 1_000
"""Plan entries inserted per round trip."""

_HASH_HEX = 24
_FORBIDDEN = re.compile(r'[/\\. "$*<>:|?\x00]')
_HASHED_LOOKALIKE = re.compile(rf"h[0-9a-f]{{{_HASH_HEX}}}")
_MAX_PREFIX_BYTES = MAX_DATABASE_NAME_BYTES - len("+h") - _HASH_HEX

# -- database names ------------------------------------------------------------------------------


def database_name(prefix: str, key: JobKey) -> str:
    """The database of one partition.

    `{prefix}+{scope}` for the default namespace, else `{prefix}+{scope}+{namespace}`. When that
    name is not one MongoDB accepts or could be mistaken for another partition's, the name is
    `{prefix}+h{first 24 hex digits of sha256(scope + "\\0" + namespace)}` instead: deterministic,
    so every host finds the same database, and 96 bits against collisions. That happens when
    scope or namespace

    - holds a character MongoDB forbids in database names (``/\\. "$*<>:|?`` or NUL),
    - holds `+`, which would make two partitions share a name (`a+b`/default and `a`/`b`),
    - holds an upper-case letter, since MongoDB refuses two databases whose names differ only
      in case,
    - looks like a hashed name itself (`h` and 24 hex digits, in the default namespace),

    or when the name would be longer than 63 bytes (UTF-8).
    """
    parts = [key.scope] if key.namespace == DEFAULT_NAMESPACE else [key.scope, key.namespace]
    readable = "+".join([prefix, *parts])
    if (
        any(_FORBIDDEN.search(part) or "+" in part or part != part.lower() for part in parts)
        or (len(parts) == 1 and _HASHED_LOOKALIKE.fullmatch(parts[0]))
        or len(readable.encode()) > MAX_DATABASE_NAME_BYTES
    ):
        digest = hashlib.sha256(f"{key.scope}\0{key.namespace}".encode()).hexdigest()
        return f"{prefix}+h{digest[:_HASH_HEX]}"
    return readable


def prefix_of(url: StorageURL) -> str:
    path = unquote(urlsplit(url.without_query()).path).strip("/")
    prefix = path or DEFAULT_PREFIX
    if _FORBIDDEN.search(prefix) or len(prefix.encode()) > _MAX_PREFIX_BYTES:
        raise ConfigurationError(
            f"storage URL {url.redacted!r}: the database prefix {prefix!r} must be at most "
            f'{_MAX_PREFIX_BYTES} bytes without any of / \\ . space " $ * < > : | ? '
            "(each partition gets a database named after it)"
        )
    return prefix
