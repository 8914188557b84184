"""The type registry: stable names for the classes whose instances are stored.

A stored record names its job type, its step type and the types of its request, state and
result. Reading a record resolves those names here and nowhere else: a name that is not
registered is reported as unknown and never imported, so a tampered record cannot make a host
load or run code.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, JsonValue, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, from_json, to_json

from .errors import (
    ChoreographyError,
    InvalidRequestError,
    MalformedRecordError,
    TypeAlreadyRegisteredError,
    TypeRegistryError,
    UnknownTypeError,
)

T = TypeVar("T", bound=type)
_M = TypeVar("_M", bound=BaseModel)


class TypeKind(StrEnum):
    JOB = "job"
    STEP = "step"
    REQUEST = "request"
    STATE = "state"
    RESULT = "result"


_MODEL_KINDS = frozenset({TypeKind.REQUEST, TypeKind.STATE, TypeKind.RESULT})


def trusted(cls: type[_M], **values: Any) -> _M:
    """An instance built from values that are already valid, every field given.

    What `model_construct` does, without its per-field search for aliases and defaults: the
    engine builds several of these per step (status changes, payloads, prepared records) on its
    hottest path, and `model_construct` there costs about a sixth more CPU per no-op step
    (docs/decisions.md). The caller gives every field; all of them count as set, in one set
    shared by every instance of the class (`trusted_sharing`): building a set per instance took
    a sixth of this call, and a step record's set of 17 names is larger than the rest of it.
    """
    fields = shared_fields(cls)
    return trusted_sharing(cls, fields if len(values) == len(fields) else set(values), values)


def shared_fields(cls: type[BaseModel]) -> set[str]:
    """The names of all the fields of `cls`, in one set that `trusted` shares between every
    instance it builds of the class (never to be changed)."""
    fields = _ALL_FIELDS.get(cls)
    if fields is None:
        fields = _ALL_FIELDS.setdefault(cls, set(cls.model_fields))
    return fields


_ALL_FIELDS: dict[type[BaseModel], set[str]] = {}
"""Per model class, the names of all its fields: the fields set `trusted` shares."""


def trusted_sharing(cls: type[_M], fields_set: set[str], values: dict[str, Any]) -> _M:
    """`trusted`, with one `fields_set` shared by every instance built with it.

    For records built by the hundred thousand and never assigned to, such as a plan's entries
    and their payloads: a set of six names is about 470 bytes, a third of what a planned step
    took in memory, and a million-step plan is held whole while it is saved. `fields_set` must
    name every field of `values` (assignment then only adds a name already there)."""
    instance = _new(cls)
    _set_dict(instance, values)
    _set_fields_set(instance, fields_set)
    _set_extra(instance, None)
    _set_private(instance, None)
    return instance


def snapshot(model: _M) -> _M:
    """A shallow copy of `model` as it is now, for a reader that never assigns to it (a batch
    being encoded while its records change). `model_copy` also copies the fields set and the
    private and extra values, and took 3.5 µs a step record where this takes 1.9 µs."""
    return trusted_sharing(type(model), model.__pydantic_fields_set__, dict(model.__dict__))


# BaseModel's own slots (its `__dict__` among them), set through their descriptors: `object.
# __setattr__` looks each up first, and this took 0.34 µs a record against its 0.47.
_new = object.__new__
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


class Payload(BaseModel):
    """A stored pydantic value: the registered name of its class and its JSON data."""

    model_config = ConfigDict(frozen=True)

    type: str
    data: JsonValue


_PAYLOAD_FIELDS = {"type", "data"}
"""The fields set every payload `TypeRegistry.dump` builds shares (`trusted_sharing`)."""

_MODEL_VALIDATE = BaseModel.model_validate.__func__  # type: ignore[attr-defined]
"""pydantic's own `model_validate`: a class that keeps it is loaded by its validator at once."""


