"""Which hosts can run a job type, from what each host advertises it imported."""

from __future__ import annotations

import pytest

from choreography_ray.jobs import NoEligibleJobWorker
from choreography_ray.placement.capability import (
    CAPABILITIES,
    PLAN_STORAGE,
    STEP_DECISIONS,
    STEP_POSITIONS,
    WORK_MOVES,
    HostAdvert,
    eligible,
    everywhere,
    failing_everywhere,
    hosts_of_type_have,
    import_failures,
    moves_work,
    reads_decisions,
    reads_positions,
)
from choreography_ray.placement.choice import Placement
from choreography_ray.runtime.adverts import WITHHELD_ENV, advertised_capabilities


def advert(name: str, *types: str, failed: dict[str, str] | None = None, caps=()) -> HostAdvert:
    return HostAdvert(
        name=name,
        node_id=f"node-{name}",
        job_types=list(types),
        failed_modules=failed or {},
        capabilities=list(caps),
    )


def eligible_workers(job_type: str, live: list[str], adverts: dict[str, HostAdvert]) -> list[str]:
    return Placement().eligible_workers(job_type, live, adverts)


ADVERTS = {
    "w1": advert("w1", "geo.Index", "billing.Run"),
    "w2": advert(
        "w2", "billing.Run", failed={"geo": "ModuleNotFoundError: No module named 'gdal'"}
    ),
}


def test_a_step_goes_only_to_workers_that_imported_its_job_type() -> None:
    assert eligible_workers("geo.Index", ["w1", "w2"], ADVERTS) == ["w1"]
    assert eligible_workers("billing.Run", ["w1", "w2"], ADVERTS) == ["w1", "w2"]


def test_a_host_that_has_not_advertised_yet_is_taken_as_able() -> None:
    assert eligible(["w1", "w2", "w3"], ADVERTS, "geo.Index") == ["w1", "w3"]


def test_no_eligible_worker_names_the_node_and_why_its_import_failed() -> None:
    with pytest.raises(NoEligibleJobWorker) as raised:
        eligible_workers("geo.Index", ["w2"], ADVERTS)
    assert str(raised.value) == (
        "no worker host can run job type 'geo.Index': node node-w2 (w2): module geo: "
        "ModuleNotFoundError: No module named 'gdal'"
    )
    with pytest.raises(NoEligibleJobWorker, match=r"no worker host runs job type 'x\.Y'"):
        eligible_workers("x.Y", ["w1"], ADVERTS)


def test_import_failures_are_one_line_per_host_and_module() -> None:
    assert import_failures(ADVERTS.values()) == [
        "node node-w2 (w2): module geo: ModuleNotFoundError: No module named 'gdal'"
    ]


def test_only_a_module_that_failed_on_every_host_is_a_mistake_to_refuse() -> None:
    one_node = [["geo: ModuleNotFoundError: gdal"], [], None]
    every_node = [["geo: ImportError: x", "ok: fine"], ["geo: ImportError: x"]]
    assert failing_everywhere(one_node) == {}
    assert failing_everywhere(every_node) == {"geo": "geo: ImportError: x"}
    assert failing_everywhere([]) == {}


def test_a_capability_counts_only_when_every_advertising_host_has_it() -> None:
    both = [
        advert("a", caps=["external-plan-storage"]),
        advert("b", caps=["external-plan-storage"]),
    ]
    assert everywhere(both, "external-plan-storage")
    assert not everywhere([*both, advert("old")], "external-plan-storage")
    assert not everywhere([], "external-plan-storage")


def test_an_advert_round_trips_as_json() -> None:
    original = ADVERTS["w2"]
    assert HostAdvert.model_validate_json(original.model_dump_json()) == original


# A capability is advertised only where something reads it: each has its gate here, and a
# host without it is handled as one of an older release by that gate.
GATES = {
    PLAN_STORAGE: lambda advert: hosts_of_type_have(
        [advert.name], {advert.name: advert}, "geo.Index", PLAN_STORAGE
    ),
    WORK_MOVES: moves_work,
    STEP_DECISIONS: reads_decisions,
    STEP_POSITIONS: reads_positions,
}


def test_every_capability_a_host_advertises_is_read_by_a_gate() -> None:
    """`execution-generations` and `placement` were advertised and read by nothing; every
    release that advertises carries them, so they are no longer advertised (decisions.md)."""
    assert set(CAPABILITIES) == set(GATES)
    assert advertised_capabilities() == list(CAPABILITIES)


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_a_host_without_a_capability_is_gated_as_an_older_release(capability: str) -> None:
    full = advert("h", "geo.Index", caps=CAPABILITIES)
    older = advert("h", "geo.Index", caps=[c for c in CAPABILITIES if c != capability])
    assert GATES[capability](full) is True
    assert GATES[capability](older) is False


def test_a_withheld_capability_is_not_advertised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WITHHELD_ENV, f" {WORK_MOVES} ,")
    assert advertised_capabilities() == [PLAN_STORAGE, STEP_DECISIONS, STEP_POSITIONS]
