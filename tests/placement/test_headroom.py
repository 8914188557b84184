"""Default job placement: the controller host with the most headroom, the preferred one among
equals; a director's choice wins over it."""

from __future__ import annotations

from choreography_ray.placement.capability import HostAdvert
from choreography_ray.placement.choice import HostLoad, Placement
from choreography_ray.placement.directors import Candidate
from choreography_ray.placement.headroom import headroom, most_headroom

TOTAL = {"CPU": 4.0, "memory": 1000.0}


def node(host: str, cpu: float, memory: float, activations: int = 0) -> Candidate:
    return Candidate(host, f"n-{host}", {}, TOTAL, {"CPU": cpu, "memory": memory}, activations)


def test_an_idle_node_has_full_headroom_and_a_full_one_none() -> None:
    assert headroom(node("a", 4, 1000), 0) == 1.0
    assert headroom(node("a", 0, 0, activations=5), 5) == 0.0


def test_the_job_goes_to_the_controller_with_the_most_free_cpu_and_memory() -> None:
    busy, idle = node("busy", 0.5, 200), node("idle", 3.5, 900)
    assert most_headroom([busy, idle], preferred="busy") == "idle"


def test_fewer_live_activations_count_for_more_headroom() -> None:
    crowded, quiet = node("crowded", 4, 1000, 90), node("quiet", 4, 1000, 10)
    assert most_headroom([crowded, quiet], preferred="crowded") == "quiet"


def test_among_equals_the_preferred_controller_keeps_the_job() -> None:
    equal = [node("a", 2, 500, 3), node("b", 2, 500, 3), node("c", 2, 500, 3)]
    assert most_headroom(equal, preferred="b") == "b"
    assert most_headroom(equal, preferred="gone") == "a"


def test_placement_uses_headroom_unless_a_director_is_registered() -> None:
    adverts = {
        name: HostAdvert(name=name, node_id=f"n-{name}", job_types=["t"], resources=TOTAL)
        for name in ("local", "other")
    }
    load = {
        "local": HostLoad({"CPU": 0.0, "memory": 100.0}, 40),
        "other": HostLoad({"CPU": 4.0, "memory": 1000.0}, 0),
    }
    assert Placement().controller("t", ["local", "other"], adverts, "local", load) == "other"
    directed = Placement(job_director="tests.placement.directors_example:BiggestNode")
    assert directed.controller("t", ["local", "other"], adverts, "local", load) == "local"
