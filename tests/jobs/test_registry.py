"""The type registry: stable names for stored classes, resolved without ever importing."""

from __future__ import annotations

import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, field_validator

from choreography_ray.jobs import (
    InvalidRequestError,
    MalformedRecordError,
    Payload,
    TypeAlreadyRegisteredError,
    TypeKind,
    TypeRegistry,
    TypeRegistryError,
    UnknownTypeError,
    default_registry,
    register_type,
)
from choreography_ray.jobs.errors import JobTypesError
from choreography_ray.jobs.registry import trusted


class Order(BaseModel):
    number: int
    placed: datetime
    lines: list[str] = []


class Invoice(BaseModel):
    total: float


class Checkpoint(BaseModel):
    done: int = 0


class ImportJob:
    pass


class ImportStep:
    pass


class NotAModel:
    pass


@pytest.fixture
def registry() -> TypeRegistry:
    return TypeRegistry()


# -- registering and resolving ----------------------------------------------------------------


def test_a_registered_class_resolves_by_its_name(registry: TypeRegistry) -> None:
    registry.register(Order, kind=TypeKind.REQUEST, name="shop.order")
    assert registry.resolve("shop.order") is Order
    assert registry.resolve("shop.order", TypeKind.REQUEST) is Order
    assert registry.name_of(Order) == "shop.order"
    assert registry.kind_of("shop.order") is TypeKind.REQUEST


def test_the_default_name_is_the_module_and_qualified_name(registry: TypeRegistry) -> None:
    registry.register(Order, kind="request")
    assert registry.name_of(Order) == f"{__name__}.Order"


def test_the_default_name_of_a_nested_class_includes_its_outer_class(
    registry: TypeRegistry,
) -> None:
    class Outer:
        class Inner(BaseModel):
            value: int = 0

    registry.register(Outer.Inner, kind="state")
    assert registry.name_of(Outer.Inner) == f"{__name__}.{Outer.Inner.__qualname__}"
    assert registry.name_of(Outer.Inner).endswith("Outer.Inner")


def test_register_returns_the_class_so_it_can_be_chained(registry: TypeRegistry) -> None:
    assert registry.register(ImportJob, kind="job") is ImportJob


def test_kinds_are_given_as_enum_members_or_their_text(registry: TypeRegistry) -> None:
    registry.register(ImportJob, kind="job", name="j")
    registry.register(ImportStep, kind=TypeKind.STEP, name="s")
    assert registry.kind_of("j") is TypeKind.JOB
    assert registry.kind_of("s") is TypeKind.STEP


def test_knows_says_whether_a_name_is_registered_for_a_kind(registry: TypeRegistry) -> None:
    registry.register(ImportJob, kind="job", name="import")
    assert registry.knows("import")
    assert registry.knows("import", TypeKind.JOB)
    assert not registry.knows("import", TypeKind.STEP)
    assert not registry.knows("export")


def test_names_lists_registered_names_sorted_and_by_kind(registry: TypeRegistry) -> None:
    registry.register(Order, kind="request", name="b.order")
    registry.register(Checkpoint, kind="state", name="a.checkpoint")
    registry.register(ImportJob, kind="job", name="c.job")
    assert registry.names() == ["a.checkpoint", "b.order", "c.job"]
    assert registry.names(TypeKind.REQUEST) == ["b.order"]
    assert registry.names("job") == ["c.job"]


def test_registering_the_same_class_under_the_same_name_again_changes_nothing(
    registry: TypeRegistry,
) -> None:
    registry.register(Order, kind="request", name="shop.order")
    registry.register(Order, kind="request", name="shop.order")
    assert registry.names() == ["shop.order"]
    assert registry.resolve("shop.order") is Order


def test_a_redefined_class_of_the_same_module_and_name_replaces_the_old_one(
    registry: TypeRegistry,
) -> None:
    # A re-executed module (notebook cell, reload) defines a new class object of the same name.
    def define() -> type[BaseModel]:
        class Reloaded(BaseModel):
            value: int = 0

        return Reloaded

    first, second = define(), define()
    registry.register(first, kind="request", name="reloaded")
    registry.register(second, kind="request", name="reloaded")
    assert registry.resolve("reloaded") is second
    assert registry.name_of(second) == "reloaded"
    with pytest.raises(TypeRegistryError):
        registry.name_of(first)


