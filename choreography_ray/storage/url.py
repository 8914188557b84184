"""Storage URLs, with the password kept out of every printed form."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ..jobs.errors import ConfigurationError

_PASSWORD = re.compile(r"(://[^:/@?#]*:)[^/?#]*@")


@dataclass(frozen=True)
class StorageURL:
    """A parsed storage URL. `str()` and `repr()` hide the password."""

    raw: str

    def __post_init__(self) -> None:
        if not isinstance(self.raw, str) or "://" not in self.raw:
            raise ConfigurationError(
                f"storage URL {redact(str(self.raw))!r} is not a URL; expected one such as "
                "memory://, sqlite:///path/jobs.db, postgresql+psycopg://user@host/db or "
                "mongodb://host:27017"
            )

    @property
    def scheme(self) -> str:
        return self.raw.split("://", 1)[0].lower()

    @property
    def dialect(self) -> str:
        return self.scheme.split("+", 1)[0]

    @property
    def query(self) -> dict[str, str]:
        return dict(parse_qsl(urlsplit(self.raw).query))

    def without_query(self) -> str:
        parts = urlsplit(self.raw)
        return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))

    @property
    def redacted(self) -> str:
        return redact(self.raw)

    def __str__(self) -> str:
        return self.redacted

    def __repr__(self) -> str:
        return f"StorageURL({self.redacted!r})"


def redact(url: str) -> str:
    """`url` with any password replaced by `***` (also in multi-host URLs)."""
    return _PASSWORD.sub(r"\1***@", url)
