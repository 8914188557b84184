"""Records as MongoDB documents: sub-documents where BSON holds them, JSON text otherwise."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def bson_safe(value: Any) -> bool:
    """Whether BSON holds `value` (JSON data) as a document that reads back equal."""
    if isinstance(value, dict):
        return all(
            isinstance(k, str)
            and not k.startswith("$")
            and "." not in k
            and "\0" not in k
            and bson_safe(v)
            for k, v in value.items()
        )
    if isinstance(value, list):
        return all(bson_safe(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, int):
        return True
    return _INT64_MIN <= value <= _INT64_MAX


def storable(document: dict[str, Any]) -> dict[str, Any] | str:
    return document if bson_safe(document) else json.dumps(document, separators=(",", ":"))


def raw_record(value: Any) -> dict[str, Any] | str:
    """What the codec decodes from a stored `state`/`entry`; anything odd fails as malformed."""
    if isinstance(value, dict | str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "null"


def stored_version(document: Mapping[str, Any]) -> int:
    value = document.get("version")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def step_key(job_id: str, step_id: str) -> dict[str, str]:
    return {"jobId": job_id, "stepId": step_id}