class TypeRegistry:
    """Maps stable names to classes, per kind, and back."""

    def __init__(self) -> None:
        self._by_name: dict[str, tuple[TypeKind, type]] = {}
        self._by_class: dict[type, str] = {}
        self._lock = threading.Lock()

    def register(self, cls: type, *, kind: TypeKind | str, name: str | None = None) -> type:
        """Register `cls` under `name` (default: its qualified module path).

        Registering the same class under the same name again is a no-op, so modules can be
        re-imported; another class under a taken name is an error.
        """
        kind = TypeKind(kind)
        if not isinstance(cls, type):
            raise TypeRegistryError(f"{cls!r} cannot be registered as a {kind} type: not a class")
        if kind in _MODEL_KINDS and not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            raise TypeRegistryError(
                f"{cls!r} cannot be registered as a {kind} type: it must be a pydantic model"
            )
        name_given = name
        name = f"{cls.__module__}.{cls.__qualname__}" if name is None else name
        if not name or not name.strip():
            raise TypeRegistryError(f"{cls!r}: a registered name must not be empty")
        with self._lock:
            known = self._by_class.get(cls)
            if known is not None and (name_given is None or name_given == known):
                known_kind = self._by_name[known][0]
                if known_kind == kind or _kinds_match(known_kind, kind):
                    # One model class can be a request of one step and the state of another.
                    return cls
            existing = self._by_name.get(name)
            if existing is not None:
                if existing[1] is cls and existing[0] == kind:
                    return cls
                if _same_definition(existing[1], cls) and existing[0] == kind:
                    # A re-executed module (notebook cell, reload) redefines the class.
                    self._by_class.pop(existing[1], None)
                else:
                    raise TypeAlreadyRegisteredError(
                        f"the name {name!r} is already registered for {existing[1]!r} "
                        f"({existing[0]}); choose another name for {cls!r}"
                    )
            previous = self._by_class.get(cls)
            if previous is not None and previous != name:
                raise TypeAlreadyRegisteredError(
                    f"{cls!r} is already registered as {previous!r}; a class has one name"
                )
            self._by_name[name] = (kind, cls)
            self._by_class[cls] = name
        return cls

    def registrar(self, kind: TypeKind | str, name: str | None = None) -> Callable[[T], T]:
        """A class decorator form of `register`."""

        def decorate(cls: T) -> T:
            self.register(cls, kind=kind, name=name)
            return cls

        return decorate

    def resolve(self, name: str, kind: TypeKind | str | None = None) -> type:
        """The class registered under `name`; `UnknownTypeError` when there is none."""
        entry = self._by_name.get(name)
        if entry is None or (kind is not None and not _kinds_match(entry[0], _kind(kind))):
            raise UnknownTypeError(name, str(TypeKind(kind)) if kind is not None else None)
        return entry[1]

    def knows(self, name: str, kind: TypeKind | str | None = None) -> bool:
        entry = self._by_name.get(name)
        return entry is not None and (kind is None or _kinds_match(entry[0], _kind(kind)))

    def name_of(self, cls: type) -> str:
        """The registered name of `cls`."""
        try:
            return self._by_class[cls]
        except KeyError:
            raise TypeRegistryError(
                f"{cls.__module__}.{cls.__qualname__} is not registered; register it before "
                "storing its instances"
            ) from None

    def kind_of(self, name: str) -> TypeKind:
        entry = self._by_name.get(name)
        if entry is None:
            raise UnknownTypeError(name)
        return entry[0]

    def names(self, kind: TypeKind | str | None = None) -> list[str]:
        wanted = TypeKind(kind) if kind is not None else None
        return sorted(n for n, (k, _) in self._by_name.items() if wanted is None or k == wanted)

    def dump(self, value: BaseModel) -> Payload:
        """Wrap a registered model instance for storage.

        The data comes straight from pydantic's JSON mode, so it is not validated again.
        """
        cls = type(value)
        name = self._by_class.get(cls)
        if name is None:
            name = self.name_of(cls)  # raises, naming the class
        if cls.model_dump is BaseModel.model_dump:
            # What model_dump does, without its keywords: passing them cost a microsecond.
            data = cls.__pydantic_serializer__.to_python(value, mode="json")
        else:
            data = value.model_dump(mode="json")  # its own decides what is stored
        return trusted_sharing(Payload, _PAYLOAD_FIELDS, {"type": name, "data": data})

    def dump_request(self, value: BaseModel) -> Payload:
        """`dump`, refusing a request that would not read back from storage as it was planned.

        Recovery rebuilds requests from the stored JSON, never from the objects given, so the
        check is made on the JSON text itself: a NaN or an infinity (which storage writes as
        `null`), a string that cannot be encoded, or a model whose dump does not load back to
        the same JSON raises `InvalidRequestError`. It costs a few microseconds a request.
        """
        payload = self.dump(value)
        what = type(value).__qualname__
        try:
            written = to_json(payload.data)
        except PydanticSerializationError as error:
            raise InvalidRequestError(
                f"{what} request cannot be written as JSON: {error}"
            ) from None
        try:
            read = from_json(written, allow_inf_nan=False)
        except ValueError:
            where = _non_finite(payload.data) or "NaN or infinity"
            raise InvalidRequestError(
                f"{what} request holds {where}, which stored JSON cannot hold "
                "(it would read back as null); use a finite number or None"
            ) from None
        try:
            again = self.dump(
                self.load(trusted(Payload, type=payload.type, data=read), TypeKind.REQUEST)
            )
        except (ChoreographyError, ValidationError) as error:
            message = error.message if isinstance(error, ChoreographyError) else str(error)
            raise InvalidRequestError(
                f"{what} request does not survive a JSON round trip: {message}"
            ) from error
        if to_json(again.data) != written:
            raise InvalidRequestError(
                f"{what} request reads back different from what was given; give its fields "
                "JSON-safe types"
            )
        return payload

    def dump_requests(self, values: Sequence[BaseModel]) -> list[Payload]:
        """`dump_request` of many values, checked per class in a few batched calls.

        The requests of one class are written as one JSON array, read back, validated as a
        list and written again; the batch passes when the two texts are identical, which is
        the per-request check over the whole array. A batch that does not pass is checked
        request by request with `dump_request`, so the error names the request at fault."""
        groups: dict[type, list[int]] = {}
        for index, value in enumerate(values):
            groups.setdefault(type(value), []).append(index)
        payloads: list[Payload] = [None] * len(values)  # type: ignore[list-item]
        for cls, indexes in groups.items():
            name = self._by_class.get(cls)
            if name is None:
                name = self.name_of(cls)  # raises, naming the class
            adapter = list_adapter(cls)
            group = [values[i] for i in indexes]
            if cls.model_dump is not BaseModel.model_dump:  # type: ignore[attr-defined]
                # Its own model_dump decides what is stored: checked the one-by-one way.
                data = [self.dump_request(value).data for value in group]
                for i, item in zip(indexes, data, strict=True):
                    payloads[i] = trusted(Payload, type=name, data=item)
                continue
            checked = round_trip(adapter, group)
            if checked is not None:
                data = checked[0]
            else:
                for value in group:
                    self.dump_request(value)  # raises for the request at fault
                data = [self.dump(value).data for value in group]
            fields = {"type", "data"}
            for i, item in zip(indexes, data, strict=True):
                payloads[i] = trusted_sharing(Payload, fields, {"type": name, "data": item})
        return payloads

    def load(self, payload: Payload, kind: TypeKind | str | None = None) -> Any:
        """Rebuild the model instance a payload holds, through the registry only."""
        cls = self.resolve(payload.type, kind)
        if not issubclass(cls, BaseModel):
            raise TypeRegistryError(f"{payload.type!r} names {cls!r}, which holds no data")
        try:
            if getattr(cls.model_validate, "__func__", None) is _MODEL_VALIDATE:
                # What model_validate does, without its keywords (a microsecond a call).
                return cls.__pydantic_validator__.validate_python(payload.data)
            return cls.model_validate(payload.data)  # its own decides
        except ValidationError as error:
            raise MalformedRecordError(
                f"stored {payload.type!r} value does not fit its class: {_first_error(error)}"
            ) from error

    def check(self, payload: Payload, kind: TypeKind | str | None = None) -> None:
        """Raise as `load` would, without keeping the value."""
        self.load(payload, kind)

    def unregister(self, name: str) -> None:
        """Forget a name; for tests that register throwaway types."""
        with self._lock:
            entry = self._by_name.pop(name, None)
            if entry is not None:
                self._by_class.pop(entry[1], None)