def test_another_class_under_a_taken_name_is_refused(registry: TypeRegistry) -> None:
    registry.register(Order, kind="request", name="shop.thing")
    with pytest.raises(TypeAlreadyRegisteredError, match=r"shop\.thing"):
        registry.register(Invoice, kind="request", name="shop.thing")
    assert registry.resolve("shop.thing") is Order


def test_one_model_serves_as_request_state_and_result_under_one_name(
    registry: TypeRegistry,
) -> None:
    registry.register(Order, kind="request", name="shop.order")
    assert registry.register(Order, kind="result") is Order
    assert registry.register(Order, kind="state", name="shop.order") is Order
    assert registry.resolve("shop.order", "result") is Order
    assert registry.knows("shop.order", TypeKind.STATE)
    assert registry.kind_of("shop.order") is TypeKind.REQUEST


def test_a_job_class_is_not_a_step_class(registry: TypeRegistry) -> None:
    registry.register(ImportJob, kind="job", name="import")
    with pytest.raises(TypeAlreadyRegisteredError):
        registry.register(ImportJob, kind="step", name="import")
    assert not registry.knows("import", TypeKind.STEP)
    with pytest.raises(UnknownTypeError):
        registry.resolve("import", TypeKind.STEP)


def test_a_class_cannot_be_registered_under_two_names(registry: TypeRegistry) -> None:
    registry.register(Order, kind="request", name="shop.order")
    with pytest.raises(TypeAlreadyRegisteredError, match=r"shop\.order"):
        registry.register(Order, kind="request", name="shop.order.v2")
    assert not registry.knows("shop.order.v2")


@pytest.mark.parametrize("kind", [TypeKind.REQUEST, TypeKind.STATE, TypeKind.RESULT])
def test_a_class_that_is_not_a_pydantic_model_cannot_hold_data(
    registry: TypeRegistry, kind: TypeKind
) -> None:
    with pytest.raises(TypeRegistryError, match="pydantic"):
        registry.register(NotAModel, kind=kind)
    with pytest.raises(TypeRegistryError):
        registry.register(dict, kind=kind, name="a-dict")
    assert registry.names() == []


@pytest.mark.parametrize("kind", [TypeKind.JOB, TypeKind.STEP])
def test_job_and_step_kinds_accept_any_class(registry: TypeRegistry, kind: TypeKind) -> None:
    registry.register(NotAModel, kind=kind, name="plain")
    assert registry.resolve("plain", kind) is NotAModel


@pytest.mark.parametrize("kind", list(TypeKind))
def test_something_that_is_not_a_class_is_refused(registry: TypeRegistry, kind: TypeKind) -> None:
    with pytest.raises(TypeRegistryError, match="not a class"):
        registry.register(Order(number=1, placed=datetime.now(UTC)), kind=kind, name="x")  # type: ignore[arg-type]
    assert registry.names() == []


@pytest.mark.parametrize("name", ["", "   "])
def test_an_empty_name_is_refused(registry: TypeRegistry, name: str) -> None:
    with pytest.raises(TypeRegistryError, match="empty"):
        registry.register(ImportJob, kind="job", name=name)
    assert registry.names() == []


def test_an_unknown_name_is_an_unknown_type(registry: TypeRegistry) -> None:
    with pytest.raises(UnknownTypeError) as caught:
        registry.resolve("shop.missing")
    assert caught.value.name == "shop.missing"
    assert caught.value.code is JobTypesError.COULD_NOT_FIND_TYPE


def test_a_name_registered_for_another_kind_is_an_unknown_type_of_the_asked_kind(
    registry: TypeRegistry,
) -> None:
    registry.register(ImportJob, kind="job", name="shop.import")
    with pytest.raises(UnknownTypeError) as caught:
        registry.resolve("shop.import", TypeKind.RESULT)
    assert caught.value.kind == "result"


def test_the_kind_of_an_unknown_name_is_an_unknown_type(registry: TypeRegistry) -> None:
    with pytest.raises(UnknownTypeError):
        registry.kind_of("nothing")


def test_the_name_of_an_unregistered_class_is_refused(registry: TypeRegistry) -> None:
    with pytest.raises(TypeRegistryError, match="not registered"):
        registry.name_of(Order)


