"""Directors registered by name narrow the hosts a job or its steps may go to; a director that
cannot qualify any host, or misbehaves, makes it a `NoEligibleJobWorker` with a message."""

from __future__ import annotations

import pytest

from choreography_ray.jobs import ConfigurationError, NoEligibleJobWorker
from choreography_ray.placement.capability import HostAdvert
from choreography_ray.placement.choice import Placement
from choreography_ray.placement.directors import load_director

from .directors_example import OnDemandOnly

HERE = "tests.placement.directors_example"


def advert(name: str, *types: str, **labels: str) -> HostAdvert:
    memory = float(labels.pop("memory", 0))
    return HostAdvert(
        name=name,
        node_id=f"node-{name}",
        job_types=list(types),
        labels=labels,
        resources={"memory": memory},
    )


WORKERS = {
    "spot": advert("spot", "billing.Run", "geo.Index", spot="true"),
    "steady": advert("steady", "billing.Run", "geo.Index", spot="false"),
}
CONTROLLERS = {
    "small": advert("small", "billing.Run", memory="1"),
    "big": advert("big", "billing.Run", memory="64"),
}


@pytest.mark.parametrize("name", [f"{HERE}:OnDemandOnly", f"{HERE}:make_on_demand_only"])
def test_a_director_loads_from_a_class_or_a_factory(name: str) -> None:
    assert isinstance(load_director(name, "step_director"), OnDemandOnly)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no_such_module:X", "step_director: cannot load 'no_such_module:X': ModuleNotFound"),
        (f"{HERE}:Missing", "AttributeError"),
        (f"{HERE}:not_a_director", "is not a director"),
    ],
)
def test_a_director_that_does_not_load_is_one_line_naming_the_setting(name, message) -> None:
    with pytest.raises(ConfigurationError, match=message) as raised:
        load_director(name, "step_director")
    assert "\n" not in str(raised.value)


def test_without_a_director_every_able_worker_takes_steps() -> None:
    assert Placement().eligible_workers("billing.Run", ["spot", "steady"], WORKERS) == [
        "spot",
        "steady",
    ]


def test_a_step_director_keeps_one_job_type_off_some_nodes() -> None:
    placement = Placement(step_director=f"{HERE}:OnDemandOnly")
    assert placement.eligible_workers("billing.Run", ["spot", "steady"], WORKERS) == ["steady"]
    assert placement.eligible_workers("geo.Index", ["spot", "steady"], WORKERS) == [
        "spot",
        "steady",
    ]
    with pytest.raises(NoEligibleJobWorker, match=r"no on-demand node \(label spot=false\)"):
        placement.eligible_workers("billing.Run", ["spot"], WORKERS)


def test_a_director_only_chooses_among_hosts_that_run_the_type() -> None:
    workers = {**WORKERS, "steady": advert("steady", "geo.Index", spot="false")}
    placement = Placement(step_director=f"{HERE}:OnDemandOnly")
    with pytest.raises(NoEligibleJobWorker, match="no on-demand node"):
        placement.eligible_workers("billing.Run", ["spot", "steady"], workers)


def test_a_failing_director_is_a_no_eligible_worker_with_its_message() -> None:
    placement = Placement(f"{HERE}:Broken", f"{HERE}:Broken")
    with pytest.raises(NoEligibleJobWorker, match=r"step director failed .* RuntimeError: boom"):
        placement.eligible_workers("billing.Run", ["spot"], WORKERS)
    with pytest.raises(NoEligibleJobWorker, match="chose 'nobody', which is not a controller"):
        placement.controller("billing.Run", ["small", "big"], CONTROLLERS, "small")


def test_a_director_that_does_not_load_fails_every_choice_with_the_reason() -> None:
    placement = Placement(step_director="no_such_module:X")
    with pytest.raises(NoEligibleJobWorker, match="step_director: cannot load 'no_such_module:X'"):
        placement.eligible_workers("billing.Run", ["spot"], WORKERS)


def test_a_job_goes_to_the_preferred_controller_unless_a_director_chooses() -> None:
    assert Placement().controller("billing.Run", ["small", "big"], CONTROLLERS, "small") == "small"
    assert Placement().controller("billing.Run", ["small", "big"], CONTROLLERS, "gone") == "small"
    directed = Placement(job_director=f"{HERE}:BiggestNode")
    assert directed.controller("billing.Run", ["small", "big"], CONTROLLERS, "small") == "big"


def test_a_job_whose_type_no_controller_runs_is_refused_with_the_reason() -> None:
    with pytest.raises(NoEligibleJobWorker, match=r"no controller host runs job type 'geo\.Index'"):
        Placement().controller("geo.Index", ["small", "big"], CONTROLLERS, "small")