@functools.lru_cache(maxsize=256)
def list_adapter(cls: Any) -> TypeAdapter[Any]:
    """A list of `cls` (a class or any type a pydantic adapter takes), validated and written
    in one call (one adapter per type)."""
    return TypeAdapter(list[cls])


def round_trip(adapter: TypeAdapter[Any], values: list[Any]) -> tuple[list[Any], bytes] | None:
    """`values` in JSON mode and as JSON text, when that text reads back through `adapter`
    and writes again identically (no NaN, no infinity, nothing that reads back different);
    None when it does not. The check `dump_request` makes, over a whole list at once."""
    try:
        data = adapter.dump_python(values, mode="json")
        written = to_json(data)
        read = from_json(written, allow_inf_nan=False)
        passed = adapter.dump_json(adapter.validate_python(read)) == written
    except (PydanticSerializationError, ValueError, ValidationError):
        return None
    return (data, written) if passed else None


def _kind(kind: TypeKind | str) -> TypeKind:
    """Most callers pass a `TypeKind` already; calling the enum costs a microsecond anyway."""
    return kind if kind.__class__ is TypeKind else TypeKind(kind)


def _kinds_match(registered: TypeKind, wanted: TypeKind) -> bool:
    """Requests, states and results are all pydantic models: any of them serves as another."""
    return registered == wanted or (registered in _MODEL_KINDS and wanted in _MODEL_KINDS)


def _same_definition(a: type, b: type) -> bool:
    return a.__module__ == b.__module__ and a.__qualname__ == b.__qualname__


def _non_finite(data: Any, where: str = "") -> str:
    """Where `data` holds its first NaN or infinity, as a person reads it: 'NaN at ratio'."""
    if isinstance(data, float) and (data != data or data in (float("inf"), float("-inf"))):
        return f"{data} at {where or 'the top level'}"
    items = (
        data.items()
        if isinstance(data, dict)
        else enumerate(data)
        if isinstance(data, list)
        else ()
    )
    for key, value in items:
        found = _non_finite(value, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return ""


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "value"
    return f"{where}: {first.get('msg', 'invalid')}"


default_registry = TypeRegistry()
"""The registry `Job` and `JobStep` classes join when they are defined."""


def register_type(
    kind: TypeKind | str, name: str | None = None, *, registry: TypeRegistry | None = None
) -> Callable[[T], T]:
    """Decorator: register a class in the default (or given) registry."""
    return (registry or default_registry).registrar(kind, name)