def test_an_unregistered_name_is_forgotten_with_its_class(registry: TypeRegistry) -> None:
    registry.register(Order, kind="request", name="shop.order")
    registry.unregister("shop.order")
    assert not registry.knows("shop.order")
    with pytest.raises(TypeRegistryError):
        registry.name_of(Order)
    registry.register(Order, kind="request", name="shop.order.v2")
    assert registry.name_of(Order) == "shop.order.v2"


def test_registries_are_independent_of_each_other_and_of_the_default() -> None:
    first, second = TypeRegistry(), TypeRegistry()
    first.register(Order, kind="request", name="shop.order")
    assert not second.knows("shop.order")
    assert not default_registry.knows("shop.order")


# -- resolving never imports -------------------------------------------------------------------

DANGEROUS_NAMES = [
    "os.system",
    "subprocess.Popen",
    "builtins.eval",
    "importlib.import_module",
    "pickle.loads",
    "antigravity",
    "this",
    "xml.dom.minidom.parseString",
    "ctypes.CDLL",
    "tests.jobs.not_a_module.Thing",
    "__import__('os').system",
]


@pytest.mark.parametrize("name", DANGEROUS_NAMES)
@pytest.mark.parametrize("kind", [None, *TypeKind])
def test_resolving_an_unknown_name_raises_and_imports_nothing(
    registry: TypeRegistry, name: str, kind: TypeKind | None
) -> None:
    registry.register(Order, kind="request", name="shop.order")
    before = set(sys.modules)
    with pytest.raises(UnknownTypeError):
        registry.resolve(name, kind)
    assert set(sys.modules) == before


@pytest.mark.parametrize("name", ["antigravity", "this", "xml.dom.minidom.parseString"])
def test_loading_a_payload_of_an_unknown_type_imports_nothing(
    registry: TypeRegistry, name: str
) -> None:
    before = set(sys.modules)
    with pytest.raises(UnknownTypeError):
        registry.load(Payload(type=name, data={}))
    assert set(sys.modules) == before


def test_resolving_the_name_of_an_importable_module_never_runs_it(
    registry: TypeRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"choreography_probe_{uuid.uuid4().hex}"
    marker = tmp_path / "imported"
    (tmp_path / f"{module}.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\nclass Thing: pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for kind in [None, *TypeKind]:
        with pytest.raises(UnknownTypeError):
            registry.resolve(f"{module}.Thing", kind)
        with pytest.raises(UnknownTypeError):
            registry.load(Payload(type=f"{module}.Thing", data={}), kind)
    assert module not in sys.modules
    assert not marker.exists()


def test_a_module_path_that_is_importable_is_still_unknown_when_not_registered(
    registry: TypeRegistry,
) -> None:
    # Order is importable under exactly this path, yet only registration makes it resolvable.
    with pytest.raises(UnknownTypeError):
        registry.resolve(f"{__name__}.Order")


# -- payloads -----------------------------------------------------------------------------------


def test_a_model_round_trips_through_a_payload(registry: TypeRegistry) -> None:
    registry.register(Order, kind="request", name="shop.order")
    order = Order(number=7, placed=datetime(2024, 5, 1, tzinfo=UTC), lines=["a", "b"])
    payload = registry.dump(order)
    assert payload.type == "shop.order"
    assert payload.data == {"number": 7, "placed": "2024-05-01T00:00:00Z", "lines": ["a", "b"]}
    assert registry.load(payload) == order
    assert registry.load(payload, TypeKind.REQUEST) == order


def test_a_payload_round_trips_through_json(registry: TypeRegistry) -> None:
    registry.register(Invoice, kind="result", name="shop.invoice")
    payload = registry.dump(Invoice(total=12.5))
    again = Payload.model_validate_json(payload.model_dump_json())
    assert again == payload
    assert registry.load(again) == Invoice(total=12.5)


class Measure(BaseModel):
    label: str = "m"
    value: float | None = None
    values: list[float] = []


class Coarse(BaseModel):
    """Reads back different from what it dumps: the dump doubles, the load does not halve."""

    amount: int

    def model_dump(self, **kwargs):
        data = super().model_dump(**kwargs)
        data["amount"] *= 2
        return data


@pytest.mark.parametrize(
    ("value", "where"),
    [
        (Measure(value=float("nan")), "nan at value"),
        (Measure(value=float("inf")), "inf at value"),
        (Measure(values=[1.0, float("-inf")]), "-inf at values.1"),
    ],
)
def test_a_request_with_nan_or_infinity_is_refused_naming_where(
    registry: TypeRegistry, value: Measure, where: str
) -> None:
    # Storage writes NaN and infinity as null: the request would read back as something else.
    registry.register(Measure, kind="request", name="lab.measure")
    with pytest.raises(InvalidRequestError, match="Measure request holds") as refused:
        registry.dump_request(value)
    message = str(refused.value)
    assert where in message and "null" in message
    assert "\n" not in message


def test_a_request_that_reads_back_different_is_refused(registry: TypeRegistry) -> None:
    registry.register(Coarse, kind="request", name="lab.coarse")
    with pytest.raises(InvalidRequestError, match="Coarse request reads back different"):
        registry.dump_request(Coarse(amount=3))


class Unloadable(Coarse):
    def model_dump(self, **kwargs):
        return {**super().model_dump(**kwargs), "amount": "many"}


def test_a_request_whose_json_does_not_load_is_refused(registry: TypeRegistry) -> None:
    registry.register(Unloadable, kind="request", name="lab.unloadable")
    with pytest.raises(InvalidRequestError, match="does not survive a JSON round trip"):
        registry.dump_request(Unloadable(amount=1))


def test_a_request_that_survives_is_dumped_as_dump_does(registry: TypeRegistry) -> None:
    registry.register(Measure, kind="request", name="lab.measure")
    measure = Measure(value=1.0, values=[0.1, 2.5, -0.0])
    assert registry.dump_request(measure) == registry.dump(measure)
    assert registry.dump_request(Measure()).data["value"] is None


def test_dumping_an_unregistered_model_is_refused(registry: TypeRegistry) -> None:
    with pytest.raises(TypeRegistryError, match="not registered"):
        registry.dump(Invoice(total=1))


def test_loading_data_that_does_not_fit_names_the_type(registry: TypeRegistry) -> None:
    registry.register(Order, kind="request", name="shop.order")
    with pytest.raises(MalformedRecordError, match=r"shop\.order") as caught:
        registry.load(Payload(type="shop.order", data={"number": "seven"}))
    assert "number" in str(caught.value)


@pytest.mark.parametrize("data", [None, 3, "text", [1, 2], {"total": [1]}])
def test_loading_data_of_the_wrong_shape_is_a_malformed_record(
    registry: TypeRegistry, data: object
) -> None:
    registry.register(Invoice, kind="result", name="shop.invoice")
    with pytest.raises(MalformedRecordError, match=r"shop\.invoice"):
        registry.load(Payload(type="shop.invoice", data=data))


def test_check_raises_as_load_would(registry: TypeRegistry) -> None:
    registry.register(Invoice, kind="result", name="shop.invoice")
    registry.check(Payload(type="shop.invoice", data={"total": 1.5}), TypeKind.RESULT)
    with pytest.raises(MalformedRecordError):
        registry.check(Payload(type="shop.invoice", data={}))
    registry.register(ImportStep, kind="step", name="shop.step")
    with pytest.raises(UnknownTypeError):
        registry.check(Payload(type="shop.step", data={"total": 1}), TypeKind.RESULT)


def test_loading_a_payload_that_names_a_job_class_is_refused(registry: TypeRegistry) -> None:
    registry.register(ImportJob, kind="job", name="import")
    with pytest.raises(TypeRegistryError, match="holds no data"):
        registry.load(Payload(type="import", data={}))


def test_payloads_are_immutable() -> None:
    payload = Payload(type="x", data={"a": 1})
    with pytest.raises(ValueError):
        payload.type = "y"  # type: ignore[misc]


# -- the decorator ----------------------------------------------------------------------------


def test_the_decorator_registers_the_class_and_returns_it(registry: TypeRegistry) -> None:
    @register_type(TypeKind.STATE, "import.checkpoint", registry=registry)
    class ImportCheckpoint(BaseModel):
        offset: int = 0

    assert ImportCheckpoint.__name__ == "ImportCheckpoint"
    assert registry.resolve("import.checkpoint", TypeKind.STATE) is ImportCheckpoint


def test_the_decorator_without_a_name_uses_the_qualified_name(registry: TypeRegistry) -> None:
    @register_type("job", registry=registry)
    class Nightly:
        pass

    assert registry.name_of(Nightly) == f"{__name__}.{Nightly.__qualname__}"


def test_the_decorator_validates_like_register(registry: TypeRegistry) -> None:
    with pytest.raises(TypeRegistryError):

        @register_type("request", registry=registry)
        class Plain:
            pass


def test_the_registrar_of_a_registry_is_its_decorator(registry: TypeRegistry) -> None:
    @registry.registrar("result", name="shop.receipt")
    class Receipt(BaseModel):
        paid: bool

    assert registry.resolve("shop.receipt") is Receipt


def test_the_decorator_uses_the_default_registry_when_none_is_given() -> None:
    name = f"{__name__}.default-registry-probe"

    class Probe:
        pass

    try:
        assert register_type("job", name)(Probe) is Probe
        assert default_registry.resolve(name) is Probe
    finally:
        default_registry.unregister(name)
    assert not default_registry.knows(name)


def test_requests_checked_in_batches_are_dumped_exactly_as_one_by_one(
    registry: TypeRegistry,
) -> None:
    registry.register(Measure, kind="request", name="lab.measure")
    registry.register(Invoice, kind="request", name="shop.invoice-request")
    values = [Measure(value=n / 3, values=[n, -0.0]) for n in range(50)] + [
        Invoice(total=n) for n in range(5)
    ]
    values.insert(7, Invoice(total=0.1))
    assert registry.dump_requests(values) == [registry.dump_request(v) for v in values]


class Doubling(BaseModel):
    """Its validator changes what it reads: what it writes does not read back the same."""

    amount: int

    @field_validator("amount")
    @classmethod
    def _double(cls, value: int) -> int:
        return value * 2


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (Measure(value=float("nan")), "nan at value"),
        (Doubling(amount=3), "reads back different"),
        (Coarse(amount=3), "reads back different"),
        (Unloadable(amount=1), "does not survive a JSON round trip"),
    ],
)
def test_a_bad_request_in_a_batch_is_refused_as_it_is_alone(
    registry: TypeRegistry, bad: BaseModel, message: str
) -> None:
    for cls, name in ((Measure, "lab.measure"), (Coarse, "lab.coarse")):
        registry.register(cls, kind="request", name=name)
    registry.register(Unloadable, kind="request", name="lab.unloadable")
    registry.register(Doubling, kind="request", name="lab.doubling")
    values = [Measure(value=n) for n in range(20)]
    values.insert(11, bad)
    with pytest.raises(InvalidRequestError, match=message):
        registry.dump_requests(values)


class _Pair(BaseModel):
    a: int
    b: int = 0


def test_trusted_instances_share_one_fields_set_only_when_every_field_is_given():
    whole, other = trusted(_Pair, a=1, b=2), trusted(_Pair, a=3, b=4)
    assert whole.model_fields_set == {"a", "b"}
    assert whole.__pydantic_fields_set__ is other.__pydantic_fields_set__  # one per class

    partial = trusted(_Pair, a=1)
    assert partial.model_fields_set == {"a"}
    partial.b = 5  # marks b set on this instance alone
    assert partial.model_fields_set == {"a", "b"}
    assert trusted(_Pair, a=2).model_fields_set == {"a"}
    assert partial.model_dump_json() == '{"a":1,"b":5}'


class Tagged(BaseModel):
    """Reads and writes itself through methods of its own, which the registry must call."""

    label: str

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Tagged:  # type: ignore[override]
        return super().model_validate({"label": obj["tag"]}, **kwargs)

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return {"tag": self.label}


def test_a_class_with_its_own_model_validate_and_model_dump_is_stored_through_them(
    registry: TypeRegistry,
) -> None:
    """The registry calls pydantic's validator and serializer directly (without the keywords
    of `model_validate` and `model_dump`, a microsecond a call), but never past a class's own."""
    registry.register(Tagged, kind="state", name="lab.tagged")
    payload = registry.dump(Tagged(label="x"))
    assert payload.data == {"tag": "x"}
    assert registry.load(payload) == Tagged(label="x")
    registry.register(Checkpoint, kind="state", name="lab.checkpoint")
    assert registry.dump(Checkpoint(done=2)).data == Checkpoint(done=2).model_dump(mode="json")
    assert registry.load(Payload(type="lab.checkpoint", data={"done": 2})) == Checkpoint(done=2)
